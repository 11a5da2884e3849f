"""The claim script's gate read (``RunClaims.claim_with_gate``) and ``RedisGate.prime``:
a run's first gate check and its success's streak reset cost no round trip of their own,
against a real redis-server."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.support.permit_holds import PermitHolds
from storage.records import Outcome
from workers.state.campaign_state import CampaignState
from workers.state.run_claims import BUSY, CLAIMED, DONE
from workers.state.claim_permit import Claimed, ClaimPermits
from workers.state.gate import RedisGate
from workers.celery.runtime import WorkerSettings

if TYPE_CHECKING:
    from workers.runtask import RunTask


@pytest.fixture(scope="module")
def client(redis_client):
    return redis_client


def commands(client) -> int:
    return int(client.info("stats")["total_commands_processed"])


def test_claim_with_gate_reads_cancel_gate_and_streak(client) -> None:
    st = CampaignState(client, "cg1", prefix="t")
    status, view = st.claims.claim_with_gate("r1", "m", "w1", 30)
    assert status == CLAIMED and view is not None
    assert (view.cancel_reason, view.closed_reason, view.streak, view.reason) == (None, None, False, None)
    client.hset(st.key("gate"), "m", "retired")
    client.hset(st.key("streak"), "m", 2)
    status, view = st.claims.claim_with_gate("r2", "m", "w1", 30)
    assert (status, view.closed_reason, view.streak, view.reason) == (CLAIMED, "retired", True, "retired")
    st.flags.cancel("stop now")
    _, view = st.claims.claim_with_gate("r3", "m", "w1", 30)
    assert view.reason == "stop now" and view.closed_reason == "retired"
    assert st.claims.claim_with_gate("r1", "m", "w2", 30) == (BUSY, None)  # live elsewhere
    st.done.mark("r1", "m", "ok", False, 1)
    assert st.claims.claim_with_gate("r1", "m", "w2", 30) == (DONE, None)
    assert st.claims.claim("r4", "m", "w1", 30) == CLAIMED  # the plain claim still answers a string


def test_primed_gate_answers_without_redis_and_skips_the_reset_with_no_streak(client) -> None:
    st = CampaignState(client, "cg2", prefix="t")
    _, view = st.claims.claim_with_gate("r1", "m", "w1", 30)
    gate = RedisGate(st, disable_after_consecutive=2)
    gate.prime("m", view)
    before = commands(client)
    assert gate.closed_reason("m") is None
    gate.observe("m", Outcome.OK)  # no streak at the claim: nothing to reset
    assert commands(client) - before <= 1  # INFO itself is the one counted


def test_a_streak_seen_at_the_claim_or_made_by_the_run_is_reset(client) -> None:
    st = CampaignState(client, "cg3", prefix="t")
    client.hset(st.key("streak"), "m", 1)
    _, view = st.claims.claim_with_gate("r1", "m", "w1", 30)
    gate = RedisGate(st, disable_after_consecutive=3)
    gate.prime("m", view)
    gate.observe("m", Outcome.OK)
    assert client.hget(st.key("streak"), "m") is None  # reset
    _, view = st.claims.claim_with_gate("r2", "m", "w1", 30)
    gate = RedisGate(st, disable_after_consecutive=3)
    gate.prime("m", view)
    gate.observe("m", Outcome.AUTH_ERROR)  # this run's own attempt starts a streak
    assert int(client.hget(st.key("streak"), "m")) == 1
    gate.observe("m", Outcome.OK)  # its retry succeeds: the streak it made is reset
    assert client.hget(st.key("streak"), "m") is None
    for _ in range(3):
        gate.observe("m", Outcome.AUTH_ERROR)
    assert client.hget(st.key("gate"), "m").decode().startswith("disabled after 3")


def test_close_shuts_a_model_for_every_gate_of_the_campaign_and_keeps_the_first_reason(client) -> None:
    st = CampaignState(client, "cg3b", prefix="t")
    ours, theirs = RedisGate(st), RedisGate(st)  # two workers of one campaign
    _, view = st.claims.claim_with_gate("r1", "m", "w1", 30)
    ours.prime("m", view)
    assert ours.closed_reason("m") is None  # remembered: open
    ours.close("m", "not_listed (availability check 2026-01-01)")
    ours.close("m", "a later reason")
    assert ours.closed_reason("m") == "not_listed (availability check 2026-01-01)"  # not the stale "open"
    assert theirs.closed_reason("m") == "not_listed (availability check 2026-01-01)"
    assert theirs.closed_reason("other") is None


def test_runs_waiting_in_a_worker_keep_a_fresh_queued_time(client) -> None:
    """What the heartbeat does for the delivered runs waiting for a slot (unclaimed)."""
    st = CampaignState(client, "cg4", prefix="t")
    client.zadd(st.key("queued"), {"r1": 1.0, "r2": 1.0, "r3": 1.0})
    st.claims.claim_with_gate("r1", "m", "w1", 30)
    st.queued.refresh(["r2", "r3", "gone"])
    queued = st.queued.dispatched_at()
    assert set(queued) == {"r2", "r3"}  # r1 claimed; a run not queued is not added
    assert min(queued.values()) > st.now_s() - 5


def test_broker_view_lists_every_run_of_a_several_runs_message(client) -> None:
    import json

    from workers.state.broker_view import RUN_IDS_HEADER, unacked_ids, waiting_ids

    one = {"body": "", "headers": {"id": "solo"}}
    many = {"body": "", "headers": {"id": "a+2", RUN_IDS_HEADER: ["a", "b", "c"]}}
    client.lpush("q-bv", json.dumps(one), json.dumps(many), "not json")
    assert waiting_ids(client, "q-bv") == {"solo", "a", "b", "c"}
    client.hset("unacked", mapping={"t1": json.dumps([many, "", "q-bv"]), "t2": json.dumps([one, "", "q-bv"])})
    assert unacked_ids(client) == {"solo", "a", "b", "c"}


# ----- the claim with the first permit, the done marker with the last release (claim_permit) ------

def _task(run_id: str, model: str = "m", **limits: object) -> "RunTask":
    from workers.runtask import EndpointRef, ModelLimits, RunTask

    return RunTask(run_id=run_id, campaign="cp", panel="cp", model=model, run_index=0,
                   endpoint=EndpointRef(name="sim", base_url="http://127.0.0.1:1"), prompt_sha256="a" * 64,
                   prompt_name="p", user_message="hello", instruction_version="v", instruction_sha256="b" * 64,
                   limits=ModelLimits(**limits))


@pytest.fixture()
def claims(client):
    """(ClaimPermits, RedisLimiter, async loop) on fresh key prefixes."""
    import asyncio
    import uuid

    import redis.asyncio as aioredis

    from workers.limits.memory import RateTiming
    from workers.state.redis_limiter import RedisLimiter

    loop = asyncio.new_event_loop()
    kw = client.connection_pool.connection_kwargs
    aclient = aioredis.Redis(host=kw["host"], port=kw["port"])
    lim = RedisLimiter(aclient, key_prefix=f"lim{uuid.uuid4().hex[:8]}", timing=RateTiming(lease_ttl_s=30.0))
    yield ClaimPermits(client, lim), lim, loop
    loop.run_until_complete(lim.aclose())
    loop.run_until_complete(aclient.aclose())
    loop.close()


def test_a_claim_takes_the_first_permit_and_the_done_marker_releases_it(client, claims) -> None:
    cp, lim, loop = claims
    st = CampaignState(client, "cp1", prefix="t")
    got = cp.claim(st, _task("r1", max_concurrency=2), "w1", 30)
    assert got.status == CLAIMED and got.view is not None and got.view.reason is None
    assert got.permit is not None and (got.permit.model, got.permit.holder) == ("m", "r1")
    assert got.permit.granted_mono_s is not None
    assert loop.run_until_complete(lim.outstanding("m")) == 1  # the lease is live in the limiter
    second = cp.claim(st, _task("r2", max_concurrency=2), "w1", 30)
    assert second.permit is not None
    third = cp.claim(st, _task("r3", max_concurrency=2), "w1", 30)
    assert third.status == CLAIMED and third.permit is None  # the cap holds: no permit with this claim
    assert cp.done_and_release(st, "r1", "m", "ok", False, 1, [(got.permit, 12)]) is True
    assert loop.run_until_complete(lim.outstanding("m")) == 1
    assert st.done.is_done("r1") and st.done.counts()["m"] == {"ok": 1, "_executions": 1, "_attempts": 1}
    cp.release([(second.permit, None)])
    assert loop.run_until_complete(lim.outstanding("m")) == 0


def test_no_permit_is_taken_for_a_run_that_is_not_claimed_or_whose_gate_is_closed(client, claims) -> None:
    cp, lim, loop = claims
    st = CampaignState(client, "cp2", prefix="t")
    assert cp.claim(st, _task("r1"), "w1", 30).permit is not None
    busy = cp.claim(st, _task("r1"), "w2", 30)  # live elsewhere
    assert (busy.status, busy.permit) == (BUSY, None)
    st.done.mark("r9", "m", "ok", False, 1)
    assert cp.claim(st, _task("r9"), "w1", 30) == Claimed(DONE, None)
    client.hset(st.key("gate"), "m2", "retired")
    closed = cp.claim(st, _task("r2", model="m2"), "w1", 30)
    assert closed.status == CLAIMED and closed.view.reason == "retired" and closed.permit is None
    st.flags.cancel("stop")
    cancelled = cp.claim(st, _task("r3", model="m3"), "w1", 30)
    assert cancelled.view.reason == "stop" and cancelled.permit is None
    for m in ("m2", "m3"):
        assert loop.run_until_complete(lim.outstanding(m)) == 0
    assert loop.run_until_complete(lim.outstanding("m")) == 1  # only r1's


def test_a_rate_limited_model_gets_its_first_permit_the_usual_way(client, claims) -> None:
    cp, lim, loop = claims
    st = CampaignState(client, "cp3", prefix="t")
    for i, limits in enumerate(({"tokens_per_minute": 1000}, {"requests_per_minute": 60})):
        got = cp.claim(st, _task(f"r{i}", **limits), "w1", 30)
        assert got.status == CLAIMED and got.permit is None
    assert loop.run_until_complete(lim.outstanding("m")) == 0


def test_done_and_release_after_a_script_flush_runs_each_call_once(client, claims) -> None:
    cp, lim, loop = claims
    st = CampaignState(client, "cp4", prefix="t")
    got = cp.claim(st, _task("r1"), "w1", 30)
    client.script_flush()  # as after a Redis restart
    st.done.mark("r0", "m", "ok", False, 2)  # loads the done script again; the release one is still unknown
    assert cp.done_and_release(st, "r1", "m", "ok", False, 3, [(got.permit, None)]) is True
    assert st.done.counts()["m"] == {"ok": 2, "_executions": 2, "_attempts": 5}  # no call ran twice
    assert loop.run_until_complete(lim.outstanding("m")) == 0
    client.script_flush()
    again = cp.claim(st, _task("r2"), "w1", 30)  # the combined script loads itself too
    assert again.status == CLAIMED and again.permit is not None


def _deferring(client, lim, st, first, **kw):
    from workers.celery.deferring import DeferringLimiter

    gate = RedisGate(st)  # its re-check after a grant runs the sync check in a thread
    reg = PermitHolds(WorkerSettings(redis_url="redis://unused", limit_jitter_allowance_s=0.25))
    if first is not None:
        reg.hold_permit(first)
    return DeferringLimiter(lim, gate, reg, first=first, **kw), reg


def test_the_first_acquire_returns_the_claims_permit_without_a_round_trip(client, claims) -> None:
    from workers.runtask import ModelLimits

    cp, lim, loop = claims
    st = CampaignState(client, "cp5", prefix="t")
    got = cp.claim(st, _task("r1"), "w1", 30)
    d, reg = _deferring(client, lim, st, got.permit, release_later=True, release_grace_s=30.0)
    before = commands(client)
    permit = loop.run_until_complete(d.acquire("m", ModelLimits(), "r1", 77))
    assert commands(client) - before <= 1  # INFO only: no acquire, no gate re-check
    assert (permit.holder, permit.cost_tokens) == ("r1", 77) and reg.held == {"r1"}
    loop.run_until_complete(d.release(permit, 70))  # noted, handed to the task thread
    assert loop.run_until_complete(lim.outstanding("m")) == 1
    held = d.take_unreleased()
    assert [(p.holder, t) for p, t in held] == [("r1", 70)] and d.take_unreleased() == []
    cp.done_and_release(st, "r1", "m", "ok", False, 1, held)
    assert loop.run_until_complete(lim.outstanding("m")) == 0


def test_a_late_first_permit_is_given_back_and_a_fresh_one_taken(client, claims) -> None:
    import dataclasses
    import time

    from workers.runtask import ModelLimits

    cp, lim, loop = claims
    st = CampaignState(client, "cp6", prefix="t")
    got = cp.claim(st, _task("r1", max_concurrency=1), "w1", 30)
    stale = dataclasses.replace(got.permit, granted_mono_s=time.monotonic() - 1.0)  # a starved process
    d, reg = _deferring(client, lim, st, stale)
    before = commands(client)
    permit = loop.run_until_complete(d.acquire("m", ModelLimits(max_concurrency=1), "r1", 5))
    assert commands(client) - before >= 3  # release, acquire, gate re-check
    assert time.monotonic() - permit.granted_mono_s < 0.25 and reg.held == {"r1"}
    assert loop.run_until_complete(lim.outstanding("m")) == 1  # the cap of 1 held throughout
    loop.run_until_complete(d.release(permit))
    assert loop.run_until_complete(lim.outstanding("m")) == 0 and reg.held == set()


def test_a_first_permit_is_not_used_while_this_process_has_a_cooldown_noted(client, claims) -> None:
    """The claim's script read Redis's cooldown state; a 429 this process met since (its Redis
    write still in flight) is only in ``cooldowns``: the claim's permit goes back, the noted
    cooldown is sat out, and the permit used is granted after it ends."""
    import time

    from workers.runtask import ModelLimits

    cp, lim, loop = claims
    st = CampaignState(client, "cp7", prefix="t")
    got = cp.claim(st, _task("r1", max_concurrency=1), "w1", 30)
    d, reg = _deferring(client, lim, st, got.permit)
    reg.cooldowns.note("m", 0.3)
    noted_at = time.monotonic()
    permit = loop.run_until_complete(d.acquire("m", ModelLimits(max_concurrency=1), "r1", 5))
    assert permit.granted_mono_s >= noted_at + 0.3  # not the claim's permit: one after the cooldown
    assert loop.run_until_complete(lim.outstanding("m")) == 1 and reg.held == {"r1"}
    loop.run_until_complete(d.release(permit))
    assert loop.run_until_complete(lim.outstanding("m")) == 0


def test_a_noted_release_goes_back_before_a_retry_and_by_itself_after_the_grace(client, claims) -> None:
    import asyncio
    import dataclasses
    import time

    from workers.runtask import ModelLimits

    cp, lim, loop = claims
    st = CampaignState(client, "cp7", prefix="t")
    limits = ModelLimits(max_concurrency=1, requests_per_minute=600)  # one request per ~0.1 s
    first = loop.run_until_complete(lim.acquire("m", limits, "r1", 1))  # what a claim would have granted
    got = type("G", (), {"permit": first})
    reg_first = dataclasses.replace(first, granted_mono_s=time.monotonic())
    d, reg = _deferring(client, lim, st, reg_first, release_later=True, release_grace_s=0.3)

    async def attempts() -> tuple[float, float, int]:
        p1 = await d.acquire("m", limits, "r1", 1)
        await d.release(p1)
        held_noted = await lim.outstanding("m")
        p2 = await d.acquire("m", limits, "r1", 1)  # a retry: a fresh grant, rate-charged (no adoption)
        gap_s = p2.granted_at_s - got.permit.granted_at_s
        await d.release(p2)
        await asyncio.sleep(0.5)  # nobody takes it: released from the loop after the grace
        return held_noted, gap_s, await lim.outstanding("m")

    held_noted, gap_s, left = loop.run_until_complete(attempts())
    assert held_noted == 1
    assert gap_s >= 60.25 / 600 - 1e-3  # the second grant waited for the next rate slot: it was charged
    assert left == 0 and reg.held == set() and d.take_unreleased() == []
