"""Availability checks against the simulator over loopback, timelines, and the artifact import."""

from __future__ import annotations

import datetime as dt
import socket
from pathlib import Path

import pytest

from orchestrator.jobs.availability import (
    CheckSettings,
    CheckTarget,
    check_availability,
    import_availability_artifact,
)
from simulator.config import SimConfig, SimModel
from simulator.server import start_background
from storage.availability import Availability, AvailabilityStore
from storage.probes import ProbeStore
from workers.runtask import EndpointRef, TimeoutPolicy
from simulator.process import stop_process

DAY1 = dt.datetime(2026, 9, 1, 6, 0, tzinfo=dt.timezone.utc)
DAY2 = DAY1 + dt.timedelta(days=1)
FAST = CheckSettings(timeouts=TimeoutPolicy(connect_timeout_s=2.0, read_timeout_s=0.5, total_timeout_s=0.5))


def _config(api_key: str | None = None) -> SimConfig:
    return SimConfig(api_key=api_key, models={
        "alive": SimModel(latency_ms_median=2),
        # answers the first call, then every call is 410 (switched to retired between checks)
        "going": SimModel(retired_after_requests=1, retired_on="2026-08-01", retirement_reference="RET-0042",
                          replacement_model="alive"),
        "hidden": SimModel(listed=False),
        "slow": SimModel(hang_prob=1.0, hang_s=3.0),
    })


def _target(base_url: str, *models: str, key_env: str | None = None) -> CheckTarget:
    return CheckTarget(EndpointRef(name="sim", base_url=base_url, api_key_env=key_env), models)


def test_statuses_and_switch_to_retired(tmp_path: Path) -> None:
    store = AvailabilityStore(tmp_path / "data", fsync=False)
    with start_background(_config()) as sim:
        target = _target(sim.base_url, "alive", "going", "hidden", "slow", "ghost")
        first = check_availability([target], store, now=lambda: DAY1, secrets={}, settings=FAST)
        second = check_availability([target], store, now=lambda: DAY2, secrets={}, settings=FAST)
    s1 = {r.model: r for r in first}
    assert {m: r.status for m, r in s1.items()} == {
        "alive": Availability.AVAILABLE, "going": Availability.AVAILABLE, "hidden": Availability.AVAILABLE,
        "slow": Availability.TIMEOUT, "ghost": Availability.NOT_LISTED,
    }
    assert s1["hidden"].listed is False and s1["alive"].listed is True and s1["ghost"].http_status == 404
    assert s1["slow"].latency_ms >= 400  # gave up at the 0.5 s total deadline, elapsed time kept
    going = {r.model: r for r in second}["going"]
    assert going.status is Availability.RETIRED and going.http_status == 410
    assert going.retired_on == "2026-08-01" and going.reference == "RET-0042"

    # stored by check date, one row per model and check
    assert store.dataset.partitions() == [DAY1.date(), DAY2.date()]
    assert store.read().num_rows == 10
    lines = {t.model: t for t in store.timelines()}
    g = lines["going"]
    assert (g.first_seen, g.last_available, g.first_missing) == (DAY1.date(), DAY1.date(), DAY2.date())
    assert g.retired_on == "2026-08-01" and g.latest_status is Availability.RETIRED
    assert lines["alive"].first_missing is None and lines["alive"].last_available == DAY2.date()
    assert lines["ghost"].first_seen is None and lines["ghost"].first_missing == DAY1.date()
    assert set(store.unavailable_models()) == {"going", "ghost"}


def test_auth_and_connection_failures(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    with start_background(_config(api_key="sim-secret-key")) as sim:
        wrong = check_availability([_target(sim.base_url, "alive", key_env="SIM_KEY")], None,
                                   now=lambda: DAY1, secrets={"SIM_KEY": "not-the-key"}, settings=FAST)
        right = check_availability([_target(sim.base_url, "alive", key_env="SIM_KEY")], None,
                                   now=lambda: DAY1, secrets={"SIM_KEY": "sim-secret-key"}, settings=FAST)
    assert wrong[0].status is Availability.AUTH_ERROR and wrong[0].listed is None
    assert "sim-secret-key" not in (wrong[0].message or "") and "not-the-key" not in (wrong[0].message or "")
    assert right[0].status is Availability.AVAILABLE
    dead = check_availability([_target(f"http://127.0.0.1:{dead_port}", "alive")], None,
                              now=lambda: DAY1, secrets={}, settings=FAST)
    assert dead[0].status is Availability.ERROR and "connect" in (dead[0].message or "")


def test_scheduled_stem_is_idempotent(tmp_path: Path) -> None:
    store = AvailabilityStore(tmp_path / "data", fsync=False)
    with start_background(_config()) as sim:
        for _ in range(2):  # two runs of the same interval: the second publishes nothing
            check_availability([_target(sim.base_url, "alive")], store, now=lambda: DAY1, secrets={},
                               settings=FAST, stem="scheduled-20260901T0600")
    assert store.read().num_rows == 1


def test_artifact_import(tmp_path: Path, artifact_dir: Path) -> None:
    data = tmp_path / "data"
    result = import_availability_artifact(artifact_dir, data, now=lambda: DAY1)
    assert result.availability_rows == 15 and result.probe_rows == 22 and not result.notes
    store = AvailabilityStore(data)
    rows = {r["model"]: r for r in store.read().to_pylist()}
    assert sum(r["status"] == "retired" for r in rows.values()) == 10 == len(result.retired_models)
    gemma = rows["gemma3:12b"]
    assert gemma["retired_on"] == "2026-07-15" and gemma["reference"] == "9a2ba1b0-727f-4057-9098-1765d64aaf9e"
    assert rows["glm-4.6"]["retired_on"] == "2026-06-16"
    assert rows["gpt-oss:20b"]["status"] == "available" and rows["gpt-oss:20b"]["study_role"] == "reported in Table 1"
    assert {r["check_date"] for r in rows.values()} == {dt.date(2026, 8, 17)}
    t = {x.model: x for x in store.timelines()}
    assert t["gemma3:12b"].first_missing == dt.date(2026, 8, 17) and t["gemma3:12b"].first_seen is None
    probes = ProbeStore(data).read(campaigns=["study-probe-2026-08-17"])
    assert probes.num_rows == 22
    again = import_availability_artifact(artifact_dir, data, now=lambda: DAY2)
    assert again.availability_rows == 0 and store.read().num_rows == 15
    assert ProbeStore(data).read().num_rows == 22


@pytest.mark.parametrize("missing", ["model_availability.csv", "failure_attribution.csv"])
def test_artifact_import_reports_missing_files(tmp_path: Path, artifact_dir: Path, missing: str) -> None:
    fake = tmp_path / "artifact" / "results"
    fake.mkdir(parents=True)
    for name in ("model_availability.csv", "failure_attribution.csv"):
        if name != missing:
            (fake / name).write_bytes((artifact_dir / "results" / name).read_bytes())
    result = import_availability_artifact(tmp_path / "artifact", tmp_path / "data", now=lambda: DAY1)
    assert len(result.notes) == 1 and missing in result.notes[0]


def test_cli_commands(tmp_path: Path, artifact_dir: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from orchestrator.cli.ops import availability_app, probe_command

    app = typer.Typer()
    app.command("probe")(probe_command)
    app.add_typer(availability_app, name="availability")
    runner = CliRunner()
    for args in (["probe", "--help"], ["availability", "check", "--help"], ["availability", "history", "--help"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 0 and "Example: irbench" in res.output, res.output
    data = tmp_path / "data"
    empty = runner.invoke(app, ["availability", "history", "--data", str(data)])
    assert empty.exit_code == 0 and "no availability checks" in empty.output
    import_availability_artifact(artifact_dir, data, now=lambda: DAY1)
    hist = runner.invoke(app, ["availability", "history", "--data", str(data), "--models", "gemma3:12b,gpt-oss:20b"])
    assert hist.exit_code == 0, hist.output
    assert "2026-07-15" in hist.output and "gpt-oss:20b" in hist.output and "glm-4.6" not in hist.output
    bad = runner.invoke(app, ["availability", "check", "--data", str(data), "--models", "x"])
    assert bad.exit_code == 2 and "--base-url" in bad.output
    with start_background(_config()) as sim:
        ok = runner.invoke(app, ["availability", "check", "--data", str(data), "--models", "alive,ghost",
                                 "--base-url", sim.base_url, "--timeout", "10"])
    assert ok.exit_code == 0, ok.output
    assert "available" in ok.output and "not_listed" in ok.output
    assert AvailabilityStore(data).read(sources=["check"]).num_rows == 2


def test_beat_one_check_per_interval_with_two_beats(tmp_path: Path) -> None:
    """Real redis-server, a real Celery worker and two real beat processes against the simulator."""
    import json
    import os
    import subprocess
    import sys
    import time

    import redis

    from deploy.redis_server import RedisServer
    from workers.celery.availability_tasks import LOCK_PREFIX, slot_of, targets_to_json

    interval_s = 2.0
    data = tmp_path / "data"
    celery = [sys.executable, "-m", "celery", "-A", "orchestrator.distributed.worker_app"]
    cfg = SimConfig(models={"alive": SimModel(), "switch": SimModel(retired_after_requests=2, retired_on="2026-08-01",
                                                                    retirement_reference="RET-9")})
    procs: list[subprocess.Popen] = []
    with RedisServer() as srv, start_background(cfg) as sim:
        targets = tmp_path / "targets.json"
        targets.write_text(json.dumps(targets_to_json([_target(sim.base_url, "alive", "switch")])))
        env = {**os.environ, "IRBENCH_BROKER_URL": srv.url, "IRBENCH_DATA": str(data),
               "IRBENCH_AVAILABILITY_TARGETS": str(targets), "IRBENCH_AVAILABILITY_INTERVAL_S": str(interval_s)}
        logs = []
        try:
            log = open(tmp_path / "worker.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(celery + ["worker", "-P", "threads", "-c", "2", "-Q", "irbench",
                                                    "--without-gossip", "--without-mingle", "--without-heartbeat",
                                                    "--loglevel", "INFO"], cwd=tmp_path, env=env, stdout=log,
                                                   stderr=subprocess.STDOUT))
            for k in (1, 2):
                log = open(tmp_path / f"beat{k}.log", "w")
                logs.append(log)
                procs.append(subprocess.Popen(celery + ["beat", "-s", str(tmp_path / f"beat{k}-schedule"),
                                                        "--pidfile", str(tmp_path / f"beat{k}.pid"), "--loglevel", "INFO"],
                                                       cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT))
            store = AvailabilityStore(data, fsync=False)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if store.dataset.partitions() and len(set(store.read().column("checked_at").to_pylist())) >= 4:
                    break
                assert all(p.poll() is None for p in procs), "a celery process died; see the logs in tmp_path"
                time.sleep(0.5)
        finally:
            for p in procs[1:]:
                stop_process(p, 10.0)
            time.sleep(1.0)  # let the worker finish a check it already took
            stop_process(procs[0], 10.0)
            for log in logs:
                log.close()
        skipped = int(redis.Redis.from_url(srv.url).get(f"{LOCK_PREFIX}skipped") or 0)
    sends = [(tmp_path / f"beat{k}.log").read_text().count("Sending due task") for k in (1, 2)]
    rows = AvailabilityStore(data).read(sources=["check"]).to_pylist()
    checks: dict[dt.datetime, list[dict]] = {}
    for r in rows:
        checks.setdefault(r["checked_at"], []).append(r)
    slots = [slot_of(t, interval_s) for t in checks]
    assert len(checks) >= 4 and len(slots) == len(set(slots)), f"two checks in one interval: {sorted(slots)}"
    assert all(sorted(r["model"] for r in rs) == ["alive", "switch"] for rs in checks.values())
    assert min(sends) >= 2, f"both beats must have sent (sends per beat: {sends})"
    assert len(checks) < sum(sends) and skipped >= 1  # the second beat's messages were refused
    switch = [r for t in sorted(checks) for r in checks[t] if r["model"] == "switch"]
    assert [r["status"] for r in switch[:3]] == ["available", "available", "retired"]
    assert switch[2]["retired_on"] == "2026-08-01" and switch[2]["reference"] == "RET-9"
