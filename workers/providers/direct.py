"""A one-connection HTTP client that hands requests straight to httpx's transport.

``httpx.AsyncClient.send`` wraps every request in layers the providers never use: auth flows,
redirect handling (off), cookie extraction into a client-wide jar, event hooks, URL merging in
``build_request``. On the zero-latency simulator those layers cost about 0.4 ms of CPU per call,
15-20 % of the whole call (bench/http_clients.py measures this). ``DirectClient`` offers the two
methods ``_http.send`` uses (``build_request`` and ``send(..., stream=True)``) over one
``httpx.AsyncHTTPTransport``, the transport an ``AsyncClient`` would use itself, so connection
handling, TLS, content decoding and the httpcore -> httpx exception mapping are httpx's own.

Differences from an ``AsyncClient`` made by ``registry.make_http_client``: no cookie jar (a
cookie set by one answer is never sent with another run's call), no redirects (as there), no
proxy variables (``trust_env=False`` there too). The default headers are the same.

``PooledProvider`` (both executors) defaults to ``aio.AioClient``, which has this surface
over aiohttp and about half the CPU per call again (httpcore's anyio cancel scopes and h11's
pure-Python parsing are ~85 % of the local executor's event-loop CPU): 0.18-0.22 ms against
0.31-0.41 ms here on uvloop (bench/http_clients.py measures this). ``DirectClient`` stays the other choice
(``PooledProvider(..., client_factory=DirectClient)``) and the reference ``AioClient``'s
classification of failures is tested against (tests/workers/test_pooled_clients.py).
"""

from __future__ import annotations

import json as _json
import ssl
from typing import Any

import httpx

DEFAULT_HEADERS = {
    "Accept": "*/*",
    "Accept-Encoding": "gzip, deflate",
    "Connection": "keep-alive",
    "User-Agent": f"python-httpx/{httpx.__version__}",
}


class RequestBuilder:
    """The ``httpx.Request`` of a provider call, as ``httpx.Request(method, url, json=...,
    headers=...)`` builds it: ``Host``, ``DEFAULT_HEADERS`` under the call's headers,
    ``Content-Length`` and ``Content-Type: application/json``, the body as httpx encodes JSON
    (compact, UTF-8, no NaN), and ``timeout`` as the transport reads it (the ``timeout``
    extension). Shared by ``DirectClient`` and ``aio.AioClient``, so both put the same bytes on
    the wire.

    A provider sends the same URL and header set on every call: parsing and merging them once
    saves ~10 % of a call's CPU (a profile of the local executor), and handing
    httpx the finished header list skips its per-request header merge (another ~10 µs a call).
    The caches stay tiny (one entry per route and per header set a provider uses).
    """

    def __init__(self) -> None:
        self.headers = httpx.Headers(DEFAULT_HEADERS)
        self._urls: dict[str, httpx.URL] = {}
        self._merged: dict[tuple[tuple[str, str], ...], httpx.Headers] = {}
        # per (URL, header set): the header list before the body's, whether that set names
        # its own Content-Length / Content-Type (then httpx does not add them)
        self._heads: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[list[tuple[bytes, bytes]], bool, bool]] = {}

    def build(
        self, method: str, url: str, *, json: Any = None, headers: dict[str, str] | None = None,
        timeout: httpx.Timeout,
    ) -> httpx.Request:
        parsed = self._urls.get(url)
        if parsed is None:
            parsed = self._urls[url] = httpx.URL(url)
        key = tuple(headers.items()) if headers else ()
        merged = self._merged.get(key)
        if merged is None:
            merged = self.headers.copy()
            try:
                merged.update(dict(key))
            except UnicodeEncodeError:  # a non-ASCII key: httpx's text would quote the value
                raise httpx.LocalProtocolError("a header value is not ASCII") from None
            self._merged[key] = merged
        extensions = {"timeout": timeout.as_dict()}
        if json is None:
            return httpx.Request(method, parsed, headers=merged, extensions=extensions)
        head = self._heads.get((url, key))
        if head is None:
            host = [] if "Host" in merged else [(b"Host", parsed.netloc)]
            head = self._heads[(url, key)] = (host + merged.raw, "Content-Length" in merged, "Content-Type" in merged)
        fields, has_length, has_type = head
        body = _json.dumps(json, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        fields = fields + ([] if has_length else [(b"Content-Length", str(len(body)).encode("ascii"))]) + (
            [] if has_type else [(b"Content-Type", b"application/json")]
        )
        request = httpx.Request(method, parsed, headers=fields, stream=httpx.ByteStream(body), extensions=extensions)
        request.read()  # the body is in hand: ``request.content``, as httpx's own JSON requests have it
        return request


class DirectClient:
    """``build_request``/``send``/``aclose`` of an ``AsyncClient``, minus its per-request layers.

    ``max_connections``: the transport's pool size (the local executor uses 1: one call at a time).
    ``tls``: the verifying context (``registry.make_tls_context``), shared between clients.
    """

    def __init__(self, max_connections: int = 1, *, tls: ssl.SSLContext) -> None:
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._transport = httpx.AsyncHTTPTransport(verify=tls, limits=limits, trust_env=False)
        self._requests = RequestBuilder()
        self.headers = self._requests.headers

    def build_request(
        self, method: str, url: str, *, json: Any = None, headers: dict[str, str] | None = None,
        timeout: httpx.Timeout,
    ) -> httpx.Request:
        """The request with the default headers under ``headers`` and ``timeout`` as the
        transport reads it (the ``timeout`` extension)."""
        return self._requests.build(method, url, json=json, headers=headers, timeout=timeout)

    async def send(self, request: httpx.Request, *, stream: bool = True) -> httpx.Response:
        """Send ``request``; the response's body is still to be read (``stream`` must be True:
        ``_http.send`` always reads bodies itself, bounded)."""
        if not stream:
            raise ValueError("DirectClient.send only streams; read the body with aiter_bytes()")
        response = await self._transport.handle_async_request(request)
        response.request = request
        return response

    async def aclose(self) -> None:
        """Close the pooled connection(s)."""
        await self._transport.aclose()

    async def __aenter__(self) -> DirectClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
