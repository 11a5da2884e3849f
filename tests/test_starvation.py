"""Limits under CPU starvation: a permit whose grant-to-send delay exceeds the limiter's jitter
allowance is given back and re-acquired (real redis-server; the starvation is a blocked event
loop between the grant and the send, as a CPU-starved worker has)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis

from deploy.redis_server import RedisServer
from workers.celery.campaign_state import CampaignState
from workers.celery.gate import RedisGate
from workers.celery.redis_limiter import RedisLimiter
from workers.celery.runtime import DeferringLimiter, WorkerSettings
from workers.limits.base import Permit
from workers.runtask import ModelLimits

ALLOWANCE_S = 0.25


@pytest.fixture(scope="module")
def srv() -> Iterator[RedisServer]:
    with RedisServer() as s:
        yield s


class StarvedGate(RedisGate):
    """The real Redis gate, but the loop is blocked (no CPU) for ``stall_s`` on the first
    ``stalls`` checks made between a grant and the send."""

    def __init__(self, *a, stall_s: float, stalls: int, **kw) -> None:  # noqa: ANN002, ANN003
        super().__init__(*a, **kw)
        self.stall_s, self.stalls, self.checks = stall_s, stalls, 0

    async def admission_async(self, model: str, limiter_state_key: str) -> tuple[str | None, float]:
        self.checks += 1
        if self.checks <= self.stalls:
            time.sleep(self.stall_s)  # blocks the event loop, like a starved process
        return await super().admission_async(model, limiter_state_key)


class Holds:
    """The permit registry ``DeferringLimiter`` reports to (the worker runtime's heartbeat list)."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings, self.held = settings, set()

    def hold_permit(self, p: Permit) -> None:
        self.held.add(p.holder)

    def drop_permit(self, p: Permit) -> None:
        self.held.discard(p.holder)


@pytest.mark.parametrize("stalls,regrants", [(0, 0), (1, 1), (2, 2)])
def test_a_late_permit_is_given_back_and_reacquired(srv: RedisServer, stalls: int, regrants: int) -> None:
    settings = WorkerSettings(redis_url=srv.url, limit_jitter_allowance_s=ALLOWANCE_S, limit_period_s=1.0)
    prefix = f"st:{uuid.uuid4().hex}"
    sync = redis.Redis.from_url(srv.url)
    state = CampaignState(sync, f"starve-{uuid.uuid4().hex[:8]}")

    async def body() -> tuple[Permit, float, int]:
        client = aioredis.Redis.from_url(srv.url)
        inner = RedisLimiter(client, key_prefix=prefix, period_s=1.0, jitter_allowance_s=ALLOWANCE_S)
        calls = 0
        real_acquire = inner.acquire

        async def counting(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            nonlocal calls
            calls += 1
            return await real_acquire(*a, **kw)

        inner.acquire = counting  # type: ignore[method-assign]
        gate = StarvedGate(state, async_client=client, stall_s=2 * ALLOWANCE_S, stalls=stalls)
        lim = DeferringLimiter(inner, gate, Holds(settings))  # type: ignore[arg-type]
        try:
            permit = await lim.acquire("m", ModelLimits(requests_per_minute=100, max_concurrency=2), "run-1", 10)
            sent_after_s = time.monotonic() - permit.granted_mono_s  # the send would happen now
            await lim.release(permit)
            return permit, sent_after_s, calls
        finally:
            await inner.aclose()
            await client.aclose()

    permit, sent_after_s, calls = asyncio.run(body())
    sync.close()
    assert calls == 1 + regrants
    assert sent_after_s <= ALLOWANCE_S, sent_after_s  # never sent on a stale grant
    assert permit.granted_mono_s is not None


def test_a_cooldown_started_after_the_grant_is_waited_out(srv: RedisServer) -> None:
    """A 429 met by another run after our permit was granted: the permit is given back and the
    fresh one comes only after the cooldown (no request inside the cooldown)."""
    settings = WorkerSettings(redis_url=srv.url, limit_jitter_allowance_s=ALLOWANCE_S, limit_period_s=1.0)
    prefix = f"st:{uuid.uuid4().hex}"
    sync = redis.Redis.from_url(srv.url)
    state = CampaignState(sync, f"cool-{uuid.uuid4().hex[:8]}")
    cooldown_s = 0.6

    class CoolingGate(RedisGate):
        armed = True

        async def admission_async(self, model: str, limiter_state_key: str) -> tuple[str | None, float]:
            if CoolingGate.armed:  # the other run's 429 lands between our grant and our send
                CoolingGate.armed = False
                await inner.cooldown(model, cooldown_s)
            return await super().admission_async(model, limiter_state_key)

    async def body() -> float:
        nonlocal inner
        client = aioredis.Redis.from_url(srv.url)
        inner = RedisLimiter(client, key_prefix=prefix, period_s=1.0, jitter_allowance_s=ALLOWANCE_S)
        lim = DeferringLimiter(inner, CoolingGate(state, async_client=client), Holds(settings))  # type: ignore[arg-type]
        lim._acquisitions = 1  # a retry's permit: waited for, never deferred
        try:
            t0 = time.monotonic()
            permit = await lim.acquire("m", ModelLimits(max_concurrency=2), "run-2", 10)
            waited = time.monotonic() - t0
            await lim.release(permit)
            return waited
        finally:
            await inner.aclose()
            await client.aclose()

    inner = None
    waited = asyncio.run(body())
    sync.close()
    assert waited >= cooldown_s - 0.05, waited
