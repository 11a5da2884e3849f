"""Every call the endpoint received is a stored attempt, even when its worker is SIGKILLed
mid-call: real redis-server, three real ``celery worker`` processes on one store
(``IRBENCH_DATA``), the simulator answering slowly so that calls are in flight at the kill.

The killed worker is restarted on the same spool; it publishes what its predecessor left,
including the calls it had in flight as ``worker_died`` executions (its intents), and the
reconciler re-sends those runs, so each run's latest execution is a real answer. With the
intent journal off (``IRBENCH_INTENT_JOURNAL=0`` in the environment the workers inherit) the
endpoint receives more calls than the store holds attempts, and this test fails.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.workers import CeleryWorkers
from deploy.redis_server import RedisServer
from orchestrator.campaign.prepared import prepare
from orchestrator.campaign.spec import load_campaign
from orchestrator.distributed.options import CeleryOptions
from simulator.config import SimModel
from storage.outcomes import Outcome
from storage.parquet.spool import pending_rows
from storage.runs import RunStore
from tests.support.distributed import (
    RUN_SLOTS,
    WORKER_ENV,
    Background,
    Cluster,
    attempts_by_model,
    executions_per_run,
    make_campaign,
    settle,
    sim,
    stats,
    wait_for,
    wait_settled,
)

pytestmark = pytest.mark.timeout(180)
FAST = CeleryOptions(claim_ttl_s=3.0, reconcile_interval_s=1.0, analyze_on_complete=False)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("journal") / "data"


@pytest.fixture(scope="module")
def journal(root: Path) -> Iterator[Cluster]:
    env = {**WORKER_ENV, "IRBENCH_DATA": str(root)}  # the workers' own store: its spool opens at start
    with RedisServer(aof=True) as srv, CeleryWorkers(srv.url, count=3, concurrency=4, env=env) as workers:
        yield Cluster(srv, workers)


def _died(store: RunStore, campaign: str) -> list:
    t = store.read_executions(campaigns=[campaign], columns=["run_id", "outcome", "attempts", "finished_at"])
    return [row for row in t.to_pylist() if row["outcome"] == Outcome.WORKER_DIED.value]


def test_a_call_in_flight_at_a_sigkill_is_a_stored_attempt(journal: Cluster, root: Path, tmp_path: Path) -> None:
    models = {f"j-{k}": SimModel(latency_ms_median=400, latency_sigma=0.05) for k in "ab"}
    with sim(models) as s:
        path = make_campaign(tmp_path, "journal", s.base_url, {m: {"max_concurrency": 12} for m in models},
                             prompts=6, runs=5)
        prepared = prepare(load_campaign(path))
        store = RunStore(root)
        bg = Background(prepared, store, journal.url, options=replace(FAST, runs_per_message=2), timeout_s=150)

        def calls() -> int:
            return sum(m.get("requests", 0) for m in stats(s.base_url).values())

        wait_for(lambda: calls() >= 20, 60, "calls under way")  # every slot busy: 0.4 s calls
        journal.workers.kill(0)  # SIGKILL mid-call
        journal.workers.ensure_running()  # the same store, the same spool directory
        summary = bg.join(150)
        settle(store, journal.url, "journal")
        # the last duplicate executions finish and their spools publish (0.5 s idle)
        wait_settled(lambda: (calls(), sum(attempts_by_model(store, "journal").values())), 1.5, 30,
                     "calls and stored attempts")
        st = stats(s.base_url)
    assert not summary.interrupted
    received = {m: st[m]["requests"] for m in models}
    stored = attempts_by_model(store, "journal")
    died = _died(store, "journal")
    print(f"calls received {received}, attempts stored {dict(stored)}, worker_died executions {len(died)}")
    assert received == dict(stored), (received, dict(stored), died)  # every call is an attempt
    assert 1 <= len(died) <= RUN_SLOTS, died  # the killed worker's calls in flight, nothing else
    assert all(row["attempts"][-1]["outcome"] == "worker_died" for row in died)
    # every run stored once as its latest execution: a real answer, later than its worker_died
    latest = {r.run_id: r for r in store.read_records(campaigns=["journal"])}
    assert set(latest) == {t.run_id for t in prepared.tasks}
    assert Counter(r.outcome.value for r in latest.values()) == {"ok": len(prepared.tasks)}
    execs = executions_per_run(store)
    assert all(execs[row["run_id"]] >= 2 and latest[row["run_id"]].finished_at > row["finished_at"] for row in died)
    assert pending_rows(store.dataset) == 0
