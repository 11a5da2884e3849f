"""The distributed dispatcher honours availability: real redis-server, real `celery worker`
subprocesses, the simulator over loopback, the Parquet stores. No mocks.

* a model the availability dataset lists as retired is closed in the campaign's Redis gate; its
  runs are stored ``cancelled`` with the reason and the simulator never sees a call for it;
* a 410 met by a worker becomes an availability event (``source="campaign"``) with the
  retirement date, and the next campaign skips the model;
* the gate is reopened for a model found available again;
* the failure-attribution probe runs on the Celery executor, as on the local one.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from analysis.tables.probes import ProbeSettings
from orchestrator.campaign.prepared import prepare
from orchestrator.distributed.executor import (
    AVAILABILITY_MARK,
    CeleryOptions,
    _close_unavailable,
    campaign_status_celery,
    celery_execute,
    CeleryRun,
    run_campaign_celery,
)
from orchestrator.jobs.probe import ProbeExecution, run_probe
from orchestrator.campaign.spec import load_campaign
from simulator.config import SimConfig, SimModel, load_sim_config
from simulator.server import start_background
from storage.availability import Availability, AvailabilityRecord, AvailabilityStore
from storage.runs import RunStore
from tests.support.workers import CeleryWorkers
from deploy.redis_server import RedisServer
from tests.support.distributed import WORKER_ENV, make_campaign
from workers.state.campaign_state import CampaignState
from workers.state.connect import sync_redis

pytestmark = pytest.mark.timeout(120)
FAST = CeleryOptions(claim_ttl_s=3.0, reconcile_interval_s=1.0, analyze_on_complete=False)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[RedisServer, CeleryWorkers]]:
    with RedisServer() as srv, CeleryWorkers(srv.url, count=2, concurrency=4, env=WORKER_ENV) as workers:
        yield srv, workers


def _check(model: str, status: Availability, when: dt.datetime, **kw: object) -> AvailabilityRecord:
    return AvailabilityRecord(checked_at=when, endpoint="sim", model=model, status=status, **kw)


def _run(tmp: Path, name: str, url: str, models: list[str], broker: str, *, prompts: int = 3, runs: int = 2):
    spec = load_campaign(make_campaign(tmp, name, url, {m: {} for m in models}, prompts=prompts, runs=runs))
    prepared = prepare(spec)
    store = RunStore(tmp / "data")
    summary = run_campaign_celery(prepared, store, broker, CeleryRun(options=FAST, timeout_s=60))
    assert not summary.interrupted
    return prepared, store, summary


def test_retired_model_is_closed_and_never_called(tmp_path: Path, cluster) -> None:
    srv, _ = cluster
    now = dt.datetime.now(dt.timezone.utc)
    AvailabilityStore(tmp_path / "data").write([
        _check("av-gone", Availability.AVAILABLE, now - dt.timedelta(days=3)),
        _check("av-gone", Availability.RETIRED, now - dt.timedelta(days=1), http_status=410, retired_on="2026-05-01"),
        _check("av-alive", Availability.AVAILABLE, now - dt.timedelta(days=1)),
    ])
    with start_background(SimConfig(seed=3, models={"av-alive": SimModel(), "av-gone": SimModel()})) as sim:
        prepared, store, summary = _run(tmp_path, "av-skip", sim.base_url, ["av-alive", "av-gone"], srv.url)
        calls = dict(sim.app.state.model_requests)
    assert calls.get("av-gone", 0) == 0, "a model the availability check found retired must not be called"
    assert calls["av-alive"] == 6
    rows = store.read_table(campaigns=["av-skip"], columns=["model", "outcome", "cancel_reason"]).to_pylist()
    gone = [r for r in rows if r["model"] == "av-gone"]
    assert len(gone) == 6 and {r["outcome"] for r in gone} == {"cancelled"}
    assert all(r["cancel_reason"] == f"retired {AVAILABILITY_MARK}{(now - dt.timedelta(days=1)).date()})" for r in gone)
    assert {r["outcome"] for r in rows if r["model"] == "av-alive"} == {"ok"}
    assert summary.by_model["av-gone"] == {"cancelled": 6}
    status = campaign_status_celery(prepared, store, srv.url)
    assert status.closed_models["av-gone"].startswith("retired (availability check")
    assert "av-alive" not in status.closed_models
    assert status.progress["av-gone"].done == 6  # counters agree with the store


def test_gate_reopens_when_model_is_available_again(tmp_path: Path, cluster) -> None:
    srv, _ = cluster
    data = tmp_path / "data"
    now = dt.datetime.now(dt.timezone.utc)
    avail = AvailabilityStore(data)
    avail.write([_check("av-back", Availability.NOT_LISTED, now - dt.timedelta(days=2))])
    client = sync_redis(srv.url)
    try:
        state = CampaignState(client, "av-reopen")
        client.hset(state.key("gate"), "av-other", "retired: 410 seen by a worker")  # not ours to reopen
        assert _close_unavailable(state, RunStore(data), {"av-back", "av-other"}) == {
            "av-back": f"not_listed {AVAILABILITY_MARK}{(now - dt.timedelta(days=2)).date()})"}
        avail.write([_check("av-back", Availability.AVAILABLE, now)])
        assert _close_unavailable(state, RunStore(data), {"av-back", "av-other"}) == {}
        gate = {k.decode(): v.decode() for k, v in client.hgetall(state.key("gate")).items()}
        assert gate == {"av-other": "retired: 410 seen by a worker"}
    finally:
        client.close()


def test_410_during_campaign_becomes_availability_event(tmp_path: Path, cluster) -> None:
    srv, _ = cluster
    data = tmp_path / "data"
    models = {"av-dying": SimModel(retired_after_requests=2, retired_on="2026-08-01", retirement_reference="RET-7"),
              "av-steady": SimModel()}
    with start_background(SimConfig(seed=5, models=models)) as sim:
        _, store, summary = _run(tmp_path, "av-410", sim.base_url, ["av-dying", "av-steady"], srv.url,
                                 prompts=4, runs=3)
        assert summary.by_model["av-dying"].get("retired", 0) >= 1
        events = AvailabilityStore(data).read(sources=["campaign"]).to_pylist()
        assert events and {e["model"] for e in events} == {"av-dying"}
        assert all(e["status"] == "retired" and e["retired_on"] == "2026-08-01" and e["http_status"] == 410
                   for e in events)
        assert len(events) == summary.by_model["av-dying"]["retired"]  # one event per 410 run, as the local executor
        timeline = AvailabilityStore(data).unavailable_models()["av-dying"]
        assert timeline.retired_on == "2026-08-01" and timeline.latest_status is Availability.RETIRED
        before = sim.app.state.model_requests["av-dying"]
        # the next campaign (another name, so a fresh Redis gate) skips it without a call
        prepared2, _, summary2 = _run(tmp_path, "av-410-next", sim.base_url, ["av-dying", "av-steady"], srv.url)
        assert sim.app.state.model_requests["av-dying"] == before
    planned = sum(t.model == "av-dying" for t in prepared2.tasks)  # 4 prompts in the shared dir × 2 runs
    assert planned == 8 and summary2.by_model["av-dying"] == {"cancelled": planned}
    # a second pass over the same campaign writes no duplicate events
    again = run_campaign_celery(prepare(load_campaign(tmp_path / "av-410.toml")), store, srv.url,
                                CeleryRun(options=FAST, timeout_s=30))
    assert again.executed == 0
    assert len(AvailabilityStore(data).read(sources=["campaign"])) == len(events)


def test_probe_on_the_celery_executor(tmp_path: Path, cluster, examples_dir: Path) -> None:
    srv, _ = cluster
    settings = ProbeSettings(reference_timeout_s=1.0)  # slow simulated models ~2 s, fast ~5 ms
    with start_background(load_sim_config(examples_dir / "sim_probe.toml")) as sim:
        execution = ProbeExecution(execute=celery_execute(srv.url, options=FAST, timeout_s=90), secrets={})
        result = run_probe(examples_dir / "probe.toml", tmp_path / "data", settings=settings,
                           base_urls={"sim": sim.base_url}, execution=execution)
    got = {r["model"]: r["attribution"] for r in result.table.to_pylist()}
    assert got == {"probe-fast": "works_under_both", "probe-reasoner": "budget_bound",
                   "probe-slow": "timeout_bound", "probe-slow-reasoner": "fails_under_both"}
    assert result.planned == 48 and result.executed == 48 and result.skipped == 0
    assert result.parquet_path.exists()
