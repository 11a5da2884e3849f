"""The two limiter backends the limit-contract tests run against: the in-memory twin and Redis
(a private redis-server per test module), with ``Probe`` (counts limiter decisions) and
``open_limiter`` (a limiter of either backend, closed on exit). Test modules import the
``backend`` and ``redis_srv`` fixtures by name."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from deploy.redis_server import RedisServer
from workers.limits.memory import RateTiming
from workers.state.redis_limiter import RedisLimiter
from workers.limits import MemoryLimiter


@dataclass(frozen=True)
class Backend:
    name: str
    url: str | None  # None = memory


@pytest.fixture(scope="module")
def redis_srv() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "memory":
        return Backend("memory", None)
    return Backend("redis", request.getfixturevalue("redis_srv").url)


class Probe:
    """Counts limiter decisions: clock reads for memory, EVALSHA calls on the server for Redis."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.clock_reads = 0

    def clock(self) -> float:
        self.clock_reads += 1
        return time.monotonic()

    def decisions(self) -> int:
        if self.backend.url is None:
            return self.clock_reads
        with redis.Redis.from_url(self.backend.url) as c:
            stats = c.info("commandstats")
        return int(stats.get("cmdstat_evalsha", {}).get("calls", 0)) + int(stats.get("cmdstat_eval", {}).get("calls", 0))


@asynccontextmanager
async def open_limiter(backend: Backend, probe: Probe | None = None, **kw: Any) -> AsyncIterator[Any]:
    if backend.url is None:
        yield MemoryLimiter(RateTiming(**kw), clock=probe.clock if probe else time.monotonic)
        return
    client = aioredis.Redis.from_url(backend.url)
    lim = RedisLimiter(client, key_prefix=f"t:{uuid.uuid4().hex}", timing=RateTiming(**kw))
    try:
        yield lim
    finally:
        await lim.aclose()
        await client.aclose()


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro_fn())  # type: ignore[arg-type]
