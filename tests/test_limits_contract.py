"""One contract for both limiters: the in-memory twin and Redis (a private redis-server).

Every test runs against both backends with short windows and TTLs, on real clocks.
"""

from __future__ import annotations

import asyncio
import random
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
from workers.celery.redis_limiter import RedisLimiter
from workers.limits import Lease, MemoryLimiter, ModelDisabled, WaitBudgetExceeded
from workers.runtask import ModelLimits

pytestmark = pytest.mark.timeout(60)


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
        yield MemoryLimiter(clock=probe.clock if probe else time.monotonic, **kw)
        return
    client = aioredis.Redis.from_url(backend.url)
    lim = RedisLimiter(client, key_prefix=f"t:{uuid.uuid4().hex}", **kw)
    try:
        yield lim
    finally:
        await lim.aclose()
        await client.aclose()


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro_fn())  # type: ignore[arg-type]


def test_concurrency_cap_never_exceeded(backend: Backend) -> None:
    limits = ModelLimits(max_concurrency=3)
    rng = random.Random(7)
    holds = [rng.uniform(0.0, 0.02) for _ in range(40)]

    async def body() -> None:
        async with open_limiter(backend) as lim:
            inflight = peak = 0
            sampled: list[int] = []

            async def worker(i: int) -> None:
                nonlocal inflight, peak
                p = await lim.acquire("m", limits, f"h{i}", 0)
                inflight += 1
                peak = max(peak, inflight)
                sampled.append(await lim.outstanding("m"))
                await asyncio.sleep(holds[i])
                inflight -= 1
                await lim.release(p)

            await asyncio.gather(*(worker(i) for i in range(len(holds))))
            assert peak == 3, "the cap must be reached (else the test proves nothing) and never exceeded"
            assert max(sampled) <= 3
            assert await lim.outstanding("m") == 0

    run(body)


def test_lease_of_crashed_holder_expires(backend: Backend) -> None:
    limits = ModelLimits(max_concurrency=1)

    async def body() -> None:
        async with open_limiter(backend, lease_ttl_s=0.4) as lim:
            await lim.acquire("m", limits, "crashed", 0)  # never released
            d = await lim.try_acquire("m", limits, "next", 0)
            assert d.permit is None and d.reason == "concurrency"
            assert 0.2 < d.wait_s <= 0.4
            t0 = time.monotonic()
            p = await lim.acquire("m", limits, "next", 0)
            took = time.monotonic() - t0
            assert 0.2 < took < 1.5
            assert 200 < p.waited_ms < 1500
            assert await lim.outstanding("m") == 1
            assert await lim.release(p) is True

    run(body)


def test_requests_in_any_sliding_window_at_most_limit(backend: Backend) -> None:
    period_s, allowance_s, rpm, n = 1.0, 0.1, 8, 14
    limits = ModelLimits(requests_per_minute=rpm, max_concurrency=None)

    async def body() -> None:
        async with open_limiter(backend, period_s=period_s, jitter_allowance_s=allowance_s) as lim:
            observed: list[float] = []
            granted: list[float] = []

            async def one(i: int) -> None:
                p = await lim.acquire("m", limits, f"h{i}", 0)
                observed.append(time.monotonic())
                assert isinstance(p, Lease)
                granted.append(p.granted_at_s)
                await lim.release(p)

            await asyncio.gather(*(one(i) for i in range(n)))
            # grants are spaced for period + allowance; observed times jitter by less than that
            for times, window in ((sorted(granted), period_s + allowance_s), (sorted(observed), period_s)):
                worst = max(sum(1 for u in times if t <= u < t + window) for t in times)
                assert worst <= rpm, f"{worst} acquisitions within {window}s (limit {rpm})"
            g = sorted(granted)
            # not overly conservative either: the long-run rate is the limit over period + allowance
            assert g[-1] - g[0] < (n - 1) * (period_s + allowance_s) / rpm + 0.3

    run(body)


def test_token_refund_allows_more_work(backend: Backend) -> None:
    limits = ModelLimits(tokens_per_minute=1000, max_concurrency=None)  # per 1 s window below

    async def body() -> None:
        async with open_limiter(backend, period_s=1.0) as lim:
            a = await lim.acquire("m", limits, "a", 1000)  # the whole window's budget
            d = await lim.try_acquire("m", limits, "b", 100)
            assert d.permit is None and d.reason == "tokens" and d.wait_s > 0.8
            await lim.release(a, actual_tokens=50)  # 950 tokens come back
            t0 = time.monotonic()
            b = await lim.acquire("m", limits, "b", 100)
            assert time.monotonic() - t0 < 0.5, "refund must shorten the wait from ~1 s to ~50 ms"
            await lim.release(b)  # no actual given: no refund
            d = await lim.try_acquire("m", limits, "c", 100)
            assert d.permit is None and d.reason == "tokens" and d.wait_s > 0.03
            # releasing twice never refunds twice
            assert await lim.release(b, actual_tokens=0) is False
            d2 = await lim.try_acquire("m", limits, "c", 100)
            assert d2.permit is None and d2.wait_s > 0.03

    run(body)


def test_cooldown_blocks_then_releases(backend: Backend) -> None:
    limits = ModelLimits(max_concurrency=4)

    async def body() -> None:
        async with open_limiter(backend) as lim:
            await lim.cooldown("m", 0.5)
            d = await lim.try_acquire("m", limits, "x", 0)
            assert d.permit is None and d.reason == "cooldown" and 0.3 < d.wait_s <= 0.5
            await lim.cooldown("m", 0.1)  # never shortens a longer cooldown
            t0 = time.monotonic()
            p = await lim.acquire("m", limits, "x", 0)
            assert 0.35 < time.monotonic() - t0 < 1.5
            assert p.waited_ms > 300
            assert (await lim.try_acquire("m", limits, "y", 0)).permit is not None

    run(body)


def test_waiting_model_does_not_block_another(backend: Backend) -> None:
    busy = ModelLimits(max_concurrency=1, requests_per_minute=1)  # 1 per 60 s: a long rate wait
    free = ModelLimits(max_concurrency=2)

    async def body() -> None:
        async with open_limiter(backend) as lim:
            await lim.acquire("a", busy, "a0", 0)
            blocked = [asyncio.create_task(lim.acquire("a", busy, f"a{i}", 0)) for i in range(1, 4)]
            await asyncio.sleep(0.05)
            t0 = time.monotonic()
            for i in range(6):
                p = await lim.acquire("b", free, f"b{i}", 0)
                await lim.release(p)
            assert time.monotonic() - t0 < 1.0
            assert not any(t.done() for t in blocked)
            for t in blocked:
                t.cancel()
            await asyncio.gather(*blocked, return_exceptions=True)

    run(body)


def test_disabled_model_raises_now_and_for_waiters(backend: Backend) -> None:
    capped = ModelLimits(max_concurrency=1)
    slow = ModelLimits(requests_per_minute=1, max_concurrency=None)

    async def body() -> None:
        async with open_limiter(backend) as lim:
            await lim.acquire("c", capped, "c0", 0)
            await lim.acquire("r", slow, "r0", 0)
            waiters = [asyncio.create_task(lim.acquire("c", capped, "c1", 0)), asyncio.create_task(lim.acquire("r", slow, "r1", 0))]
            await asyncio.sleep(0.1)
            assert not any(w.done() for w in waiters)
            t0 = time.monotonic()
            await lim.disable("c", "410 Gone")
            await lim.disable("r", "410 Gone")
            results = await asyncio.gather(*waiters, return_exceptions=True)
            assert time.monotonic() - t0 < 1.5, "waiters must notice at once, not at their next wake-up (>= 5 s)"
            assert all(isinstance(r, ModelDisabled) for r in results), results
            assert await lim.is_disabled("c")
            with pytest.raises(ModelDisabled, match="410 Gone"):
                await lim.acquire("c", capped, "c2", 0)
            await lim.enable("r")
            assert not await lim.is_disabled("r")

    run(body)


def test_reacquire_same_holder_adopts_lease(backend: Backend) -> None:
    limits = ModelLimits(max_concurrency=1, requests_per_minute=1)

    async def body() -> None:
        async with open_limiter(backend) as lim:
            p1 = await lim.acquire("m", limits, "run-1", 10)
            d = await lim.try_acquire("m", limits, "run-1", 10)  # redelivered task
            assert d.permit is not None and d.reason == "adopted"
            assert await lim.outstanding("m") == 1
            assert await lim.release(p1) is True
            assert await lim.outstanding("m") == 0

    run(body)


def test_renew_extends_live_lease_only(backend: Backend) -> None:
    limits = ModelLimits(max_concurrency=1)

    async def body() -> None:
        async with open_limiter(backend, lease_ttl_s=0.3) as lim:
            p = await lim.acquire("m", limits, "long", 0)
            await asyncio.sleep(0.2)
            assert await lim.renew(p) is True
            await asyncio.sleep(0.2)  # 0.4 s after grant: alive only thanks to renew
            assert await lim.outstanding("m") == 1
            await asyncio.sleep(0.25)
            assert await lim.outstanding("m") == 0
            assert await lim.renew(p) is False
            assert (await lim.try_acquire("m", limits, "other", 0)).permit is not None

    run(body)


def test_waiting_does_not_spin(backend: Backend) -> None:
    limits = ModelLimits(requests_per_minute=2, max_concurrency=1)  # 0.5 s apart at period 1 s
    probe = Probe(backend)

    async def body() -> None:
        async with open_limiter(backend, probe, period_s=1.0) as lim:
            p = await lim.acquire("m", limits, "a", 0)
            before = probe.decisions()
            t0 = time.monotonic()
            waiter = asyncio.create_task(lim.acquire("m", limits, "b", 0))
            await asyncio.sleep(0.2)
            await lim.release(p)  # frees the slot; the rate still says wait ~0.3 s more
            q = await waiter
            elapsed = time.monotonic() - t0
            assert 0.4 < elapsed < 1.0
            assert q.waited_ms > 400
            # initial check, the wake-up on release, the final grant (+ the release itself)
            assert probe.decisions() - before <= 6

    run(body)


def test_memory_limiter_runs_on_an_injected_clock() -> None:
    """The memory twin decides on the injected clock and waits with the injected sleep."""
    now = [1000.0]
    naps: list[float] = []

    async def fake_sleep(s: float) -> None:
        naps.append(s)
        now[0] += s
        await asyncio.sleep(0)

    async def body() -> None:
        lim = MemoryLimiter(clock=lambda: now[0], sleep=fake_sleep, jitter_allowance_s=0.0)  # period 60 s
        limits = ModelLimits(requests_per_minute=6, max_concurrency=None)  # one per 10 s
        waited = [(await lim.acquire("m", limits, f"h{i}", 0)).waited_ms for i in range(3)]
        assert waited == [0.0, 10_000.0, 10_000.0]
        assert naps == [10.0, 10.0], "one exact sleep per wait, no polling"
        # the jitter allowance stretches the window: (60 + 3) s / 6 per request
        lim2 = MemoryLimiter(clock=lambda: now[0], sleep=fake_sleep, jitter_allowance_s=3.0)
        waited = [(await lim2.acquire("m", limits, f"h{i}", 0)).waited_ms for i in range(3)]
        assert waited == pytest.approx([0.0, 10_500.0, 10_500.0])

    t0 = time.monotonic()
    run(body)
    assert time.monotonic() - t0 < 1.0


# ----- jitter allowance, reservations, grant log --------------------------------------------------


def _worst_window(times: list[float], window_s: float) -> int:
    """Most of ``times`` inside any half-open window ``[t, t + window_s)``."""
    ts = sorted(times)
    return max(sum(1 for u in ts if t <= u < t + window_s) for t in ts)


@pytest.mark.parametrize("allowance_s", [0.1, 0.0])
def test_window_holds_at_the_receiver_despite_grant_to_send_jitter(backend: Backend, allowance_s: float) -> None:
    """Requests "arrive" after a grant-to-send delay of up to 80 ms: with a 100 ms allowance no
    window of the period holds more than the limit at the receiver; without it one does (the
    first request is the delayed one, the rest are sent at once: the worst case)."""
    period_s, rpm, n, max_jitter_s = 0.5, 5, 11, 0.08
    limits = ModelLimits(requests_per_minute=rpm, max_concurrency=None)
    rng = random.Random(11)

    async def body() -> None:
        async with open_limiter(backend, period_s=period_s, jitter_allowance_s=allowance_s) as lim:
            arrivals: list[float] = []

            async def send(p: Lease, delay_s: float) -> None:
                await asyncio.sleep(delay_s)  # the event loop / GIL / network between grant and send
                arrivals.append(time.monotonic())
                await lim.release(p)

            first = asyncio.create_task(send(await lim.acquire("m", limits, "h0", 0), max_jitter_s))

            async def one(i: int) -> None:
                p = await lim.acquire("m", limits, f"h{i}", 0)
                await send(p, 0.0 if i <= rpm else rng.uniform(0.0, max_jitter_s))

            await asyncio.gather(first, *(one(i) for i in range(1, n)))
            worst = _worst_window(arrivals, period_s)
            if allowance_s > 0:
                assert worst <= rpm, f"{worst} arrivals within {period_s}s (limit {rpm}) despite the allowance"
            else:
                assert worst > rpm, "control: without an allowance the jitter must push one request too many"

    run(body)


def test_reservation_is_claimed_on_time_without_a_second_charge(backend: Backend) -> None:
    period_s, rpm = 1.0, 4  # 0.25 s per request, no allowance: exact arithmetic
    limits = ModelLimits(requests_per_minute=rpm, max_concurrency=None)
    iv = period_s / rpm

    async def body() -> None:
        async with open_limiter(backend, period_s=period_s, jitter_allowance_s=0.0) as lim:
            a = await lim.acquire("m", limits, "a", 0)
            d = await lim.try_acquire("m", limits, "run-b", 0)  # no reserve: only reports
            assert d.permit is None and d.reason == "requests" and d.reserved_at_s is None
            b = await lim.try_acquire("m", limits, "run-b", 0, reserve=True)
            assert b.permit is None and b.reason == "requests" and b.reserved_at_s is not None
            assert b.reserved_at_s == pytest.approx(a.granted_at_s + iv, abs=1e-4)
            c = await lim.try_acquire("m", limits, "run-c", 0, reserve=True)  # the NEXT slot: b owns its own
            assert c.reserved_at_s == pytest.approx(b.reserved_at_s + iv, abs=1e-4)
            early = await lim.try_acquire("m", limits, "run-b", 0, reserve=True)  # came back too soon
            assert early.permit is None and early.reason == "reserved"
            assert early.reserved_at_s == b.reserved_at_s, "coming back early must not re-reserve"
            assert early.wait_s == pytest.approx(b.reserved_at_s - early.now_s, abs=1e-4)
            await asyncio.sleep(early.wait_s + 0.005)
            got = await lim.try_acquire("m", limits, "run-b", 0, reserve=True)
            assert got.permit is not None and got.reason == "claimed"
            assert 0 <= got.now_s - b.reserved_at_s < 0.1, "granted on time"
            # no second charge: a newcomer queues behind c's slot, not behind a re-charged b
            e = await lim.try_acquire("m", limits, "run-e", 0, reserve=True)
            assert e.reserved_at_s == pytest.approx(c.reserved_at_s + iv, abs=1e-4)
            # a reservation is claimed once: the holder's next acquire is a fresh one
            assert await lim.release(got.permit) is True
            again = await lim.try_acquire("m", limits, "run-b", 0)
            assert again.permit is None and again.reason == "requests" and again.reserved_at_s is None
            # a bounded acquire gives up at once on a far slot, keeping its reservation
            with pytest.raises(WaitBudgetExceeded) as exc:
                await lim.acquire("m", limits, "run-f", 0, max_wait_s=0.05)
            assert exc.value.decision.reserved_at_s == pytest.approx(e.reserved_at_s + iv, abs=1e-4)
            await lim.release(a)

    run(body)


def test_abandoned_reservation_expires(backend: Backend) -> None:
    period_s, rpm = 0.4, 4  # 0.1 s per request
    limits = ModelLimits(requests_per_minute=rpm, max_concurrency=None)

    async def body() -> None:
        async with open_limiter(backend, period_s=period_s, jitter_allowance_s=0.0, reservation_grace_s=0.15) as lim:
            await lim.acquire("m", limits, "a", 0)
            d = await lim.try_acquire("m", limits, "gone", 0, reserve=True)
            assert d.reserved_at_s is not None
            await asyncio.sleep(d.wait_s + 0.12)  # the abandoned slot went by unused
            nxt = await lim.try_acquire("m", limits, "probe", 0)
            assert nxt.permit is not None, "the slot after an unclaimed one is not blocked by it"
            await asyncio.sleep(0.2)  # past slot + grace: abandoned
            back = await lim.try_acquire("m", limits, "gone", 0)
            assert back.reserved_at_s is None and back.reason == "granted", "an expired reservation is forgotten"
            if backend.url is not None:
                with redis.Redis.from_url(backend.url) as c:
                    assert not c.keys("*:resv:gone"), "the reservation key must expire in Redis"

    run(body)


def test_late_claims_never_overfill_a_window(backend: Backend) -> None:
    """A reservation claimed late must not let the next on-time claims put limit + 1 grants in
    one window: the grant log refuses the grant that would, and says until when."""
    period_s, rpm = 1.0, 4  # 0.25 s per request
    limits = ModelLimits(requests_per_minute=rpm, max_concurrency=None)

    async def body() -> None:
        async with open_limiter(backend, period_s=period_s, jitter_allowance_s=0.0) as lim:
            granted: list[float] = [(await lim.acquire("m", limits, "h0", 0)).granted_at_s]
            slots = {}
            for h in ("h1", "h2", "h3", "h4", "h5"):
                slots[h] = (await lim.try_acquire("m", limits, h, 0, reserve=True)).reserved_at_s
            t0 = slots["h1"] - 0.25

            async def claim(h: str) -> Any:
                d = await lim.try_acquire("m", limits, h, 0)
                if d.permit is not None:
                    granted.append(d.now_s)
                return d

            async def sleep_until(t: float, d: Any) -> None:  # on the limiter's clock
                await asyncio.sleep(max(t - d.now_s, 0.0))

            d = await claim("h2")  # early: not due yet
            assert d.reason == "reserved"
            await sleep_until(slots["h2"] + 0.01, d)
            assert (await claim("h2")).reason == "claimed"
            d = await claim("h3")
            await sleep_until(slots["h3"] + 0.01, d)
            assert (await claim("h3")).reason == "claimed"
            d = await claim("h4")
            await sleep_until(slots["h4"] + 0.01, d)
            assert (await claim("h4")).reason == "claimed"
            d = await claim("h1")  # h1 comes back 0.85 s late; h0 has left the window
            assert d.reason == "claimed", d
            d = await claim("h5")
            await sleep_until(slots["h5"] + 0.01, d)
            d = await claim("h5")  # on time, but h2, h3, h4, h1 are within the last period
            assert d.permit is None and d.reason == "window", d
            assert d.wait_s == pytest.approx(slots["h2"] + 0.01 + period_s - d.now_s, abs=0.03)
            await asyncio.sleep(d.wait_s + 0.005)
            assert (await claim("h5")).reason == "claimed"
            assert _worst_window(granted, period_s) <= rpm, [round(g - t0, 3) for g in sorted(granted)]

    run(body)


def test_cooldown_voids_reservations_and_restarts_the_schedule(backend: Backend) -> None:
    """After a 429 cooldown, overdue reservations must not all be claimed at once (a burst into a
    provider that just said "slow down"): they are void, and permits resume one interval apart."""
    period_s, rpm = 1.0, 5  # 0.2 s per request
    limits = ModelLimits(requests_per_minute=rpm, max_concurrency=None)

    async def body() -> None:
        async with open_limiter(backend, period_s=period_s, jitter_allowance_s=0.0) as lim:
            await lim.acquire("m", limits, "a", 0)
            for h in ("b", "c", "d"):
                assert (await lim.try_acquire("m", limits, h, 0, reserve=True)).reserved_at_s is not None
            await lim.cooldown("m", 0.8)  # longer than every reserved slot is away
            d = await lim.try_acquire("m", limits, "b", 0, reserve=True)
            assert d.reason == "cooldown" and d.reserved_at_s is None, "a cooldown voids reservations"
            await asyncio.sleep(d.wait_s + 0.01)
            got = [await lim.try_acquire("m", limits, h, 0, reserve=True) for h in ("b", "c", "d")]
            assert got[0].permit is not None and got[0].reason == "granted"
            assert [g.permit for g in got[1:]] == [None, None], "the others were not granted in a burst"
            assert got[1].reserved_at_s == pytest.approx(got[0].now_s + 0.2, abs=0.02)
            assert got[2].reserved_at_s == pytest.approx(got[0].now_s + 0.4, abs=0.02)

    run(body)
