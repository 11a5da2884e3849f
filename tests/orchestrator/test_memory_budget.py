"""A worker's calls in flight are bounded by its memory budget, not by a fixed slot count: real
redis-server, one real ``celery worker`` per budget, the simulator over loopback, calls in
flight counted at the simulator (its exchanges: arrival and reply of every request)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from deploy.celery_workers import CeleryWorkers
from deploy.redis_server import RedisServer
from orchestrator.campaign.prepared import prepare
from orchestrator.campaign.spec import load_campaign
from orchestrator.distributed.executor import CeleryRun, run_campaign_celery
from simulator.config import SimModel
from storage.runs import RunStore
from tests.support.distributed import (
    FAST,
    WORKER_ENV,
    assert_calls_equal_attempts,
    assert_every_run_stored,
    make_campaign,
    settle,
    sim,
    stats,
)
from workers.celery.memory_budget import BASE_MIB, CALL_KIB, calls_within

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
OLD_RUN_SLOTS = 64  # the fixed cap a worker had before it had a budget
ENV = {k: v for k, v in WORKER_ENV.items() if k != "IRBENCH_RUN_SLOTS"}  # slots from the budget


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with RedisServer() as srv:
        yield srv.url


def peak_in_flight(exchanges: list[list[float]]) -> int:
    edges = sorted([(e[0], 1) for e in exchanges] + [(e[1], -1) for e in exchanges])
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def run_on_one_worker(redis_url: str, tmp_path: Path, name: str, budget_mib: int, runs_per_message: int) -> int:
    """A campaign of ``name`` (one model allowing 400 calls at once, 0.6 s calls) on one worker of
    4 threads with ``budget_mib``; every run stored once and called once. Returns the most calls
    the simulator had open at once."""
    model = f"{name}-m"
    env = {**ENV, "IRBENCH_MEMORY_BUDGET_MIB": str(budget_mib)}
    with CeleryWorkers(redis_url, count=1, concurrency=4, env=env), \
            sim({model: SimModel(latency_ms_median=600, latency_sigma=0.05)}) as s:
        path = make_campaign(tmp_path, name, s.base_url, {model: {"max_concurrency": 400}}, prompts=8, runs=24)
        prepared = prepare(load_campaign(path))
        store = RunStore(tmp_path / "data")
        opts = replace(FAST, runs_per_message=runs_per_message, analyze_on_complete=False)
        summary = run_campaign_celery(prepared, store, redis_url, CeleryRun(options=opts, timeout_s=90))
        settle(store, redis_url, name)
        st = stats(s.base_url)
    assert not summary.interrupted and summary.executed == len(prepared.tasks) == 192
    assert_every_run_stored(store, prepared)
    assert_calls_equal_attempts(store, name, st, [model])
    return peak_in_flight(st[model]["exchanges"])


def test_a_worker_with_a_small_budget_holds_at_most_the_calls_it_budgets(redis_url: str, tmp_path: Path) -> None:
    budget_mib = BASE_MIB + 2  # 2 MiB over the base: 8 calls of 256 KiB
    calls = calls_within(budget_mib)
    assert calls == 2 * 1024 // CALL_KIB
    # 4 threads x 16-run messages: the worker holds 64 runs, the model allows 400 at once
    peak = run_on_one_worker(redis_url, tmp_path, "mb-small", budget_mib, runs_per_message=16)
    assert calls // 2 < peak <= calls, peak


def test_a_worker_with_a_large_budget_exceeds_the_old_slot_cap_when_its_models_allow(redis_url: str,
                                                                                     tmp_path: Path) -> None:
    budget_mib = 768  # the default: about 2,400 calls
    assert calls_within(budget_mib) > 10 * OLD_RUN_SLOTS
    # auto-sized messages: 192 runs over twice the worker's 4 threads = 24 per message, 96 held
    peak = run_on_one_worker(redis_url, tmp_path, "mb-large", budget_mib, runs_per_message=0)
    assert OLD_RUN_SLOTS < peak <= 4 * 24, peak
