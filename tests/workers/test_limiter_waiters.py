"""A freed lease wakes one local waiter, not all of them (``workers.state.limiter_waiters``):
the registry on its own, then real ``RedisLimiter``s on a real redis-server, counting the
acquire decisions Redis runs after each release and checking every waiter is still served and
the cap holds."""

from __future__ import annotations

import asyncio
import time
import uuid

import redis
import redis.asyncio as aioredis

from deploy.redis_server import RedisServer
from workers.state.limiter_waiters import Waiters
from workers.state.redis_limiter import RedisLimiter
from workers.runtask import ModelLimits


def test_a_freed_lease_wakes_the_oldest_lease_waiter_and_other_changes_wake_all() -> None:
    async def body() -> None:
        w = Waiters()
        a, b, c = w.register("m"), w.register("m"), w.register("m")
        other = w.register("n")
        b.for_lease = False  # waits for a rate slot: a release cannot help it
        assert w.lease_freed("m") and a.woken.done() and not b.woken.done() and not c.woken.done()
        assert w.lease_freed("m") and c.woken.done() and not b.woken.done()  # b skipped
        assert not w.lease_freed("m")  # nobody waits for a lease
        d = w.register("m")
        d.woken.cancel()  # timed out: skipped, not counted
        assert not w.lease_freed("m")
        w.drop("m", d)
        assert w.wake_all("m") == 1 and b.woken.done() and not other.woken.done()
        assert w.wake_all(None) == 1 and other.woken.done()
        assert w.count("m") == 0 and w.count("n") == 0

    asyncio.run(body())


def _acquire_calls(client: redis.Redis) -> int:
    """EVALSHA calls Redis ran so far (acquire decisions and releases: the test tells them apart)."""
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_each_release_costs_each_process_one_recheck_and_every_waiter_is_served() -> None:
    waiting = 20
    limits = ModelLimits(max_concurrency=1)
    prefix = f"w:{uuid.uuid4().hex}"
    with RedisServer() as srv:
        sync = redis.Redis.from_url(srv.url)

        async def body() -> tuple[list[int], list[float], int]:
            c1, c2 = aioredis.Redis.from_url(srv.url), aioredis.Redis.from_url(srv.url)
            # max_block_s 30: any re-check within the test comes from a message, not a timeout
            holder_side = RedisLimiter(c1, key_prefix=prefix, max_block_s=30.0)
            lim = RedisLimiter(c2, key_prefix=prefix, max_block_s=30.0)
            try:
                warm = await holder_side.acquire("warm", limits, "holder", 0)
                await holder_side.release(warm)  # the release script loaded: no NOSCRIPT retry counted below
                first = await holder_side.acquire("m", limits, "holder", 0)
                granted: list[tuple[int, float]] = []
                peak = [0]
                live = [0]

                async def run(i: int) -> None:
                    p = await lim.acquire("m", limits, f"w{i}", 0)
                    live[0] += 1
                    peak[0] = max(peak[0], live[0])
                    granted.append((i, time.monotonic()))
                    await asyncio.sleep(0.3 if len(granted) == 1 else 0.01)  # the first holds past the count
                    live[0] -= 1
                    await lim.release(p)

                tasks = [asyncio.create_task(run(i)) for i in range(waiting)]
                await asyncio.sleep(0.5)  # every waiter denied once and asleep (for up to 30 s)
                assert not any(t.done() for t in tasks)
                before = _acquire_calls(sync)
                await holder_side.release(first)  # one lease freed: one waiter of this process wakes
                await asyncio.sleep(0.2)
                after_one = _acquire_calls(sync) - before  # the release, then the woken waiter's decision
                t0 = time.monotonic()
                await asyncio.wait_for(asyncio.gather(*tasks), timeout=20)
                return [after_one], [t - t0 for _, t in granted], peak[0]
            finally:
                for x in (holder_side, lim):
                    await x.aclose()
                for c in (c1, c2):
                    await c.aclose()

        try:
            (after_one,), served_s, peak = asyncio.run(body())
        finally:
            sync.close()
    # the release and the woken waiter's granted decision; waking every waiter would run
    # 21 here (each of the other 19 denied again)
    assert after_one == 2, after_one
    assert len(served_s) == waiting and peak == 1  # every waiter served, the cap held
    assert max(served_s) < 10  # served by the wake-ups, not by 30 s timeouts
