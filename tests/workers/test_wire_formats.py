"""One list of wire formats (``workers.runtask.WIRE_FORMATS``): the spec accepts exactly those,
and the registry has a provider client for each."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from pydantic import ValidationError

from orchestrator.campaign.spec import EndpointSpec
from storage.errors import ConfigError
from workers.providers.registry import make_provider
from workers.runtask import WIRE_FORMATS, EndpointRef


def test_the_registry_has_a_client_for_every_wire_format_and_names_them_otherwise() -> None:
    assert WIRE_FORMATS == ("openai", "ollama")

    async def build() -> None:
        async with httpx.AsyncClient() as client:
            for fmt in WIRE_FORMATS:
                provider = make_provider(EndpointRef(name="e", base_url="http://127.0.0.1:9", wire_format=fmt), client, None)
                assert provider.wire_format == fmt
            bogus = EndpointRef.model_construct(name="e", base_url="http://127.0.0.1:9", wire_format="grpc", api_key_env=None)
            with pytest.raises(ConfigError, match="openai, ollama"):
                make_provider(bogus, client, None)

    asyncio.run(build())


def test_the_spec_accepts_exactly_the_wire_formats() -> None:
    for fmt in WIRE_FORMATS:
        assert EndpointSpec(base_url="http://127.0.0.1:9", wire_format=fmt).wire_format == fmt
    with pytest.raises(ValidationError):
        EndpointSpec(base_url="http://127.0.0.1:9", wire_format="grpc")
