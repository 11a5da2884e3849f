"""More faults against real workers: a worker stopped past its claim, a poison run (its task
raises; or it kills its worker every time), deferred (rate-limited) runs whose worker dies, and
deferred runs while the orchestrator is down. Same harness as tests/orchestrator/test_distributed.py: real
redis-server, real worker processes, the simulator over loopback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from orchestrator.campaign.prepared import prepare
from orchestrator.distributed.options import CeleryOptions
from orchestrator.campaign.spec import load_campaign
from simulator.config import SimModel
from storage.parquet.spool import recover_orphans
from storage.runs import RunStore
from tests.support.workers import CeleryWorkers
from deploy.redis_server import RedisServer
from tests.support.distributed import (
    RUN_SLOTS,
    WORKER_ENV,
    Background,
    Cluster,
    assert_calls_equal_attempts,
    assert_every_run_stored,
    attempts_by_model,
    executions_per_run,
    make_campaign,
    settle,
    sim,
    stats,
    wait_for,
    wait_settled,
)
from tests.support.paths import REPO
from workers.state.campaign_state import CampaignState
from tests.support.cli import run_cli
from tests.support import forked

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]
FAST = CeleryOptions(claim_ttl_s=3.0, reconcile_interval_s=1.0, analyze_on_complete=False)


@pytest.fixture(scope="module")
def faults() -> Iterator[Cluster]:
    env = {**WORKER_ENV, "IRBENCH_FAILURE_BACKOFF_S": "0.2"}
    with RedisServer(aof=True) as srv, CeleryWorkers(srv.url, count=3, concurrency=4, env=env) as workers:
        yield Cluster(srv, workers)


@pytest.fixture
def up(faults: Cluster) -> Iterator[Cluster]:
    faults.workers.ensure_running()
    yield faults


# one run per message is the soak lane here: test_distributed.py covers that path under a kill
@pytest.mark.parametrize("per_message", [pytest.param(1, marks=pytest.mark.soak), 4])
def test_worker_stopped_past_its_claim_keeps_both_executions(up: Cluster, tmp_path: Path, per_message: int) -> None:
    name = "f1" if per_message == 1 else f"f1k{per_message}"
    model = "f1-a" if per_message == 1 else f"f1-a-k{per_message}"  # fresh limiter state
    models = {model: SimModel(latency_ms_median=400, latency_sigma=0.05)}
    with sim(models) as s:
        prepared = prepare(load_campaign(make_campaign(tmp_path, name, s.base_url, {model: {"max_concurrency": 12}},
                                                       prompts=4, runs=6)))
        store = RunStore(tmp_path / "data")
        bg = Background(prepared, store, up.url, options=replace(FAST, runs_per_message=per_message), timeout_s=120)
        # the first wave: each of the 12 threads has sent its call (0.4 s each)
        wait_for(lambda: stats(s.base_url).get(model, {}).get("requests", 0) >= 12, 30, "calls in flight")
        up.workers.kill(0, signal.SIGSTOP)  # frozen mid-call, past its 3 s claim TTL
        try:
            # the reconciler re-sends its runs to the live workers: each run makes one call, so a
            # 25th call is one of them executed again; its claims expired together, so one more
            # reconcile pass re-sends the rest (waiting on the condition, not a fixed sleep)
            wait_for(lambda: stats(s.base_url)[model]["requests"] > len(prepared.tasks), 60,
                     "a frozen worker's run called again elsewhere")
            time.sleep(2 * FAST.reconcile_interval_s)
        finally:
            up.workers.kill(0, signal.SIGCONT)  # it wakes up, finishes and stores its executions
        summary = bg.join(120)
        # the woken worker's executions arrive after the campaign may have finished: its calls
        # take 0.4 s, its spool publishes 0.5 s after the last append; calls and stored attempts
        # are read together until neither moves for longer than that
        wait_for(lambda: attempts_by_model(store, name)[model] >= stats(s.base_url)[model]["requests"], 30,
                 "the stopped worker's executions stored")
        wait_settled(lambda: (stats(s.base_url)[model]["requests"], attempts_by_model(store, name)[model]),
                     1.5, 30, "calls and stored attempts")
        st = stats(s.base_url)
    assert not summary.interrupted
    execs = executions_per_run(store)
    twice = [r for r, n in execs.items() if n > 1]
    assert twice, ("the stopped worker's runs should have been executed again elsewhere", st,
                   up.workers.tail(0)[-4000:])
    assert len(twice) <= 4  # at most the stopped worker's 4 threads
    assert_calls_equal_attempts(store, name, st, models)  # its attempts are not lost: every call stored
    # analysis sees one record per run: the latest execution
    recs = store.read_records(campaigns=[name])
    assert len(recs) == 24 and {r.run_id for r in recs} == set(execs)


@pytest.mark.parametrize("per_message", [1, 4])  # 4: the poison run shares its message with others
def test_poison_run_ends_as_worker_error_and_others_carry_on(up: Cluster, tmp_path: Path, per_message: int) -> None:
    name = "f2" if per_message == 1 else f"f2k{per_message}"
    models = {"f2-a": SimModel(latency_ms_median=5), "f2-b": SimModel(latency_ms_median=5)}
    with sim(models) as s:
        path = make_campaign(tmp_path, name, s.base_url, {m: {} for m in models}, prompts=3, runs=2)
        prepared = prepare(load_campaign(path))
        # one run whose task raises every time: a lone surrogate cannot be encoded as UTF-8 JSON
        victim = prepared.tasks[0]
        bad = victim.model_copy(update={"user_message": victim.user_message + "\ud800"})
        prepared = replace(prepared, tasks=[bad, *prepared.tasks[1:]])
        store = RunStore(tmp_path / "data")
        opts = replace(FAST, max_task_failures=3, runs_per_message=per_message)
        summary = Background(prepared, store, up.url, options=opts, timeout_s=90).join(100)
        st = stats(s.base_url)
    assert not summary.interrupted
    assert_every_run_stored(store, prepared)
    recs = {r.run_id: r for r in store.read_records(campaigns=[name])}
    poison = recs[victim.run_id]
    assert poison.outcome.value == "worker_error" and poison.attempts == []
    assert "3 task failures" in poison.cancel_reason and "UnicodeEncodeError" in poison.cancel_reason
    assert Counter(r.outcome.value for rid, r in recs.items() if rid != victim.run_id) == {"ok": 11}
    assert_calls_equal_attempts(store, name, st, models)  # the poison run never reached the endpoint
    # its raising executions resolved their intents: the workers' spools, recovered after a
    # SIGKILL of every worker, store no worker_died for calls that were never sent
    for i in range(up.workers.count):
        up.workers.kill(i)
    recover_orphans(store.dataset)
    assert_calls_equal_attempts(store, name, st, models)
    assert store.count_by_outcome(name).get("worker_died", 0) == 0
    state = CampaignState(redis.Redis.from_url(up.url), name)
    assert state.claims.failures(victim.run_id)[0] == 3 and state.delayed.count() == 0
    # the status script view
    out = run_cli(["status", str(path), "--data", str(store.root), "--json"], cwd=REPO, timeout_s=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["total"] == {"planned": 12, "stored": 12, "executions": 12, "attempts": 11,
                               "outcomes": {"ok": 11, "worker_error": 1}}
    assert report["models"][victim.model]["outcomes"].get("worker_error") == 1


# one run per message is the soak lane here: test_distributed.py covers that path under a kill
@pytest.mark.parametrize("per_message", [pytest.param(1, marks=pytest.mark.soak), 4])
def test_deferred_runs_survive_their_worker(up: Cluster, tmp_path: Path, per_message: int) -> None:
    name = "f3" if per_message == 1 else f"f3k{per_message}"
    model = "f3-rl" if per_message == 1 else f"f3-rl-k{per_message}"  # fresh limiter state
    rpm = 8  # per 1 s window on the workers: 48 runs need ~6 s, most of them deferred
    models = {model: SimModel(latency_ms_median=5)}
    with sim(models) as s:
        prepared = prepare(load_campaign(make_campaign(tmp_path, name, s.base_url,
                                                       {model: {"requests_per_minute": rpm}}, prompts=8, runs=6)))
        store = RunStore(tmp_path / "data")
        bg = Background(prepared, store, up.url, options=replace(FAST, runs_per_message=per_message), timeout_s=120)
        state = CampaignState(redis.Redis.from_url(up.url), name)
        wait_for(lambda: state.delayed.count() >= 10, 30, "deferred runs")
        up.workers.kill(0)  # deferred runs are in Redis, not countdown messages in this worker
        t_kill = time.monotonic()
        summary = bg.join(120)
        after_s = time.monotonic() - t_kill
        st = stats(s.base_url)
    assert not summary.interrupted
    assert_every_run_stored(store, prepared, max_duplicates=RUN_SLOTS)
    assert_calls_equal_attempts(store, name, st, models)  # calls in flight at the kill: worker_died
    assert state.delayed.count() == 0
    # ~40 runs at 8/s after the kill: ~5 s of rate-limited work, plus one claim TTL at most
    assert after_s < 20, after_s
    assert "run_deferred" in up.workers.logs()


def test_retry_failed_adds_a_newer_execution(up: Cluster, tmp_path: Path) -> None:
    """``retry_outcomes`` (``--retry-failed``): runs whose latest execution failed go again and
    are done once a newer execution is stored; both executions stay in the store."""
    from orchestrator.distributed.executor import CeleryRun, run_campaign_celery
    from simulator.config import SimConfig
    from simulator.server import start_background
    from storage.records import Outcome
    from deploy.local_cluster import free_port

    port = free_port()
    path = make_campaign(tmp_path, "f4", f"http://127.0.0.1:{port}/v1", {"f4-a": {}}, prompts=3, runs=2,
                         retry={"max_attempts": 1})
    prepared = prepare(load_campaign(path))
    store = RunStore(tmp_path / "data")
    first = run_campaign_celery(prepared, store, up.url, CeleryRun(options=FAST, timeout_s=60))  # nothing listens
    assert first.by_model == {"f4-a": {"connect_error": 6}}
    with start_background(SimConfig(models={"f4-a": SimModel(latency_ms_median=5)}), port=port) as s:
        plain = run_campaign_celery(prepared, store, up.url, CeleryRun(options=FAST, timeout_s=60))
        assert plain.executed == 0 and stats(s.base_url).get("f4-a", {}).get("requests", 0) == 0
        again = run_campaign_celery(prepared, store, up.url,
                                    CeleryRun(options=FAST, timeout_s=60, retry_outcomes=frozenset({Outcome.CONNECT_ERROR})))
        st = stats(s.base_url)
    assert again.by_model == {"f4-a": {"ok": 6}} and st["f4-a"]["requests"] == 6
    execs = store.read_executions(campaigns=["f4"], columns=["outcome"]).column("outcome").to_pylist()
    assert sorted(execs) == ["connect_error"] * 6 + ["ok"] * 6
    assert store.count_by_outcome("f4") == {"ok": 6}


def _owner_worker(owner: str) -> int:
    """Worker index of a claim owner ``w<i>-<generation>@<host>:<uuid>`` (CeleryWorkers names)."""
    return int(owner.split("@", 1)[0][1:].split("-", 1)[0])


def test_a_run_that_kills_its_worker_ends_as_worker_error(up: Cluster, tmp_path: Path) -> None:
    """Requirement 5, the worker-death path: every time the poison run is executing, its worker
    process is SIGKILLed (the harness watches the endpoint receive the poison call, reads the
    run's claim owner from Redis and kills that worker). The deaths are counted through the
    claim-expiry path (no result, claim gone): after ``max_task_failures`` = 3 the orchestrator
    stores ``worker_error`` and never sends the run again; the other runs are all stored."""
    deaths = 3
    poison_model = "f5-poison"  # every call hangs: the worker is always mid-call when killed
    models = {"f5-a": SimModel(latency_ms_median=20), "f5-b": SimModel(latency_ms_median=20),
              poison_model: SimModel(hang_prob=1.0, hang_s=30.0)}
    with sim(models) as s:
        path = make_campaign(tmp_path, "f5", s.base_url, {m: {} for m in models}, prompts=4, runs=3)
        prepared = prepare(load_campaign(path))
        poison = next(t for t in prepared.tasks if t.model == poison_model)
        prepared = replace(prepared, tasks=[t for t in prepared.tasks if t.model != poison_model or t.run_id == poison.run_id])
        store = RunStore(tmp_path / "data")
        state = CampaignState(redis.Redis.from_url(up.url), "f5")
        opts = replace(FAST, max_task_failures=deaths)
        bg = Background(prepared, store, up.url, options=opts, timeout_s=120)
        killed: list[int] = []
        for n in range(1, deaths + 1):
            wait_for(lambda n=n: stats(s.base_url).get(poison_model, {}).get("requests", 0) >= n, 60,
                     f"poison call {n}")
            owner = state.client.get(state.key(f"claim:{poison.run_id}"))
            assert owner is not None, "the poison run is being called, so a live worker holds its claim"
            victim = _owner_worker(owner.decode())
            up.workers.kill(victim)
            killed.append(victim)
            up.workers.ensure_running()  # the worker comes back; the run is re-sent after its claim expires
        summary = bg.join(100)
        time.sleep(FAST.claim_ttl_s + FAST.reconcile_interval_s)  # a re-send would have reached the endpoint
        st = stats(s.base_url)
    assert not summary.interrupted
    assert st[poison_model]["requests"] == deaths, st  # one call per death, never re-sent after the last
    recs = {r.run_id: r for r in store.read_records(campaigns=["f5"])}
    assert set(recs) == {t.run_id for t in prepared.tasks}
    bad = recs[poison.run_id]
    assert bad.outcome.value == "worker_error" and bad.attempts == []
    assert f"{deaths} task failures" in bad.cancel_reason and "worker lost" in bad.cancel_reason
    others = [r for rid, r in recs.items() if rid != poison.run_id]
    assert Counter(r.outcome.value for r in others) == {"ok": 24}, Counter(r.outcome.value for r in others)
    assert state.claims.failures(poison.run_id)[0] == deaths
    assert state.delayed.count() == 0 and poison.run_id not in state.claims.running()
    # every call stored, those in flight on a killed worker as worker_died: each poison call too;
    # a kill can land between a call's intent and its send (at most a worker's slots each time)
    assert_calls_equal_attempts(store, "f5", st, models, unsent=deaths * RUN_SLOTS)
    died = store.read_executions(campaigns=["f5"], columns=["run_id", "outcome"]).to_pylist()
    assert sum(1 for r in died if r["run_id"] == poison.run_id and r["outcome"] == "worker_died") == deaths
    assert len(killed) == deaths


def _irbench_run(path: Path, data: Path, url: str) -> subprocess.Popen[bytes]:
    """``irbench run`` (the CLI) on the workers, as its own process group."""
    argv = [sys.executable, "-m", "orchestrator.cli.app", "run", str(path), "--data", str(data), "--executor", "celery",
            "--broker", url, "--claim-ttl-s", "3", "--reconcile-interval-s", "1", "--no-analyze", "--no-progress"]
    return forked.popen(argv, cwd=REPO, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_deferred_runs_wait_while_the_orchestrator_is_down(up: Cluster, tmp_path: Path) -> None:
    """The design: rate-limited runs wait in the campaign's delayed set in Redis, and only the
    orchestrator moves due runs back to the broker (``DelayedRuns.pop_due``). So while the
    orchestrator is down (SIGKILL) deferred runs stay parked — no call, nothing lost, the
    workers idle — and ``irbench run`` again resumes them: it sees them deferred (Redis knows
    them, so they are not sent twice), releases them as they fall due, and the campaign ends
    with every run stored once and every call stored as an attempt."""
    rpm = 8  # per 1 s window on the workers: 48 runs need ~6 s, most of them deferred
    models = {"f6-rl": SimModel(latency_ms_median=5)}
    with sim(models) as s:
        path = make_campaign(tmp_path, "f6", s.base_url, {"f6-rl": {"requests_per_minute": rpm}}, prompts=8, runs=6)
        prepared = prepare(load_campaign(path))
        store = RunStore(tmp_path / "data")
        state = CampaignState(redis.Redis.from_url(up.url), "f6")
        first = _irbench_run(path, store.root, up.url)
        try:
            wait_for(lambda: state.delayed.count() >= 10 or first.poll() is not None, 60, "deferred runs")
            assert first.poll() is None, first.communicate()[1].decode()[-2000:]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)
        # what was already published drains (calls, or deferrals into the delayed set) ...
        seen = [(-1, 0.0)]

        def drained() -> bool:
            n, now = stats(s.base_url)["f6-rl"]["requests"], time.monotonic()
            if n != seen[-1][0] or state.claims.running():
                seen.append((n, now))
            return now - seen[-1][1] >= 1.5  # no new call and nothing executing for 1.5 s

        wait_for(drained, 30, "published runs drained")
        calls = stats(s.base_url)["f6-rl"]["requests"]
        parked = state.delayed.count()
        # ... then nothing moves for a claim TTL and a reconcile pass (what could move a run): it waits
        time.sleep(FAST.claim_ttl_s + FAST.reconcile_interval_s)
        assert stats(s.base_url)["f6-rl"]["requests"] == calls
        assert state.delayed.count() == parked > 0 and state.delayed.next_due_in_s() < 0  # due, and still parked
        assert calls < len(prepared.tasks)
        second = _irbench_run(path, store.root, up.url)  # the same command again resumes
        out, err = second.communicate(timeout=90)
        assert second.returncode == 0, err.decode()[-2000:]
        settle(store, up.url, "f6")
        st = stats(s.base_url)
    assert "executed now" in out.decode()
    assert_every_run_stored(store, prepared)  # each run once: the resumed orchestrator re-sent nothing twice
    assert st["f6-rl"]["requests"] == len(prepared.tasks)  # one call per run, none lost or repeated
    assert_calls_equal_attempts(store, "f6", st, models)
    assert state.delayed.count() == 0 and state.outstanding() == 0
