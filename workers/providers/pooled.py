"""One endpoint's provider, backed by a free list of single-connection clients.

httpcore walks every connection of a client's pool on each request (``has_expired`` polls each
idle socket), so one client with a pool of 64 connections spent more CPU per call at 64
concurrent calls than the call itself (bench/README.md). ``PooledProvider`` gives each call a
client of its own instead: a call takes an idle (provider, client) pair of the endpoint, or makes
one, and puts it back when it is done. A client therefore keeps one keep-alive connection, the
walk is one connection long, and the endpoint never sees more connections than its peak of
concurrent calls. Idle pairs are reused last-in first-out, so the connections in use stay warm.
The clients are ``DirectClient``s (httpx's transport without ``AsyncClient``'s per-request
layers; see ``workers.providers.direct``). Single event loop only (the local executor).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

from workers.providers.base import ChatRequest, Provider, Reply
from workers.providers.direct import DirectClient
from workers.runtask import TimeoutPolicy

ProviderFactory = Callable[[DirectClient], Provider]


class PooledProvider:
    """A ``Provider`` for one endpoint; ``make(client)`` builds the real provider on a client.

    ``connections_per_client``: pool size of each client (1: one call at a time per client).
    ``tls``: shared TLS context (``registry.make_tls_context``), so clients do not each load the
    CA bundle. ``aclose()`` closes every client made.
    """

    def __init__(
        self, make: ProviderFactory, *, tls: ssl.SSLContext, connections_per_client: int = 1, wire_format: str = ""
    ) -> None:
        self._make = make
        self._tls = tls
        self._connections = connections_per_client
        self._idle: list[tuple[Provider, DirectClient]] = []
        self._clients: list[DirectClient] = []
        self.wire_format = wire_format

    @property
    def clients_made(self) -> int:
        """How many clients (so connections, at most) this endpoint has needed so far."""
        return len(self._clients)

    def _take(self) -> tuple[Provider, DirectClient]:
        if self._idle:
            return self._idle.pop()
        client = DirectClient(self._connections, tls=self._tls)
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
