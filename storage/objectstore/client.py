"""A small S3 client: list, get, put (optionally only if absent), delete — over boto3.

Credentials, endpoint, region and profile come from the standard AWS chain (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_PROFILE``, the shared
config files); :class:`ObjectStoreConfig` only adds timeouts and retries. No credential ever
reaches an error message: every message passes :func:`_redact` first, which masks the access key
id and secret this client signs with, even when an endpoint echoes them back.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from storage.errors import StorageError
from storage.objectstore.location import S3Location


class ObjectStoreError(StorageError):
    """The bucket refused or failed a request (bad credentials, no such bucket, no permission)."""


class ObjectStoreUnavailable(ObjectStoreError):
    """The object store did not answer (connection refused, timeout): worth retrying later."""


@dataclass(frozen=True)
class ObjectInfo:
    """One object's listing entry: its size in bytes and entity tag (changes when it is rewritten)."""

    size_bytes: int
    etag: str


@dataclass(frozen=True)
class ObjectStoreConfig:
    """How the client talks to the bucket. ``endpoint_url`` None: ``AWS_ENDPOINT_URL`` or AWS
    itself; ``region`` None: ``AWS_REGION``/the profile's, else us-east-1 (what S3-compatible
    servers accept). Timeouts are per request, in seconds; ``max_attempts`` includes the first."""

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    max_attempts: int = 3


class ObjectClient(Protocol):
    """What the mirror and the uploader need of a bucket (keys are full object keys)."""

    def list(self, prefix: str) -> dict[str, ObjectInfo]: ...
    def download(self, key: str, path: Path) -> ObjectInfo: ...
    def upload(self, path: Path, key: str, *, if_absent: bool = False) -> str | None: ...
    def delete(self, keys: Iterable[str]) -> None: ...


_UNAVAILABLE_NAMES = ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                      "ConnectionClosedError", "ProxyConnectionError")
_HINTS = {
    "NoSuchBucket": "create the bucket or fix --data s3://BUCKET/…",
    "AccessDenied": "the credentials lack permission on this bucket",
    "InvalidAccessKeyId": "check AWS_ACCESS_KEY_ID / the profile",
    "SignatureDoesNotMatch": "check AWS_SECRET_ACCESS_KEY / the profile",
}


def _code(exc: Exception) -> str:
    """The S3 error code of a botocore ClientError ('' for other errors)."""
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def _redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


class S3Client:
    """:class:`ObjectClient` on one bucket (boto3; thread-safe, so downloads can run in parallel)."""

    def __init__(self, location: S3Location, config: ObjectStoreConfig = ObjectStoreConfig()) -> None:
        import boto3  # deferred: ~0.3 s to import, and only a bucket store needs it
        from botocore.config import Config

        self.location = location
        session = boto3.session.Session(profile_name=config.profile)
        region = config.region or session.region_name or "us-east-1"
        self._client = session.client(
            "s3", endpoint_url=config.endpoint_url, region_name=region,
            config=Config(connect_timeout=config.connect_timeout_s, read_timeout=config.read_timeout_s,
                          retries={"max_attempts": config.max_attempts, "mode": "standard"},
                          max_pool_connections=32))
        creds = session.get_credentials()
        frozen = creds.get_frozen_credentials() if creds is not None else None
        self._secrets = tuple(s for s in (getattr(frozen, "access_key", None), getattr(frozen, "secret_key", None),
                                          getattr(frozen, "token", None)) if s)
        self.endpoint = self._client.meta.endpoint_url

    def _fail(self, action: str, exc: Exception) -> ObjectStoreError:
        name = type(exc).__name__
        hint = _HINTS.get(_code(exc), "")
        where = f"{self.location.url} at {self.endpoint}"
        if name in _UNAVAILABLE_NAMES:
            msg = f"the object store at {self.endpoint} did not answer ({action}): {exc}; check AWS_ENDPOINT_URL and that it is up"
            return ObjectStoreUnavailable(_redact(msg, self._secrets))
        if name == "NoCredentialsError":
            return ObjectStoreError(f"no S3 credentials for {where}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)")
        msg = f"{action} on {where} failed: {exc}" + (f"; {hint}" if hint else "")
        return ObjectStoreError(_redact(msg, self._secrets))

    def _call(self, action: str, fn: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(Bucket=self.location.bucket, **kwargs)
        except (BotoCoreError, ClientError) as exc:
            raise self._fail(action, exc) from None

    def list(self, prefix: str) -> dict[str, ObjectInfo]:
        """Every object whose key starts with ``prefix`` (paginated; one request per 1,000 keys)."""
        out: dict[str, ObjectInfo] = {}
        token: str | None = None
        while True:
            extra = {"ContinuationToken": token} if token else {}
            page = self._call("list", self._client.list_objects_v2, Prefix=prefix, **extra)
            for obj in page.get("Contents", ()):
                out[obj["Key"]] = ObjectInfo(int(obj["Size"]), str(obj.get("ETag", "")).strip('"'))
            if not page.get("IsTruncated"):
                return out
            token = page["NextContinuationToken"]

    def download(self, key: str, path: Path) -> ObjectInfo:
        """Object ``key`` into ``path``, atomically (a temporary file, then ``os.replace``); its
        size and entity tag. FileNotFoundError when the object is gone (deleted between listing
        and reading)."""
        from botocore.exceptions import BotoCoreError, ClientError

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as fh:
                reply = self._client.get_object(Bucket=self.location.bucket, Key=key)
                body = reply["Body"]
                for chunk in iter(lambda: body.read(1 << 20), b""):
                    fh.write(chunk)
                size = fh.tell()
            os.replace(tmp, path)
            return ObjectInfo(size, str(reply.get("ETag", "")).strip('"'))
        except ClientError as exc:
            if _code(exc) in ("NoSuchKey", "404"):
                raise FileNotFoundError(key) from None
            raise self._fail("get", exc) from None
        except BotoCoreError as exc:
            raise self._fail("get", exc) from None
        finally:
            tmp.unlink(missing_ok=True)

    def upload(self, path: Path, key: str, *, if_absent: bool = False) -> str | None:
        """``path`` as object ``key``; with ``if_absent``, only if no such object exists (S3's
        ``If-None-Match: *``). The new object's entity tag, or None when ``if_absent`` found one."""
        from botocore.exceptions import BotoCoreError, ClientError

        extra = {"IfNoneMatch": "*"} if if_absent else {}
        try:
            with open(path, "rb") as fh:
                reply = self._client.put_object(Bucket=self.location.bucket, Key=key, Body=fh, **extra)
        except ClientError as exc:
            if if_absent and _code(exc) in ("PreconditionFailed", "412"):
                return None
            raise self._fail("put", exc) from None
        except BotoCoreError as exc:
            raise self._fail("put", exc) from None
        return str(reply.get("ETag", "")).strip('"')

    def delete(self, keys: Iterable[str]) -> None:
        """Delete ``keys`` (1,000 per request; an absent key is no error)."""
        batch = list(keys)
        for i in range(0, len(batch), 1000):
            objects = [{"Key": k} for k in batch[i:i + 1000]]
            self._call("delete", self._client.delete_objects, Delete={"Objects": objects, "Quiet": True})
