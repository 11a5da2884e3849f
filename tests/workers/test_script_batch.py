"""``ScriptBatch``: several scripts' calls in one EVALSHA, each with the reply and the effects it
would have alone, against a real redis-server; and a worker's claims, done markers and
releases going out as one command."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as aioredis

from workers.state.campaign_state import CampaignState
from workers.state.run_claims import CLAIMED, DONE
from workers.state.claim_permit import ClaimPermits
from workers.limits.memory import RateTiming
from workers.state.redis_limiter import RedisLimiter
from workers.state.script_batch import ScriptBatch
from workers.runtask import EndpointRef, ModelLimits, RunTask

INCR = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
ECHO = "return {KEYS[1], ARGV[1], #ARGV}"
FAIL = "redis.call('SET', KEYS[1], 'written before the error') return redis.call('INCR', ARGV[1], 'too', 'many')"
NOTHING = "redis.call('SET', KEYS[1], ARGV[1])"


@pytest.fixture(scope="module")
def client(redis_client):
    return redis_client


def evalshas(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_each_call_gets_its_own_reply_in_order(client) -> None:
    incr, echo, nothing = (client.register_script(s) for s in (INCR, ECHO, NOTHING))
    batch = ScriptBatch(client, [incr, echo, nothing])
    calls = [(incr, ["sb:a"], [2]), (echo, ["sb:k"], ["x", "y"]), (nothing, ["sb:n"], ["v"]), (incr, ["sb:a"], [3]),
             (echo, ["sb:k2"], [])]
    assert batch.covers(calls)
    assert batch.run(calls) == [2, [b"sb:k", b"x", 2], None, 5, [b"sb:k2"]]  # a nil reply keeps its place
    assert client.get("sb:a") == b"5" and client.get("sb:n") == b"v"
    # the same calls one by one give the same replies
    client.delete("sb:a")
    assert [s(keys=k, args=a) for s, k, a in calls] == [2, [b"sb:k", b"x", 2], None, 5, [b"sb:k2"]]


def test_a_failing_call_is_its_own_error_and_the_others_run(client) -> None:
    incr, fail = client.register_script(INCR), client.register_script(FAIL)
    batch = ScriptBatch(client, [incr, fail])
    out = batch.run([(incr, ["sb:f"], [1]), (fail, ["sb:g"], ["sb:h"]), (incr, ["sb:f"], [10])])
    assert out[0] == 1 and out[2] == 11
    assert isinstance(out[1], redis.ResponseError) and "wrong number of args" in str(out[1]).lower()
    assert client.get("sb:g") == b"written before the error"  # as alone: no rollback


def test_one_command_per_batch_and_a_flushed_script_is_loaded_again(client) -> None:
    incr = client.register_script(INCR)
    batch = ScriptBatch(client, [incr])
    calls = [(incr, ["sb:c"], [1])] * 50
    batch.run(calls)
    before = evalshas(client)
    assert batch.run(calls)[-1] == 100
    assert evalshas(client) - before == 1
    client.script_flush()
    assert batch.run(calls)[-1] == 150  # NOSCRIPT, loaded, run once: no call repeated
    other = client.register_script("return 1")
    assert not batch.covers([(incr, ["k"], [1]), (other, [], [])])


def _task(run_id: str) -> RunTask:
    return RunTask(run_id=run_id, campaign="sb", panel="sb", model="m", run_index=0,
                   endpoint=EndpointRef(name="sim", base_url="http://127.0.0.1:1"), prompt_sha256="a" * 64,
                   prompt_name="p", user_message="hello", instruction_version="v", instruction_sha256="b" * 64,
                   limits=ModelLimits(max_concurrency=4))


def test_a_workers_claims_and_done_markers_go_as_one_command(client) -> None:
    kw = client.connection_pool.connection_kwargs
    aclient = aioredis.Redis(host=kw["host"], port=kw["port"])
    claims = ClaimPermits(client, RedisLimiter(aclient, key_prefix="sbl", timing=RateTiming(lease_ttl_s=30.0)))
    st = CampaignState(client, "sb1", prefix="sbt")
    tasks = [_task(f"r{i}") for i in range(6)]
    claims.run_calls([claims.claim_call(st, _task("warm"), "w0", 30)[0]])  # the script is loaded
    calls = [claims.claim_call(st, t, "w1", 30)[0] for t in tasks]
    before = evalshas(client)
    replies = claims.run_calls(calls)
    assert evalshas(client) - before == 1
    got = [claims.claimed_from(r, t, 0.0) for r, t in zip(replies, tasks)]
    assert [g.status for g in got] == [CLAIMED] * 6
    assert sum(g.permit is not None for g in got) == 3  # the model's cap of 4, one held by "warm"
    assert client.hlen(st.key("running")) == 7
    done = [st.done.mark_call(t.run_id, t.model, "ok", False, 1) for t in tasks]
    releases = claims.release_calls([(g.permit, None) for g in got if g.permit is not None])
    assert claims.run_calls(done + releases)[:6] == [1] * 6
    assert claims.run_calls([claims.claim_call(st, tasks[0], "w2", 30)[0]]) == [DONE.encode()]
    assert client.hlen(st.key("running")) == 1  # "warm"
    assert st.done.counts()["m"] == {"ok": 6, "_executions": 6, "_attempts": 6}


def test_arguments_arrive_as_redis_py_would_send_them(client) -> None:
    """The batch carries its calls as one JSON string: every key and argument must reach the
    script as the same string redis-py sends for it alone (ints, floats by repr, bytes, text
    beyond ASCII), and a value redis-py refuses is refused."""
    echo_all = client.register_script("local out = {} for i, k in ipairs(KEYS) do out[#out + 1] = k end "
                                      "for i, a in ipairs(ARGV) do out[#out + 1] = a end return out")
    batch = ScriptBatch(client, [echo_all])
    keys = ["sb:ké{x}", b"sb:raw"]
    args = [0, -7, 2**62, 0.1, 1e-9, 30000000.0, 1733300000.1234567, "", "ünï \"quoted\" \\ \n", b"bytes", "1"]
    alone = echo_all(keys=keys, args=args)
    assert batch.run([(echo_all, keys, args)]) == [alone]
    assert alone[5:8] == [b"0.1", b"1e-09", b"30000000.0"]  # what a script sees of a float: Python's repr
    with pytest.raises(redis.DataError):
        batch.run([(echo_all, [], [True])])


def test_an_argument_json_cannot_carry_is_refused_with_what_to_do(client) -> None:
    """Bytes that are not UTF-8 text cannot travel in the batch's JSON: a one-line error, no call."""
    echo = client.register_script(ECHO)
    batch = ScriptBatch(client, [echo])
    before = evalshas(client)
    with pytest.raises(redis.DataError, match="not UTF-8 text"):
        batch.run([(echo, ["sb:b"], [b"\xff\xfe"])])
    assert evalshas(client) == before
