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
from tests.support.permit_holds import PermitHolds
from workers.state.campaign_state import CampaignState
from workers.state.gate import RedisGate
from workers.limits.memory import RateTiming
from workers.state.redis_limiter import RedisLimiter
from workers.celery.runtime import Deferred, DeferringLimiter, WorkerSettings
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

    def __init__(self, *a, stall_s: float, stalls: int, **kw) -> None:
        super().__init__(*a, **kw)
        self.stall_s, self.stalls, self.checks = stall_s, stalls, 0

    async def admission_async(self, model: str, limiter_state_key: str) -> tuple[str | None, float]:
        self.checks += 1
        if self.checks <= self.stalls:
            time.sleep(self.stall_s)  # blocks the event loop, like a starved process
        return await super().admission_async(model, limiter_state_key)


@pytest.mark.parametrize("stalls,regrants", [(0, 0), (1, 1), (2, 2)])
def test_a_late_permit_is_given_back_and_reacquired(srv: RedisServer, stalls: int, regrants: int) -> None:
    settings = WorkerSettings(redis_url=srv.url, limit_jitter_allowance_s=ALLOWANCE_S, limit_period_s=1.0)
    prefix = f"st:{uuid.uuid4().hex}"
    sync = redis.Redis.from_url(srv.url)
    state = CampaignState(sync, f"starve-{uuid.uuid4().hex[:8]}")

    async def body() -> tuple[Permit, float, int]:
        client = aioredis.Redis.from_url(srv.url)
        inner = RedisLimiter(client, key_prefix=prefix, timing=RateTiming(period_s=1.0, jitter_allowance_s=ALLOWANCE_S))
        calls = 0
        real_acquire = inner.acquire

        async def counting(*a, **kw):
            nonlocal calls
            calls += 1
            return await real_acquire(*a, **kw)

        inner.acquire = counting  # type: ignore[method-assign]
        gate = StarvedGate(state, async_client=client, stall_s=2 * ALLOWANCE_S, stalls=stalls)
        lim = DeferringLimiter(inner, gate, PermitHolds(settings))  # type: ignore[arg-type]
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
        inner = RedisLimiter(client, key_prefix=prefix, timing=RateTiming(period_s=1.0, jitter_allowance_s=ALLOWANCE_S))
        lim = DeferringLimiter(inner, CoolingGate(state, async_client=client), PermitHolds(settings))  # type: ignore[arg-type]
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


class SlowCooldownLimiter(RedisLimiter):
    """The real Redis limiter whose cooldown write lands ``delay_s`` late: the round trip of a
    starved worker, or the script's first call (NOSCRIPT, SCRIPT LOAD, again). The 429-storm
    test measured 20-50 ms between a worker reading a 429 and Redis having its cooldown."""

    delay_s = 0.3

    async def cooldown(self, model: str, seconds: float) -> None:
        await asyncio.sleep(self.delay_s)
        await super().cooldown(model, seconds)


@pytest.mark.parametrize("first_permit", [True, False])
def test_no_permit_in_the_same_process_while_its_cooldown_is_on_its_way(srv: RedisServer, first_permit: bool) -> None:
    """Run A of a worker process met a 429 and is recording the cooldown; run B of the same
    process asks for a permit before Redis has it. B must not be sent into the cooldown: its
    first permit is deferred past the cooldown, a retry's permit waits it out. (Without the local
    note Redis grants and admits B at once: a call 28 ms after Redis has the cooldown, from the
    process that met the 429.)"""
    settings = WorkerSettings(redis_url=srv.url, limit_jitter_allowance_s=ALLOWANCE_S, limit_period_s=1.0,
                              max_wait_s=0.2)
    prefix = f"st:{uuid.uuid4().hex}"
    sync = redis.Redis.from_url(srv.url)
    state = CampaignState(sync, f"same-{uuid.uuid4().hex[:8]}")
    cooldown_s = 0.6
    limits = ModelLimits(max_concurrency=4)

    async def body() -> tuple[float | None, float | None, float]:
        client = aioredis.Redis.from_url(srv.url)
        inner = SlowCooldownLimiter(client, key_prefix=prefix, timing=RateTiming(period_s=1.0, jitter_allowance_s=ALLOWANCE_S))
        runtime = PermitHolds(settings)  # one process: both runs share its runtime
        a = DeferringLimiter(inner, RedisGate(state, async_client=client), runtime)  # type: ignore[arg-type]
        b = DeferringLimiter(inner, RedisGate(state, async_client=client), runtime)  # type: ignore[arg-type]
        if not first_permit:
            b._acquisitions = 1  # a retry's permit: waited for, never deferred
        try:
            t0 = time.monotonic()
            recording = asyncio.create_task(a.cooldown("m", cooldown_s))  # A's 429
            await asyncio.sleep(0)  # A has started: its write is on its way to Redis
            deferred_s = granted_s = None
            try:
                permit = await b.acquire("m", limits, "run-b", 10)
                granted_s = time.monotonic() - t0
                await b.release(permit)
            except Deferred as d:
                deferred_s = d.wait_s
            await recording
            return deferred_s, granted_s, time.monotonic() - t0
        finally:
            await inner.aclose()
            await client.aclose()

    deferred_s, granted_s, _ = asyncio.run(body())
    sync.close()
    if first_permit:
        assert granted_s is None and deferred_s is not None, (granted_s, deferred_s)
        assert deferred_s >= cooldown_s - 0.05, deferred_s  # comes back after the cooldown
    else:
        assert deferred_s is None and granted_s is not None
        assert granted_s >= cooldown_s - 0.05, granted_s
