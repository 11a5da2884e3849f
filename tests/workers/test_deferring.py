"""``DeferringLimiter`` when Redis goes away (real redis-server, stopped and started again).

A run's first permit defers (nothing was called yet, the run comes back later). A retry's must
not: ``Deferred`` leaves ``execute_run`` without a record, and the attempts the provider already
saw would be lost. It waits for Redis instead, and past ``redis_retry_s`` it raises
``LimiterUnavailable``, which ``execute_run`` turns into a record that keeps every attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
import redis.asyncio as aioredis

from deploy.redis_server import RedisServer
from tests.support.permit_holds import PermitHolds
from workers.state.campaign_state import CampaignState
from workers.celery.deferring import Deferred, DeferringLimiter
from workers.state.gate import RedisGate
from workers.limits.memory import RateTiming
from workers.state.redis_limiter import RedisLimiter
from workers.celery.runtime import WorkerSettings
from workers.errors import LimiterUnavailable
from workers.runtask import ModelLimits

LIMITS = ModelLimits(max_concurrency=2)


@contextlib.contextmanager
def _limiters(srv: RedisServer) -> Iterator[tuple[asyncio.AbstractEventLoop, Callable[[float], DeferringLimiter]]]:
    """An event loop and ``make(redis_retry_s)``: a ``DeferringLimiter`` on ``srv`` (its own
    clients and key prefix); every client and limiter made is closed on exit."""
    loop = asyncio.new_event_loop()
    made: list[tuple[RedisLimiter, aioredis.Redis, redis.Redis]] = []

    def make(redis_retry_s: float) -> DeferringLimiter:
        client = aioredis.Redis.from_url(srv.url, socket_timeout=1.0, socket_connect_timeout=0.5)
        sync = redis.Redis.from_url(srv.url, socket_timeout=1.0, socket_connect_timeout=0.5)
        inner = RedisLimiter(client, key_prefix=f"dl:{uuid.uuid4().hex[:8]}", timing=RateTiming(lease_ttl_s=30, period_s=1.0),
                             max_block_s=0.2)
        made.append((inner, client, sync))
        gate = RedisGate(CampaignState(sync, f"dl-{uuid.uuid4().hex[:8]}"), async_client=client)
        settings = WorkerSettings(redis_url=srv.url, redis_retry_s=redis_retry_s, min_defer_s=0.2)
        return DeferringLimiter(inner, gate, PermitHolds(settings))

    try:
        yield loop, make
    finally:
        for inner, client, sync in made:
            loop.run_until_complete(inner.aclose())  # its pub/sub listener task
            loop.run_until_complete(client.aclose())
            sync.close()
        loop.close()


async def _first_then_retry(lim: DeferringLimiter) -> None:
    """An attempt's permit, given back as execute_run does before the retry's acquire."""
    permit = await lim.acquire("m", LIMITS, "run-1", 1)
    await lim.release(permit)


def test_a_retry_waits_for_redis_and_gets_its_permit_when_it_is_back() -> None:
    with RedisServer() as srv, _limiters(srv) as (loop, make):
        lim = make(30.0)
        loop.run_until_complete(_first_then_retry(lim))
        srv.stop()
        restart = threading.Timer(1.5, srv.start)  # Redis is back 1.5 s into the retry's wait
        restart.start()
        t0 = time.monotonic()
        permit = loop.run_until_complete(lim.acquire("m", LIMITS, "run-1", 1))
        waited_s = time.monotonic() - t0
        restart.join()
        assert permit.holder == "run-1" and waited_s >= 1.4  # waited, did not defer
        loop.run_until_complete(lim.release(permit))
        assert loop.run_until_complete(lim._inner.outstanding("m")) == 0


def test_a_retry_past_redis_retry_s_ends_with_limiter_unavailable_and_a_first_permit_defers() -> None:
    with RedisServer() as srv, _limiters(srv) as (loop, make):
        lim = make(1.0)
        loop.run_until_complete(_first_then_retry(lim))
        srv.stop()
        t0 = time.monotonic()
        with pytest.raises(LimiterUnavailable):  # an IrbenchError: execute_run keeps the attempts
            loop.run_until_complete(lim.acquire("m", LIMITS, "run-1", 1))
        assert time.monotonic() - t0 >= 1.0  # it waited redis_retry_s for Redis first
        with pytest.raises(Deferred):  # nothing called yet: defer
            loop.run_until_complete(make(1.0).acquire("m", LIMITS, "run-2", 1))
