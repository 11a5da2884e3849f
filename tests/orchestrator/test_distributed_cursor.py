"""Completion in O(new work): the orchestrator's store cursor reads published files while runs
are still pending, so the look that confirms the last run reads only the last files, not the
whole store (real redis-server, a real `celery worker`, the simulator over loopback)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.workers import CeleryWorkers
from deploy.redis_server import RedisServer
from orchestrator.campaign.prepared import prepare
from orchestrator.distributed.executor import _cancelled_records
from orchestrator.distributed.options import CeleryOptions
from orchestrator.distributed.campaign import Bundle, DistributedCampaign
from orchestrator.campaign.spec import load_campaign
from simulator.config import SimConfig, SimModel
from simulator.server import start_background
from storage.runs import RunStore
from tests.support.campaign_files import one_endpoint, write_campaign
from workers.celery.app import make_celery_app
from workers.state.connect import sync_redis

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    # a segment per 0.3 s at most: many files during the campaign, as at scale
    env = {"IRBENCH_SPOOL_MAX_AGE_S": "0.3", "IRBENCH_CLAIM_TTL_S": "5"}
    with RedisServer() as srv, CeleryWorkers(srv.url, count=1, concurrency=4, env=env):
        yield srv.url


def test_the_cursor_reads_the_store_while_runs_are_pending(cluster: str, tmp_path: Path) -> None:
    # 120 runs × 100 ms at 4 in flight: ~3 s of campaign, ~10 spool segments at one per 0.3 s
    # (at 30 ms a fast machine finished in 1 s and published 3 files: the scenario never arose)
    with start_background(SimConfig(seed=5, models={"cur-a": SimModel(latency_ms_median=100)})) as s:
        path = write_campaign(tmp_path, "cur", one_endpoint(s.base_url, "cur-a") + "max_concurrency = 4\n",
                              runs=12, prompts=10)
        prepared = prepare(load_campaign(path))
        store = RunStore(tmp_path / "data")
        looks: list[tuple[int, int]] = []  # (runs still pending, files the cursor has read)
        client = sync_redis(cluster)
        camp: DistributedCampaign | None = None

        def sleep(s: float) -> None:
            assert camp is not None
            looks.append((camp.completion.pending_count, camp.completion.cursor.files_read))
            time.sleep(s)

        bundle = Bundle(redis=client, broker=make_celery_app(cluster), store=store, clock=time.monotonic, sleep=sleep)
        options = CeleryOptions(reconcile_interval_s=0.5, claim_ttl_s=5.0, analyze_on_complete=False)
        try:
            camp = DistributedCampaign(prepared, bundle, options, _cancelled_records)
            summary = camp.run(timeout_s=120)
        finally:
            client.close()
    assert not summary.interrupted and summary.executed == len(prepared.tasks) == 120
    files = len(store.dataset.data_files())
    assert files >= 4, files  # the scenario: the store grew file by file during the campaign
    read_while_pending = max((read for pending, read in looks if pending > 0), default=0)
    assert read_while_pending > 0, looks[-10:]
    assert camp.completion.cursor.files_read == files  # and every file read once, none twice
