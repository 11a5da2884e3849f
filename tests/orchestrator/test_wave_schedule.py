"""Scheduled waves: the schedule lives in a real Redis, a due schedule is handed out once however
many ticks ask, `irbench schedule` adds, lists and removes, bad input is one line (exit 2), and,
end to end, a real beat and worker start the due wave: the simulator receives every planned run
once more and the store holds wave 2."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from deploy.processes import free_port
from simulator.process import stop_process
from deploy.redis_server import RedisServer
from simulator.config import SimConfig, SimModel
from simulator.server import start_background
from storage.runs import RunStore
from storage.waves import list_waves
from orchestrator.jobs.wave_schedule import run_tick
from tests.support.cli import run_irbench
from tests.support.distributed import wait_for
from workers.errors import ConfigError
from workers.state.wave_schedules import WaveSchedule, WaveSchedules, parse_every

pytestmark = pytest.mark.slow

PROMPTS = Path(__file__).resolve().parents[2] / "examples" / "prompts"


@pytest.fixture(scope="module")
def redis_url():
    with RedisServer() as srv:
        yield srv.url


def _schedule(name: str, *, every_s: float = 3600.0, next_due_s: float = 0.0) -> WaveSchedule:
    return WaveSchedule(campaign=name, campaign_path=f"/c/{name}.toml", data="/d", every_s=every_s,
                        next_due_s=next_due_s)


def test_parse_every() -> None:
    assert [parse_every(t) for t in ("7d", "12h", "30m", "90s", "3600", "1w")] == [
        604800.0, 43200.0, 1800.0, 90.0, 3600.0, 604800.0]
    for bad in ("", "soon", "-1d", "0", "nan"):
        with pytest.raises(ConfigError, match="is not a period"):
            parse_every(bad)
    with pytest.raises(ConfigError, match="at least 60 s"):
        _schedule("x", every_s=10)


def test_a_due_wave_is_taken_once_and_missed_periods_are_skipped(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    schedules = WaveSchedules(client, prefix="t-once")
    schedules.put(_schedule("a", every_s=100.0, next_due_s=1000.0))
    schedules.put(_schedule("b", every_s=100.0, next_due_s=5000.0))
    assert schedules.take_due(999.0) == []
    # three periods missed: one wave, and the next is due after now, not three waves late
    (due,) = schedules.take_due(1250.0)
    assert (due.schedule.campaign, due.due_s, due.schedule.next_due_s) == ("a", 1000.0, 1300.0)
    assert schedules.take_due(1250.0) == []  # a second beat at the same moment gets nothing
    assert [s.next_due_s for s in schedules.all()] == [1300.0, 5000.0]
    assert schedules.remove("a") and not schedules.remove("a")
    client.close()


def test_the_tick_launches_each_due_wave_with_the_broker_in_its_environment(redis_url: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis_url)
    schedules = WaveSchedules(client)
    schedules.put(WaveSchedule(campaign="t", campaign_path="/c/t.toml", data=str(tmp_path), every_s=60.0,
                               next_due_s=time.time() - 1))
    launched = []
    result = run_tick(schedules, time.time(), "redis://:pw@h:1/0", lambda argv, log, env: launched.append((argv, log, env)))
    ((argv, log, env),) = launched
    assert result.started == ("t",) and str(log).startswith(str(tmp_path / "schedule" / "t"))
    assert env == {"IRBENCH_BROKER_URL": "redis://:pw@h:1/0"} and "pw" not in " ".join(argv)
    assert run_tick(schedules, time.time(), "redis://h:1/0", lambda *a: launched.append(a)).started == ()
    schedules.remove("t")
    client.close()


def _campaign(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "sched.toml"
    path.write_text(f'name = "sched-demo"\nruns = 1\n[corpus]\npaths = ["{PROMPTS}"]\n'
                    f'[endpoints.sim]\nbase_url = "http://127.0.0.1:{port}"\n'
                    '[defaults]\nconnect_timeout_s = 2\ntotal_timeout_s = 20\n[models.sim-a]\nendpoint = "sim"\n')
    return path


def test_schedule_cli_adds_lists_removes_and_refuses_bad_input(redis_url: str, tmp_path: Path) -> None:
    env = {"IRBENCH_BROKER_URL": redis_url, "COLUMNS": "250"}
    campaign = _campaign(tmp_path, free_port())
    added = run_irbench("schedule", str(campaign), "--every", "7d", "--data", str(tmp_path / "data"), env=env)
    assert added.returncode == 0 and "sched-demo: a new wave every 604800 s" in added.stdout
    listed = run_irbench("schedule", "--list", env=env)
    assert listed.returncode == 0 and "sched-demo" in listed.stdout and str(campaign.resolve()) in listed.stdout
    for bad, says in ((["schedule", str(campaign)], "--every"), (["schedule", str(campaign), "--every", "soon"], "not a period"),
                      (["schedule"], "give one of"), (["schedule", "--remove", "nope"], "no wave schedule")):
        out = run_irbench(*bad, env=env)
        assert out.returncode == 2 and says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert run_irbench("schedule", "--remove", "sched-demo", env=env).returncode == 0
    assert "no wave schedules" in run_irbench("schedule", "--list", env=env).stdout
    down = run_irbench("schedule", "--list", env={"IRBENCH_BROKER_URL": f"redis://:s3cret-pw@127.0.0.1:{free_port()}/0"})
    assert down.returncode == 2 and "cannot reach the broker" in down.stderr and "s3cret-pw" not in down.stderr


@pytest.mark.timeout(180)
def test_beat_starts_the_due_wave_on_the_workers(tmp_path: Path) -> None:
    port, data = free_port(), tmp_path / "data"
    campaign = _campaign(tmp_path, port)
    celery = [sys.executable, "-m", "celery", "-A", "orchestrator.distributed.worker_app"]
    with RedisServer() as srv, start_background(SimConfig(models={"sim-a": SimModel()}), port=port) as sim:
        env = {**os.environ, "IRBENCH_BROKER_URL": srv.url, "IRBENCH_SCHEDULE_TICK_S": "1"}
        first = run_irbench("run", str(campaign), "--data", str(data), "--no-progress", env={})
        assert first.returncode == 0, first.stderr
        planned = RunStore(data).read_table(columns=["run_id"]).num_rows
        client = redis.Redis.from_url(srv.url)
        WaveSchedules(client).put(WaveSchedule(campaign="sched-demo", campaign_path=str(campaign), data=str(data),
                                               every_s=3600.0, next_due_s=time.time()))
        with open(tmp_path / "worker.log", "w") as wlog, open(tmp_path / "beat.log", "w") as blog:
            procs = [subprocess.Popen(celery + ["worker", "-P", "threads", "-c", "4", "-Q", "irbench", "--without-gossip",
                                                "--without-mingle", "--without-heartbeat"], cwd=tmp_path, env=env,
                                      stdout=wlog, stderr=subprocess.STDOUT),
                     subprocess.Popen(celery + ["beat", "-s", str(tmp_path / "beat-schedule")], cwd=tmp_path, env=env,
                                      stdout=blog, stderr=subprocess.STDOUT)]
            try:
                wait_for(lambda: RunStore(data).read_table(waves=[2], columns=["run_id"]).num_rows == planned
                         if [w.wave for w in list_waves(data, "sched-demo")] == [1, 2] else False, 120,
                         "the scheduled wave stored")
            finally:
                for p in procs:
                    stop_process(p, 10.0)
        client.close()
        import json
        import urllib.request
        with urllib.request.urlopen(f"{sim.base_url}/_stats") as resp:
            stats = json.load(resp)
        requests = sum(int(m.get("requests", 0)) for m in stats.get("models", stats).values())
    assert requests == 2 * planned  # the first wave and the scheduled one, each run once
    (log_file,) = (data / "schedule" / "sched-demo").glob("*.log")
    assert "wave 2" in log_file.read_text()  # the wave's own output, where the tick put it
    assert len(list_waves(data, "sched-demo")) == 2  # one wave per period, however many ticks ran
