"""kombu's Redis transport with one reused sync client per channel.

kombu's ``redis`` channel builds a new ``redis.Redis`` object (parsers, response-callback
tables, …) for every operation that has no client at hand: each late ack, each unacked-index
entry made on delivery and each publish. The connection pool is shared, so those objects buy
nothing; building them was about 7 % of a worker's CPU and 9 % of the orchestrator's
dispatch (py-spy, ``bench/README.md``). This channel keeps one client per connection pool (a
``redis.Redis`` is thread-safe; every operation still takes a pooled connection of its own) and
rebuilds it when kombu replaces the pool (after a connection loss).

Selected by ``broker_transport`` in ``workers.celery.app.make_celery_app`` for ``redis://`` broker
URLs only (:func:`transport_for`); any other scheme (``rediss://``, ``sentinel://``, …) keeps
kombu's own transport for it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from kombu.transport import redis as kombu_redis

#: What ``broker_transport`` names (kombu imports ``module:Class`` transport names).
TRANSPORT = "workers.celery.transport:Transport"


def transport_for(broker_url: str) -> str | None:
    """``TRANSPORT`` for a plain ``redis://`` URL, else None (kombu picks by scheme)."""
    return TRANSPORT if broker_url.split("://", 1)[0].lower() == "redis" else None


class Channel(kombu_redis.Channel):
    """A kombu Redis channel whose client-less operations share one client per pool."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._shared: tuple[Any, Any] | None = None  # (pool, client built on it)
        self._shared_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def _shared_client(self) -> Any:
        pool = self.pool
        with self._shared_lock:
            if self._shared is None or self._shared[0] is not pool:
                self._shared = (pool, self._create_client())
            return self._shared[1]

    @contextlib.contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        yield client if client else self._shared_client()

    def close(self) -> None:
        self._shared = None
        super().close()


class Transport(kombu_redis.Transport):
    Channel = Channel
