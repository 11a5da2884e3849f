"""Pick a provider client for an endpoint, and build the HTTP clients providers share."""

from __future__ import annotations

import ssl

import httpx

from workers.errors import ConfigError
from workers.logs import register_log_secret
from workers.providers._http import HttpClient
from workers.providers.base import Provider
from workers.providers.ollama import OllamaProvider
from workers.providers.openai_compat import OpenAIProvider
from workers.runtask import WIRE_FORMATS, EndpointRef

__all__ = ["WIRE_FORMATS", "make_http_client", "make_provider"]


def make_provider(endpoint: EndpointRef, client: HttpClient, api_key: str | None) -> Provider:
    """The provider for ``endpoint.wire_format``; ``ConfigError`` names the allowed values.

    Where a key meets a provider (both executors come through here) it is also registered with
    the process's log redactor, so no log line can carry it."""
    register_log_secret(api_key)
    if endpoint.wire_format == "openai":
        return OpenAIProvider(client, endpoint.base_url, api_key)
    if endpoint.wire_format == "ollama":
        return OllamaProvider(client, endpoint.base_url, api_key)
    raise ConfigError(
        f"endpoint {endpoint.name!r} has wire_format {endpoint.wire_format!r}; "
        f"use one of {', '.join(WIRE_FORMATS)}"
    )


def make_tls_context() -> ssl.SSLContext:
    """The certificate-verifying TLS context a client gets by default (certifi's CA bundle).

    Building one loads the bundle (a few ms); code that makes many clients builds it once and
    passes it to each ``make_http_client``.
    """
    return httpx.create_ssl_context(trust_env=False)


def make_http_client(max_connections: int = 64, *, tls: ssl.SSLContext | None = None) -> httpx.AsyncClient:
    """An ``AsyncClient`` with a pool of up to ``max_connections`` keep-alive connections.

    Timeouts are set per request (``_http.httpx_timeout``), so the client's default is no cap.
    ``trust_env=False``: proxy variables must not reroute loopback or LAN endpoints, and
    ``.netrc`` credentials must not be attached. httpx keeps no response cache. ``tls``: a shared
    context from ``make_tls_context`` (default: a new one for this client).
    """
    return httpx.AsyncClient(
        timeout=httpx.Timeout(None),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        trust_env=False,
        follow_redirects=False,
        verify=tls if tls is not None else make_tls_context(),
    )
