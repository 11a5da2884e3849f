"""A run waiting for a concurrency permit while a sibling of its message calls (real redis-server).

The message's task thread is held until its last run is through, so while one run of the
message holds a permit, another's wait for a concurrency permit costs no thread: it keeps
waiting past ``max_wait_s`` instead of deferring (a deferred run comes back alone, later).
Once no sibling calls, the bounded wait and the deferral apply again.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis
import redis.asyncio as aioredis

from deploy.redis_server import RedisServer
from tests.support.permit_holds import PermitHolds
from workers.celery.deferring import Deferred, DeferringLimiter, MessageCalls
from workers.celery.runtime import WorkerSettings
from workers.limits.memory import RateTiming
from workers.runtask import ModelLimits
from workers.state.campaign_state import CampaignState
from workers.state.gate import RedisGate
from workers.state.redis_limiter import RedisLimiter

ONE = ModelLimits(max_concurrency=1)
MAX_WAIT_S = 0.3


async def _scenario(url: str, sibling_calls_s: float, sibling_model: str) -> tuple[str, float]:
    """A sibling takes ``sibling_model``'s permit and holds it ``sibling_calls_s``, then is
    through; meanwhile a call elsewhere holds model ``m``'s only permit for 3 x ``MAX_WAIT_S``.
    Returns how the waiting run of the same message ended (``granted`` / ``deferred``) and after
    how many seconds."""
    client = aioredis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=0.5)
    sync = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=0.5)
    inner = RedisLimiter(client, key_prefix=f"mw:{uuid.uuid4().hex[:8]}",
                         timing=RateTiming(lease_ttl_s=30, period_s=1.0), max_block_s=0.1)
    gate = RedisGate(CampaignState(sync, f"mw-{uuid.uuid4().hex[:8]}"), async_client=client)
    holds = PermitHolds(WorkerSettings(redis_url=url, max_wait_s=MAX_WAIT_S, min_defer_s=0.2))
    message = MessageCalls()
    try:
        elsewhere = await inner.acquire("m", ONE, "other-worker", 1)
        sibling = DeferringLimiter(inner, gate, holds, message=message)
        waiter = DeferringLimiter(inner, gate, holds, message=message)
        sibling_permit = await sibling.acquire(sibling_model, ONE, "sibling", 1)

        async def sibling_call() -> None:
            await asyncio.sleep(sibling_calls_s)
            await sibling.release(sibling_permit)
            sibling.through()

        async def elsewhere_call() -> None:
            await asyncio.sleep(3 * MAX_WAIT_S)
            await inner.release(elsewhere)

        background = [asyncio.ensure_future(sibling_call()), asyncio.ensure_future(elsewhere_call())]
        t0 = time.monotonic()
        try:
            await waiter.acquire("m", ONE, "waiter", 1)
            how = "granted"
        except Deferred:
            how = "deferred"
        waited_s = time.monotonic() - t0
        await asyncio.gather(*background)
        return how, waited_s
    finally:
        await inner.aclose()
        await client.aclose()
        sync.close()


@pytest.fixture(scope="module")
def redis_url() -> str:
    with RedisServer() as srv:
        yield srv.url


def test_a_run_keeps_waiting_while_a_sibling_of_its_message_calls(redis_url: str) -> None:
    how, waited_s = asyncio.run(_scenario(redis_url, sibling_calls_s=10 * MAX_WAIT_S, sibling_model="n"))
    assert how == "granted" and waited_s >= 2.5 * MAX_WAIT_S, (how, waited_s)


def test_a_run_defers_after_max_wait_s_once_no_sibling_calls(redis_url: str) -> None:
    # the sibling is through at once: the waiter's wait is bounded again
    how, waited_s = asyncio.run(_scenario(redis_url, sibling_calls_s=0.0, sibling_model="n"))
    assert how == "deferred" and waited_s < 2.5 * MAX_WAIT_S, (how, waited_s)
