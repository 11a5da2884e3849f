"""The one way to open a Redis client: pooled, with socket and connect timeouts, and a short
retry on dropped connections so a Redis restart costs a pause rather than a crash."""

from __future__ import annotations

from dataclasses import dataclass

import redis
import redis.asyncio as aioredis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry


@dataclass(frozen=True)
class RedisTimeouts:
    """How long a client waits: ``socket_timeout_s`` for a reply, ``connect_timeout_s`` for a
    connection, ``retries`` reconnect attempts (backoff capped at ``backoff_cap_s``), and a
    health check on a connection idle for ``health_check_interval_s``."""

    socket_timeout_s: float = 5.0
    connect_timeout_s: float = 2.0
    retries: int = 5
    backoff_cap_s: float = 1.0
    health_check_interval_s: int = 10

    def _kwargs(self) -> dict[str, object]:
        return {
            "socket_timeout": self.socket_timeout_s,
            "socket_connect_timeout": self.connect_timeout_s,
            "health_check_interval": self.health_check_interval_s,
        }


DEFAULT_TIMEOUTS = RedisTimeouts()


def sync_redis(url: str, timeouts: RedisTimeouts = DEFAULT_TIMEOUTS) -> redis.Redis:
    """A pooled, thread-safe sync client on ``url`` (``redis://host:port/db``)."""
    return redis.Redis.from_url(
        url,
        retry=Retry(ExponentialBackoff(cap=timeouts.backoff_cap_s, base=0.05), timeouts.retries),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        **timeouts._kwargs(),
    )


def async_redis(url: str, timeouts: RedisTimeouts = DEFAULT_TIMEOUTS) -> aioredis.Redis:
    """The asyncio client on ``url``, with the same timeouts and retries as ``sync_redis``."""
    from redis.asyncio.retry import Retry as AsyncRetry

    return aioredis.Redis.from_url(
        url,
        retry=AsyncRetry(ExponentialBackoff(cap=timeouts.backoff_cap_s, base=0.05), timeouts.retries),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        **timeouts._kwargs(),  # type: ignore[arg-type]  # as above
    )
