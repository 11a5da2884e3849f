"""One endpoint's provider, backed by a free list of single-connection clients.

httpcore walks every connection of a client's pool on each request (``has_expired`` polls each
idle socket), so one client with a pool of 64 connections spent more CPU per call at 64
concurrent calls than the call itself (bench/local_throughput.py's shared-pool loop shows it). ``PooledProvider`` gives each call a
client of its own instead: a call takes an idle (provider, client) pair of the endpoint, or makes
one, and puts it back when it is done. A client therefore keeps one keep-alive connection, the
walk is one connection long, and the endpoint never sees more connections than its peak of
concurrent calls. Idle pairs are reused last-in first-out, so the connections in use stay warm.

The clients come from an injected factory: by default ``AioClient`` (``workers.providers.aio``:
aiohttp underneath, about half the CPU per call of the alternative: 0.18-0.22 ms against
0.31-0.41 ms on the zero-latency simulator, uvloop, bench/http_clients.py), or ``DirectClient``
(httpx's transport without ``AsyncClient``'s per-request layers; ``workers.providers.direct``).
Both build the same request and raise the same httpx exceptions, so providers and ``_http.send``
cannot tell them apart. Single event loop only (the local executor's uvloop, or the Celery
worker's asyncio loop thread): every call of one ``PooledProvider`` runs on the loop that made
its clients.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Protocol

from workers.providers.aio import AioClient
from workers.providers.base import ChatRequest, Provider, Reply
from workers.providers.direct import DirectClient
from workers.runtask import TimeoutPolicy

PooledClient = AioClient | DirectClient
ProviderFactory = Callable[[PooledClient], Provider]


class ClientFactory(Protocol):
    """Makes one client: ``AioClient`` and ``DirectClient`` themselves are such factories."""

    def __call__(self, max_connections: int = 1, *, tls: ssl.SSLContext) -> PooledClient: ...


class PooledProvider:
    """A ``Provider`` for one endpoint; ``make(client)`` builds the real provider on a client.

    ``connections_per_client``: pool size of each client (1: one call at a time per client).
    ``tls``: shared TLS context (``registry.make_tls_context``), so clients do not each load the
    CA bundle. ``client_factory``: the client class (``AioClient`` unless ``DirectClient`` is
    passed). ``aclose()`` closes every client made.
    """

    def __init__(
        self, make: ProviderFactory, *, tls: ssl.SSLContext, connections_per_client: int = 1, wire_format: str = "",
        client_factory: ClientFactory = AioClient,
    ) -> None:
        self._make = make
        self._tls = tls
        self._connections = connections_per_client
        self._client_factory = client_factory
        self._idle: list[tuple[Provider, PooledClient]] = []
        self._clients: list[PooledClient] = []
        self.wire_format = wire_format

    @property
    def clients_made(self) -> int:
        """How many clients (so connections, at most) this endpoint has needed so far."""
        return len(self._clients)

    def _take(self) -> tuple[Provider, PooledClient]:
        if self._idle:
            return self._idle.pop()
        client = self._client_factory(self._connections, tls=self._tls)
        self._clients.append(client)
        return self._make(client), client

    async def complete(self, request: ChatRequest) -> Reply:
        pair = self._take()
        try:
            return await pair[0].complete(request)
        finally:
            self._idle.append(pair)

    async def list_models(self, timeouts: TimeoutPolicy) -> list[str]:
        pair = self._take()
        try:
            return await pair[0].list_models(timeouts)
        finally:
            self._idle.append(pair)

    async def aclose(self) -> None:
        self._idle.clear()
        clients, self._clients = self._clients, []
        for client in clients:
            await client.aclose()
