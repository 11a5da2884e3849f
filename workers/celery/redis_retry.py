"""The one retry loop for Redis (and broker) calls that must outlive a Redis restart."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import structlog
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import RedisError

log = structlog.get_logger("irbench.redis")
T = TypeVar("T")

#: What a restarting Redis or broker raises (socket errors included).
TRANSIENT = (RedisError, OSError, ConnectionError, KombuOperationalError)


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
    deadline = None if budget_s is None else clock() + budget_s
    wait = 0.1
    while True:
        try:
            return fn()
        except TRANSIENT as exc:
            if deadline is not None and clock() + wait > deadline:
                raise
            log.warning("redis_unavailable_retrying", what=what, error=str(exc), retry_in_s=round(wait, 2))
            sleep(wait)
            wait = min(wait * 2, max_backoff_s)

