"""A stalled broker is said, on both sides: a real redis-server stopped (SIGSTOP) mid-campaign
makes the orchestrator (stderr) and the worker (its log) each print one line within
``IRBENCH_BROKER_WARN_S`` plus a poll, and one line once it answers again (SIGCONT); the
campaign then finishes with every run stored once and every call an attempt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.workers import CeleryWorkers
from deploy.redis_server import RedisServer
from simulator.config import SimModel
from storage.runs import RunStore
from tests.support.distributed import WORKER_ENV, executions_per_run, make_campaign, sim, stats, wait_for
from tests.support import forked

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
WARN_S = 2.0
STALL_S = 6.0
BOUND_S = WARN_S + 2.0  # the threshold, a ping timeout and a poll
UNREACHABLE, BACK = "has not answered for", "answers again after"


def _worker_lines(workers: CeleryWorkers, text: str) -> int:
    return workers.log_path(0).read_text(errors="replace").count(text)


def test_stopped_redis_is_said_on_both_sides_and_the_campaign_completes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    model = "stall-a"
    env = {**WORKER_ENV, "IRBENCH_DATA": str(data), "IRBENCH_BROKER_WARN_S": str(WARN_S)}
    with RedisServer() as srv, sim({model: SimModel(latency_ms_median=300, latency_sigma=0.05)}) as s, \
            CeleryWorkers(srv.url, count=1, concurrency=2, env=env) as workers:
        campaign = make_campaign(tmp_path, "stall", s.base_url, {model: {"max_concurrency": 2}}, prompts=4, runs=6)
        proc = forked.popen(
            [sys.executable, "-m", "orchestrator.cli.app", "run", str(campaign), "--data", str(data),
             "--executor", "celery", "--broker", srv.url, "--no-progress", "--no-analyze"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
            env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "IRBENCH_BROKER_WARN_S": str(WARN_S)},
        )
        seen: list[tuple[float, str]] = []  # (monotonic time, line) of the orchestrator's stderr
        reader = threading.Thread(target=lambda: seen.extend((time.monotonic(), ln) for ln in proc.stderr or ()),
                                  daemon=True)
        reader.start()
        try:
            wait_for(lambda: stats(s.base_url).get(model, {}).get("requests", 0) >= 2, 30, "calls made")
            assert _worker_lines(workers, UNREACHABLE) == 0 and not any(UNREACHABLE in ln for _, ln in seen)
            srv.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            try:
                wait_for(lambda: _worker_lines(workers, UNREACHABLE) == 1, BOUND_S, "the worker says so")
                wait_for(lambda: any(UNREACHABLE in ln for _, ln in seen), BOUND_S, "the orchestrator says so")
                said = next(t for t, ln in seen if UNREACHABLE in ln)
                assert WARN_S - 0.5 <= said - stopped <= BOUND_S
                time.sleep(max(STALL_S - (time.monotonic() - stopped), 0.0))
            finally:
                srv.send_signal(signal.SIGCONT)
            resumed = time.monotonic()
            wait_for(lambda: _worker_lines(workers, BACK) == 1, BOUND_S, "the worker says it is back")
            wait_for(lambda: any(BACK in ln for _, ln in seen), BOUND_S, "the orchestrator says it is back")
            assert next(t for t, ln in seen if BACK in ln) - resumed <= BOUND_S
            rc = proc.wait(90)
        finally:
            if proc.poll() is None:
                proc.kill()
        reader.join(5)
        out = proc.stdout.read() if proc.stdout else ""
        calls = stats(s.base_url)[model]["requests"]
        log = workers.log_path(0).read_text(errors="replace")
    err = "".join(ln for _, ln in seen)
    assert rc == 0, (out, err)
    # one line each way per stall, no more
    assert err.count(UNREACHABLE) == 1 and err.count(BACK) == 1, err
    assert log.count(UNREACHABLE) == 1 and log.count(BACK) == 1
    assert "Redis at 127.0.0.1:" in err and "worker w0-1@" in log
    execs = executions_per_run(RunStore(data))
    assert len(execs) == 24 and set(execs.values()) == {1}, execs  # every run stored once
    recs = RunStore(data).read_records(campaigns=["stall"])
    assert sum(len(r.attempts) for r in recs) == calls  # every call an attempt
