"""The limiters' jitter allowance, reservations and grant log, against both backends (the
in-memory twin and Redis) on real clocks: a window holds at the receiver, a reservation is
claimed on time and charged once, abandoned ones expire, a cooldown voids them."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest
import redis

from workers.errors import WaitBudgetExceeded
from workers.limits import Lease
from workers.runtask import ModelLimits
from tests.support import limit_backends
from tests.support.limit_backends import Backend, open_limiter, run


pytestmark = pytest.mark.timeout(60)
backend, redis_srv = limit_backends.backend, limit_backends.redis_srv  # the fixtures, by name


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
