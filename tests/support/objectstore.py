"""The object-store fixtures: a real S3 server (``weed mini``) per test module, a fresh prefix
per test, and clients on it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from deploy.seaweed_server import SeaweedServer
from storage.objectstore.client import ObjectStoreConfig, S3Client
from storage.objectstore.location import S3Location


@pytest.fixture(scope="module")
def s3_server() -> Iterator[SeaweedServer]:
    with SeaweedServer() as srv:
        yield srv


@pytest.fixture
def s3_env(s3_server: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The AWS variables of the module's server, set in this process for the test."""
    if not s3_server.running:
        s3_server.start()
    env = s3_server.env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def s3_location(s3_server: SeaweedServer) -> S3Location:
    """A prefix of the module's bucket no other test uses."""
    return S3Location(s3_server.bucket, f"t-{uuid.uuid4().hex[:10]}")


def s3_client(location: S3Location, **config: float) -> S3Client:
    """A client built the way the CLI builds one (the AWS variables of the environment)."""
    return S3Client(location, ObjectStoreConfig(**config))  # type: ignore[arg-type]  (timeouts only)
