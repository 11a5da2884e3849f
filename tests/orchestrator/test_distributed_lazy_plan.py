"""The distributed executor never materialises its plan: starting a 200,000-run campaign and
sending its first window builds the tasks of that window only, in bounded memory (a real
redis-server as state and broker; no worker is needed to see what was sent)."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from deploy.redis_server import RedisServer
from orchestrator.campaign.plan import LazyPlan
from orchestrator.campaign.prepared import prepare
from orchestrator.campaign.spec import load_campaign
from orchestrator.distributed.campaign import Bundle, DistributedCampaign
from orchestrator.distributed.executor import _cancelled_records
from orchestrator.distributed.options import CeleryOptions
from storage.runs import RunStore
from tests.support.campaign_files import write_campaign
from workers.celery.app import make_celery_app
from workers.state.campaign_state import CampaignState
from workers.state.connect import sync_redis
from workers.runtask import RunTask

pytestmark = pytest.mark.timeout(120)

MODELS, PROMPTS, RUNS = 10, 2000, 10  # 200,000 runs
WINDOW = 300


def _campaign(tmp_path: Path) -> Path:
    body = '[endpoints.s]\nbase_url = "http://127.0.0.1:9"\n' + "".join(
        f"[models.m{k}]\nendpoint = \"s\"\n" for k in range(MODELS))
    return write_campaign(tmp_path, "lazy", body, runs=RUNS, prompts=PROMPTS)


def test_the_first_window_is_all_that_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prepared = prepare(load_campaign(_campaign(tmp_path)))
    plan = prepared.tasks
    assert isinstance(plan, LazyPlan) and len(plan) == MODELS * PROMPTS * RUNS
    built = [0]
    task = LazyPlan.task

    def counting(self: LazyPlan, i: int) -> RunTask:
        built[0] += 1
        return task(self, i)

    monkeypatch.setattr(LazyPlan, "task", counting)
    options = CeleryOptions(max_outstanding=WINDOW, dispatch_batch=100, runs_per_message=10,
                            analyze_on_complete=False, honour_availability=False)
    with RedisServer() as srv:
        client = sync_redis(srv.url)
        try:
            bundle = Bundle(redis=client, broker=make_celery_app(srv.url), store=RunStore(tmp_path / "data"),
                            clock=time.monotonic, sleep=time.sleep)
            tracemalloc.start()
            try:
                camp = DistributedCampaign(prepared, bundle, options, _cancelled_records)
                camp.start()
                sent = camp.dispatcher.dispatch()
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            queued = CampaignState(client, "lazy").queued.dispatched_at()
        finally:
            client.close()
    assert sent == WINDOW and built[0] <= WINDOW, (sent, built[0])
    # the first window is the plan's first runs, models interleaved, under their pinned ids
    assert set(queued) == {task(plan, i).run_id for i in range(WINDOW)}
    # 200,000 held tasks are ~700 MB; the bitmaps of the plan are 25 KB each
    assert peak < 48 * 2**20, f"{peak / 2**20:.0f} MiB traced while starting and sending one window"
