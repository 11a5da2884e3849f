"""The claim script's gate read (``CampaignState.claim_with_gate``) and ``RedisGate.prime``:
a run's first gate check and its success's streak reset cost no round trip of their own,
against a real redis-server."""

from __future__ import annotations

import pytest

from deploy.redis_server import RedisServer
from storage.records import Outcome
from workers.celery.campaign_state import BUSY, CLAIMED, DONE, CampaignState
from workers.celery.gate import RedisGate
from workers.celery.runtime import sync_redis


@pytest.fixture(scope="module")
def client():
    with RedisServer() as srv:
        c = sync_redis(srv.url)
        yield c
        c.close()


def commands(client) -> int:
    return int(client.info("stats")["total_commands_processed"])


def test_claim_with_gate_reads_cancel_gate_and_streak(client) -> None:
    st = CampaignState(client, "cg1", prefix="t")
    status, view = st.claim_with_gate("r1", "m", "w1", 30)
    assert status == CLAIMED and view is not None
    assert (view.cancel_reason, view.closed_reason, view.streak, view.reason) == (None, None, False, None)
    client.hset(st.key("gate"), "m", "retired")
    client.hset(st.key("streak"), "m", 2)
    status, view = st.claim_with_gate("r2", "m", "w1", 30)
    assert (status, view.closed_reason, view.streak, view.reason) == (CLAIMED, "retired", True, "retired")
    st.cancel("stop now")
    _, view = st.claim_with_gate("r3", "m", "w1", 30)
    assert view.reason == "stop now" and view.closed_reason == "retired"
    assert st.claim_with_gate("r1", "m", "w2", 30) == (BUSY, None)  # live elsewhere
    st.mark_done("r1", "m", "ok", False, 1)
    assert st.claim_with_gate("r1", "m", "w2", 30) == (DONE, None)
    assert st.claim("r4", "m", "w1", 30) == CLAIMED  # the plain claim still answers a string


def test_primed_gate_answers_without_redis_and_skips_the_reset_with_no_streak(client) -> None:
    st = CampaignState(client, "cg2", prefix="t")
    _, view = st.claim_with_gate("r1", "m", "w1", 30)
    gate = RedisGate(st, disable_after_consecutive=2)
    gate.prime("m", view)
    before = commands(client)
    assert gate.closed_reason("m") is None
    gate.observe("m", Outcome.OK)  # no streak at the claim: nothing to reset
    assert commands(client) - before <= 1  # INFO itself is the one counted


def test_a_streak_seen_at_the_claim_or_made_by_the_run_is_reset(client) -> None:
    st = CampaignState(client, "cg3", prefix="t")
    client.hset(st.key("streak"), "m", 1)
    _, view = st.claim_with_gate("r1", "m", "w1", 30)
    gate = RedisGate(st, disable_after_consecutive=3)
    gate.prime("m", view)
    gate.observe("m", Outcome.OK)
    assert client.hget(st.key("streak"), "m") is None  # reset
    _, view = st.claim_with_gate("r2", "m", "w1", 30)
    gate = RedisGate(st, disable_after_consecutive=3)
    gate.prime("m", view)
    gate.observe("m", Outcome.AUTH_ERROR)  # this run's own attempt starts a streak
    assert int(client.hget(st.key("streak"), "m")) == 1
    gate.observe("m", Outcome.OK)  # its retry succeeds: the streak it made is reset
    assert client.hget(st.key("streak"), "m") is None
    for _ in range(3):
        gate.observe("m", Outcome.AUTH_ERROR)
    assert client.hget(st.key("gate"), "m").decode().startswith("disabled after 3")


def test_claim_refreshes_the_queued_time_of_the_rest_of_its_message(client) -> None:
    st = CampaignState(client, "cg4", prefix="t")
    client.zadd(st.key("queued"), {"r1": 1.0, "r2": 1.0, "r3": 1.0})
    st.claim_with_gate("r1", "m", "w1", 30, pending=["r2", "r3", "gone"])
    queued = st.queued()
    assert set(queued) == {"r2", "r3"}  # r1 claimed; a run not queued is not added
    assert min(queued.values()) > st.now_s() - 5


def test_broker_view_lists_every_run_of_a_several_runs_message(client) -> None:
    import json

    from workers.celery.broker_view import RUN_IDS_HEADER, unacked_ids, waiting_ids

    one = {"body": "", "headers": {"id": "solo"}}
    many = {"body": "", "headers": {"id": "a+2", RUN_IDS_HEADER: ["a", "b", "c"]}}
    client.lpush("q-bv", json.dumps(one), json.dumps(many), "not json")
    assert waiting_ids(client, "q-bv") == {"solo", "a", "b", "c"}
    client.hset("unacked", mapping={"t1": json.dumps([many, "", "q-bv"]), "t2": json.dumps([one, "", "q-bv"])})
    assert unacked_ids(client) == {"solo", "a", "b", "c"}
