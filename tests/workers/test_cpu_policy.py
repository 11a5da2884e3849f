"""A worker process runs under ``SCHED_BATCH`` (``IRBENCH_CPU_POLICY``, default ``batch``):
every thread of a real ``celery worker``, as the kernel reports it; ``normal`` leaves them as
they were; a bad value is a one-line error naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.support.workers import CeleryWorkers
from deploy.redis_server import RedisServer
from workers.celery.runtime import WorkerSettings
from workers.cpu_policy import apply_cpu_policy, current_policy
from workers.errors import ConfigError



def _thread_policies(pid: int) -> list[str]:
    return [current_policy(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]


def test_apply_covers_threads_alive_and_those_started_later() -> None:
    code = (
        "import os, threading, time\n"
        "from workers.cpu_policy import apply_cpu_policy, current_policy\n"
        "ev = threading.Event(); threading.Thread(target=ev.wait, daemon=True).start()\n"  # alive before
        "assert apply_cpu_policy('batch')\n"
        "threading.Thread(target=ev.wait, daemon=True).start()\n"  # started after: inherits
        "print(sorted(current_policy(int(t)) for t in os.listdir('/proc/self/task')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True).stdout
    assert out.strip() == str(["batch"] * 3)
    assert current_policy() == "normal"  # this (test) process was not touched


def test_unknown_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="batch, normal"):
        apply_cpu_policy("fifo")
    assert apply_cpu_policy("normal") is False and current_policy() == "normal"  # changes nothing
    with pytest.raises(ConfigError, match="unknown CPU policy 'fast' .IRBENCH_CPU_POLICY"):
        WorkerSettings.from_env("redis://x", {"IRBENCH_CPU_POLICY": "fast"})
    assert WorkerSettings.from_env("redis://x", {"IRBENCH_CPU_POLICY": "normal"}).cpu_policy == "normal"
    assert WorkerSettings(redis_url="redis://x").cpu_policy == "batch"


@pytest.mark.parametrize(("env", "expected"), [({}, "batch"), ({"IRBENCH_CPU_POLICY": "normal"}, "normal")])
def test_a_real_worker_process_runs_under_its_policy(env: dict[str, str], expected: str) -> None:
    with RedisServer() as srv, CeleryWorkers(srv.url, count=1, concurrency=2, env=env) as workers:
        pid = workers.procs[0].pid  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        policies = _thread_policies(pid)
        while set(policies) != {expected} and time.monotonic() < deadline:  # worker_init has run once ready
            time.sleep(0.1)
            policies = _thread_policies(pid)
        assert len(policies) > 1 and set(policies) == {expected}, policies


def test_the_worker_command_refuses_a_bad_policy_in_one_line() -> None:
    from typer.testing import CliRunner

    from orchestrator.cli.app import app

    r = CliRunner().invoke(app, ["worker", "--broker", "redis://127.0.0.1:1/0", "--cpu-policy", "fifo"])
    assert r.exit_code == 2, r.output
    assert "unknown CPU policy 'fifo'" in r.output and "--cpu-policy" in r.output and "Traceback" not in r.output
