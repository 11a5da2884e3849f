"""Soak: a long distributed campaign under repeated worker kills and a Redis restart.

Excluded from `make test` (marked ``soak``); run on demand with `make soak`. The CI-sized
versions of each fault are in tests/orchestrator/test_distributed.py.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.campaign.prepared import prepare
from orchestrator.campaign.spec import load_campaign
from simulator.config import SimModel
from storage.runs import RunStore
from tests.support.distributed import (  # noqa: F401 - fixtures
    RUN_SLOTS,
    FAST,
    Background,
    assert_calls_equal_attempts,
    assert_every_run_stored,
    cluster,
    live,
    make_campaign,
    records_by_model,
    sim,
    stats,
    stored_count,
    wait_for,
)

pytestmark = pytest.mark.soak


def test_soak_repeated_worker_kills_and_a_redis_restart(live, tmp_path: Path) -> None:  # noqa: F811
    rng = random.Random(7)
    models = {f"soak-{k}": SimModel(latency_ms_median=60, latency_sigma=0.5, server_error_prob=0.05) for k in "abcd"}
    with sim(models) as s:
        path = make_campaign(tmp_path, "soak", s.base_url, {m: {} for m in models}, prompts=30, runs=5)
        prepared = prepare(load_campaign(path))
        store = RunStore(tmp_path / "data")
        bg = Background(prepared, store, live.url, options=FAST, timeout_s=900)
        total = len(prepared.tasks)
        for step in range(6):  # kill a random worker at ~1/8, 2/8, … of the campaign
            wait_for(lambda step=step: stored_count(store, "soak") >= (step + 1) * total // 8, 300, f"step {step}")
            live.workers.kill(rng.randrange(3))
            time.sleep(1.0)
            live.workers.ensure_running()
            if step == 3:
                live.redis.restart(kill=True)
        summary = bg.join(900)
        st = stats(s.base_url)
    assert not summary.interrupted
    # each kill may cut the in-flight calls of one worker (4 threads) short: re-executed runs
    assert_every_run_stored(store, prepared, max_duplicates=6 * RUN_SLOTS + total // 100)
    # calls in flight at each kill: worker_died; a kill between an intent's fsync and its send
    # stores an attempt the endpoint never received (at most the killed worker's slots)
    assert_calls_equal_attempts(store, "soak", st, models, unsent=6 * RUN_SLOTS)
    outcomes = Counter(r.outcome.value for rs in records_by_model(store, "soak").values() for r in rs)
    assert sum(outcomes.values()) == total
    assert set(outcomes) <= {"ok", "server_error"}
