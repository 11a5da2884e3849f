"""The one retry loop for Redis (and broker) calls that must outlive a Redis restart."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import RedisError

log = structlog.get_logger("irbench.redis")
T = TypeVar("T")

#: What a restarting Redis or broker raises (socket errors included).
TRANSIENT = (RedisError, OSError, ConnectionError, KombuOperationalError)


class _Backoff:
    """0.1 s doubling to ``max_backoff_s``, within ``budget_s`` (None: forever)."""

    def __init__(self, budget_s: float | None, max_backoff_s: float, clock: Callable[[], float]) -> None:
        self._deadline = None if budget_s is None else clock() + budget_s
        self._clock = clock
        self._max = max_backoff_s
        self._wait = 0.1

    def after(self, exc: BaseException, what: str) -> float:
        """How long to wait before the next try; re-raises ``exc`` once past the budget."""
        wait = self._wait
        if self._deadline is not None and self._clock() + wait > self._deadline:
            raise exc
        log.warning("redis_unavailable_retrying", what=what, error=str(exc), retry_in_s=round(wait, 2))
        self._wait = min(wait * 2, self._max)
        return wait


def with_retry(
    fn: Callable[[], T],
    what: str,
    *,
    budget_s: float | None,
    max_backoff_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Call ``fn`` until it succeeds, backing off 0.1 s doubling to ``max_backoff_s``.

    ``budget_s``: give up (re-raise the last error) once that many seconds would be exceeded;
    ``None`` retries forever. ``what`` names the call in the warning logged per retry.
    """
    backoff = _Backoff(budget_s, max_backoff_s, clock)
    while True:
        try:
            return fn()
        except TRANSIENT as exc:
            sleep(backoff.after(exc, what))


async def awith_retry(
    fn: Callable[[], Awaitable[T]],
    what: str,
    *,
    budget_s: float | None,
    max_backoff_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """:func:`with_retry` for a coroutine function, waiting on the event loop."""
    backoff = _Backoff(budget_s, max_backoff_s, clock)
    while True:
        try:
            return await fn()
        except TRANSIENT as exc:
            await asyncio.sleep(backoff.after(exc, what))
