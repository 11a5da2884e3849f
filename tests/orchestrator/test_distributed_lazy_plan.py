"""The distributed executor never materialises its plan: starting a 200,000-run campaign and
sending its first window builds the tasks of that window only, in bounded memory, and a resume
maps what the store and Redis hold back to plan indices (a real redis-server as state and
broker; no worker is needed to see what was sent)."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from deploy.redis_server import RedisServer
from orchestrator.campaign.plan import LazyPlan
from orchestrator.campaign.prepared import PreparedCampaign, prepare
from orchestrator.campaign.spec import load_campaign
from orchestrator.distributed.campaign import Bundle, DistributedCampaign
from orchestrator.distributed.executor import _cancelled_records
from orchestrator.distributed.options import CeleryOptions
from storage.outcomes import Outcome
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


OPTIONS = CeleryOptions(max_outstanding=WINDOW, dispatch_batch=100, runs_per_message=10,
                        analyze_on_complete=False, honour_availability=False)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter of the tasks the plan builds from now on."""
    built = [0]
    task = LazyPlan.task

    def counting(self: LazyPlan, i: int) -> RunTask:
        built[0] += 1
        return task(self, i)

    monkeypatch.setattr(LazyPlan, "task", counting)
    return built


def _started(prepared: PreparedCampaign, client: redis.Redis, url: str, store: RunStore,
             between: Callable[[], object] = lambda: None) -> tuple[DistributedCampaign, int, int]:
    """A campaign started, ``between`` called, then its first window sent: (the campaign, runs
    sent, bytes traced at peak)."""
    bundle = Bundle(redis=client, broker=make_celery_app(url), store=store, clock=time.monotonic, sleep=time.sleep)
    tracemalloc.start()
    try:
        camp = DistributedCampaign(prepared, bundle, OPTIONS, _cancelled_records)
        camp.start()
        between()
        sent = camp.dispatcher.dispatch()
        return camp, sent, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_first_window_is_all_that_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prepared = prepare(load_campaign(_campaign(tmp_path)))
    plan = prepared.tasks
    assert isinstance(plan, LazyPlan) and len(plan) == MODELS * PROMPTS * RUNS
    built = _counting(monkeypatch)
    with RedisServer() as srv:
        client = sync_redis(srv.url)
        try:
            _, sent, peak = _started(prepared, client, srv.url, RunStore(tmp_path / "data"))
            queued = CampaignState(client, "lazy").queued.dispatched_at()
        finally:
            client.close()
    assert sent == WINDOW and built[0] <= WINDOW, (sent, built[0])
    # the first window is the plan's first runs, models interleaved, under their pinned ids
    assert set(queued) == {plan.run_id(i) for i in range(WINDOW)}
    # 200,000 held tasks are ~700 MB; the bitmaps of the plan are 25 KB each
    assert peak < 48 * 2**20, f"{peak / 2**20:.0f} MiB traced while starting and sending one window"


def test_a_resume_skips_what_is_stored_and_what_redis_has_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs 0-99 stored, 100-159 queued by an earlier orchestrator at the start, 150-159 of them
    done before the window reaches them: the first window is runs 160-409 (the 50 still queued
    take their room), the done ones are announced (the store is to confirm them), the others are
    out. Then a store look finds run 200 stored and run 201 as ``worker_died`` (a killed
    worker's spool recovered): 200 is settled, 201 stays pending and out, for the reconciler to
    send again once its claim expires."""
    prepared = prepare(load_campaign(_campaign(tmp_path)))
    plan = prepared.tasks
    assert isinstance(plan, LazyPlan)
    store = RunStore(tmp_path / "data")
    store.write(_cancelled_records([plan.task(i) for i in range(100)], "stored before"))
    with RedisServer() as srv:
        client = sync_redis(srv.url)
        try:
            state = CampaignState(client, "lazy")
            state.queued.record(plan.run_id(i) for i in range(100, 160))

            def finish() -> None:
                for i in range(150, 160):
                    state.done.mark(plan.run_id(i), plan.model_of(i), "ok", False, 1)

            built = _counting(monkeypatch)
            camp, sent, _ = _started(prepared, client, srv.url, store, finish)
            queued, built_by_window = set(state.queued.dispatched_at()), built[0]
            pending_before, unverified = camp.completion.pending_count, camp.completion.unverified().tolist()
            died = _cancelled_records([plan.task(201)], "died")[0].model_copy(update={"outcome": Outcome.WORKER_DIED})
            store.write([*_cancelled_records([plan.task(200)], "stored since"), died])
            camp.completion.check()
        finally:
            client.close()
    assert sent == WINDOW - 50 and built_by_window == 60 + sent, (sent, built_by_window)
    assert queued == {plan.run_id(i) for i in [*range(100, 150), *range(160, 410)]}
    tracker = camp.completion
    assert pending_before == len(plan) - 100 - 10
    assert unverified == list(range(150, 160))  # done per Redis, not stored: verified later
    assert all(plan.run_id(i) in camp.ctx.plan.inflight for i in range(100, 150))
    assert tracker.pending_count == pending_before - 1
    assert not tracker.is_pending(200) and plan.run_id(200) not in camp.ctx.plan.inflight
    assert camp.dispatcher.pending_out([plan.run_id(200), plan.run_id(201)]) == [201]
    assert tracker.executed() == (2, {plan.model_of(200): {"cancelled": 1}, plan.model_of(201): {"worker_died": 1}})


def test_the_tally_keeps_the_execution_that_finished_last() -> None:
    import datetime as dt

    import numpy as np
    import pyarrow as pa

    from orchestrator.distributed.executed_tally import ExecutedTally

    def rows(outcomes: list[str], finished_s: list[int | None], measured_s: list[int]) -> pa.Table:
        stamp = [None if s is None else dt.datetime.fromtimestamp(s, dt.timezone.utc) for s in finished_s]
        return pa.table({"outcome": outcomes, "finished_at": pa.array(stamp, pa.timestamp("us", "UTC")),
                         "measured_at": pa.array([dt.datetime.fromtimestamp(s, dt.timezone.utc) for s in measured_s],
                                                 pa.timestamp("us", "UTC"))})

    tally = ExecutedTally(6)  # plan indices 0..5 of models a, b (index % 2)
    tally.add(np.array([1, 1, 4]), rows(["timeout_read", "ok", "ok"], [20, 10, 5], [0, 0, 0]))
    tally.add(np.array([4, 3]), rows(["server_error", "ok"], [None, 7], [3, 0]))  # 4: measured 3 < finished 5
    tally.add(np.array([1]), rows(["server_error"], [30], [0]))  # 1 again, later than 20
    executed, by_model = tally.summary(("a", "b"), lambda idx: idx % 2)
    assert executed == 3
    assert by_model == {"b": {"server_error": 1, "ok": 1}, "a": {"ok": 1}}


def test_bitmap_discard_and_test_are_the_inverse_of_add() -> None:
    import numpy as np

    from orchestrator.campaign.run_bitmap import RunBitmap

    bits = RunBitmap.full(21)
    bits.discard(np.array([0, 7, 8, 20, 8]))
    assert bits.test(np.array([0, 1, 7, 8, 9, 20])).tolist() == [False, True, False, False, True, False]
    assert bits.count() == 17 and bits.copy() == bits
    with pytest.raises(IndexError):
        bits.discard(np.array([21]))
