"""One line when the broker stops answering, one when it answers again.

The Redis clients of the worker and the orchestrator retry a stalled call for as long as their
budgets allow, silently: a Redis that is stopped (not closed) holds every call until its socket
timeout. ``BrokerWatch`` pings Redis from a thread on its own client, with a socket timeout of
one poll, and says so once the broker has not answered for ``warn_after_s``, then once when it
answers again (with how long it was away). It makes one PING per ``poll_s``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import redis
from redis.exceptions import RedisError

from workers.state.connect import RedisTimeouts, sync_redis

__all__ = ["BROKER_WARN_ENV", "BrokerWatch", "broker_warn_after_s", "broker_where"]

BROKER_WARN_ENV = "IRBENCH_BROKER_WARN_S"


def broker_warn_after_s(environ: Mapping[str, str] | None = None, default_s: float = 3.0) -> float:
    """Seconds without an answer before the broker is reported unreachable (``IRBENCH_BROKER_WARN_S``)."""
    raw = (os.environ if environ is None else environ).get(BROKER_WARN_ENV, "")
    return float(raw) if raw.strip() else default_s


def broker_where(url: str) -> str:
    """``host:port`` of a Redis URL: never its password."""
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or 6379}"


@dataclass
class BrokerWatch:
    """Says through ``say`` when Redis at ``url`` stops answering (after ``warn_after_s``) and
    when it answers again; ``who`` names the process in the line. ``start()`` / ``stop()``."""

    url: str
    say: Callable[[str], None]
    who: str = "orchestrator"
    warn_after_s: float = 3.0
    poll_s: float = 0.5

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="irbench-broker-watch", daemon=True)
        timeout_s = max(self.poll_s, 0.2)
        self._client: redis.Redis = sync_redis(
            self.url, RedisTimeouts(socket_timeout_s=timeout_s, connect_timeout_s=timeout_s, retries=0))
        self.lines: list[str] = []

    def _tell(self, text: str) -> None:
        self.lines.append(text)
        self.say(text)

    def _answers(self) -> bool:
        try:
            return bool(self._client.ping())
        except (RedisError, OSError):
            return False

    def _loop(self) -> None:
        last_ok = time.monotonic()
        silent_since: float | None = None  # set once the warning is out
        where = broker_where(self.url)
        while not self._stop.is_set():
            t0 = time.monotonic()
            if self._answers():
                if silent_since is not None:
                    self._tell(f"{self.who}: the broker (Redis at {where}) answers again after "
                               f"{time.monotonic() - silent_since:.1f} s")
                    silent_since = None
                last_ok = time.monotonic()
            elif silent_since is None and time.monotonic() - last_ok >= self.warn_after_s:
                silent_since = last_ok
                self._tell(f"{self.who}: the broker (Redis at {where}) has not answered for "
                           f"{time.monotonic() - last_ok:.1f} s; work waits until it does")
            self._stop.wait(max(self.poll_s - (time.monotonic() - t0), 0.0))

    def start(self) -> BrokerWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(2.0)
        self._client.close()
