"""The spend meters' contract, in memory and in Redis: concurrent reservations never take spent +
reserved past a cap, a refusal closes its scope for good with one reason, a settle turns the
reservation into the reported usage, and a model's cap leaves the other models alone."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
import redis
import redis.asyncio as aioredis

from deploy.redis_server import RedisServer
from workers.runtask import EndpointRef, RunTask
from workers.spend import (
    CAMPAIGN_SCOPE, SPEND_CAP_REASON, MemorySpendMeter, Reservation, SpendCap, SpendPlan, Spent, UsdPerToken,
)
from workers.state.campaign_state import CampaignState
from workers.state.spend_counters import RedisSpendMeter

PLAN = SpendPlan(
    "c", caps={CAMPAIGN_SCOPE: SpendCap(max_total_tokens=1000), "b": SpendCap(max_cost_usd=0.5)},
    prices={"a": UsdPerToken(0.001, 0.002), "b": UsdPerToken(0.001, 0.002)},
    spent={CAMPAIGN_SCOPE: Spent(100, 0.1), "b": Spent(0, 0.0)},
)


def _task(model: str) -> RunTask:
    return RunTask(run_id=f"r-{model}", campaign="c", panel="c", model=model,
                   endpoint=EndpointRef(name="s", base_url="http://127.0.0.1:9"), prompt_sha256="0" * 64,
                   prompt_name="p", run_index=0, user_message="x", instruction_version="v", instruction_sha256="0",
                   measured_on=dt.date(2026, 1, 1), spend_capped=True)


async def _contract(meter) -> None:
    # 100 already spent; 20 concurrent calls of 50 tokens: room for 18 under 1000
    got = await asyncio.gather(*(meter.reserve(_task("a"), 30, 20) for _ in range(20)))
    granted = [g for g in got if isinstance(g, Reservation)]
    refused = [g for g in got if isinstance(g, str)]
    assert len(granted) == 18 and len(set(refused)) == 1 and refused[0].startswith(SPEND_CAP_REASON)
    assert "max_total_tokens 1000 of campaign c" in refused[0]
    for r in granted[:4]:  # four calls end having used 10 tokens each: room for 160 more
        await meter.settle(r, 5, 5)
    again = await meter.reserve(_task("a"), 30, 20)
    assert again == refused[0]  # closed for good, whatever room the settles made


async def _model_cap(meter) -> None:
    # model b: 0.5 USD; a call reserves 100*0.001 + 100*0.002 = 0.3: one fits, the second does not
    first = await meter.reserve(_task("b"), 100, 100)
    assert isinstance(first, Reservation) and first.amount.cost_usd == pytest.approx(0.3)
    second = await meter.reserve(_task("b"), 100, 100)
    assert isinstance(second, str) and "max_cost_usd 0.5 of model b" in second
    assert isinstance(await meter.reserve(_task("a"), 1, 1), Reservation)  # a is not closed by b's cap


def test_the_memory_meter_keeps_the_contract() -> None:
    asyncio.run(_contract(MemorySpendMeter(PLAN)))
    meter = MemorySpendMeter(PLAN)
    asyncio.run(_model_cap(meter))


def test_the_redis_meter_keeps_the_contract_across_clients() -> None:
    with RedisServer() as srv:
        sync = redis.Redis.from_url(srv.url)
        state = CampaignState(sync, "c")
        state.spend.configure(PLAN)

        async def both() -> None:
            clients = [aioredis.Redis.from_url(srv.url) for _ in range(3)]  # three workers
            meters = [RedisSpendMeter(state.base, c) for c in clients]

            class Spread:  # each reservation through the next worker's client
                def __init__(self) -> None:
                    self.i = 0

                async def reserve(self, *a):
                    self.i += 1
                    return await meters[self.i % 3].reserve(*a)

                async def settle(self, *a):
                    self.i += 1
                    return await meters[self.i % 3].settle(*a)

            await _contract(Spread())
            for c in clients:
                await c.aclose()
        asyncio.run(both())
        assert state.spend.spent() == Spent(140, pytest.approx(0.1 + 4 * 0.015))
        assert state.spend.closed().keys() == {CAMPAIGN_SCOPE}
        state.spend.configure(PLAN)  # a new `irbench run`: the store's figures, nothing closed
        assert state.spend.closed() == {}

        async def model_cap() -> None:
            client = aioredis.Redis.from_url(srv.url)
            await _model_cap(RedisSpendMeter(state.base, client))
            await client.aclose()
        asyncio.run(model_cap())
        sync.close()
