"""The distributed path's user errors, with a real redis-server and real worker processes:
Redis down (a countdown, then one line), no worker consuming the queue (a warning within 15 s
naming the command), and a worker whose --data is another store (named, nothing dispatched)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from tests.support.workers import CeleryWorkers
from deploy.local_cluster import free_port
from deploy.redis_server import RedisServer
from tests.support.distributed import wait_for
from tests.support.campaign_files import one_endpoint, write_campaign
from tests.support.scripted_server import scripted_server
from tests.support.terminal import with_default_sigint
from workers.state.presence import read_presence
from tests.support import forked

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "orchestrator.cli.app"]


def _campaign(tmp_path: Path, base_url: str) -> Path:
    return write_campaign(tmp_path, "dist-errors", one_endpoint(base_url), runs=3)


def _env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), **extra}


@pytest.mark.parametrize("verb", ["run", "status"])
def test_redis_down_counts_down_then_one_line(tmp_path: Path, verb: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    args = ["--executor", "celery"] if verb == "run" else []
    t0 = time.monotonic()
    proc = subprocess.run(
        [*CLI, verb, str(_campaign(tmp_path, "http://127.0.0.1:9")), "--data", str(tmp_path / "data"),
         "--broker", url, "--broker-wait-s", "2", *args],
        capture_output=True, timeout=60, cwd=REPO, env=_env(),  # bytes: text mode turns a \r into \n
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2
    stderr = proc.stderr.decode()
    lines = stderr.rstrip("\n").split("\n")  # a \r redraw stays on its line
    assert len(lines) == 1 and "Traceback" not in stderr
    assert "waiting for Redis" in lines[0] and "s left" in lines[0]  # the countdown was drawn...
    last = lines[0].split("\r")[-1]  # ...and erased: the error is what remains on the line
    assert last.startswith("error: cannot reach Redis at " + url) and "start it" in last
    assert 2.0 <= elapsed < 30
    assert not (tmp_path / "data" / "runs").exists()


def test_no_worker_warns_within_15_s_with_the_command(tmp_path: Path) -> None:
    with RedisServer() as srv, scripted_server() as sim:
        data = tmp_path / "data"
        proc = forked.popen(  # with the Ctrl-C a terminal delivers, even when pytest runs with SIGINT ignored
            with_default_sigint([*CLI, "run", str(_campaign(tmp_path, sim.base_url)), "--data", str(data),
                                 "--executor", "celery", "--broker", srv.url, "--no-progress", "--no-analyze"]),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, env=_env(),
        )
        t0, lines = time.monotonic(), []
        reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
        reader.start()
        try:
            while time.monotonic() - t0 < 15 and not any("warning: no worker" in line for line in list(lines)):
                time.sleep(0.2)
            waited = time.monotonic() - t0
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            finally:
                if proc.poll() is None:  # not left running after a failed wait
                    proc.kill()
                    proc.wait()
            reader.join(5)
        seen = "".join(lines)
        assert "warning: no worker is consuming queue 'irbench'" in seen, seen
        assert f"irbench worker --broker {srv.url} --data {data.resolve()}" in seen
        assert waited < 15
        client = redis.Redis.from_url(srv.url)
        from workers.state.broker_view import waiting_ids

        assert len(waiting_ids(client, "irbench")) == 3  # the runs did wait in the queue (in any number of messages)
        assert sim.received == []  # and nothing reached the endpoint
        assert "Traceback" not in seen


def test_worker_on_another_store_is_named_and_nothing_dispatched(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    with RedisServer() as srv, scripted_server() as sim, CeleryWorkers(
        srv.url, count=1, concurrency=2, env={"IRBENCH_DATA": str(other), "IRBENCH_PRESENCE_INTERVAL_S": "0.5"}
    ):
        wait_for(lambda: read_presence(redis.Redis.from_url(srv.url)), 30, "the worker's first presence")
        data = tmp_path / "data"
        proc = subprocess.run(
            [*CLI, "run", str(_campaign(tmp_path, sim.base_url)), "--data", str(data), "--executor", "celery",
             "--broker", srv.url, "--no-progress", "--no-analyze"],
            capture_output=True, text=True, timeout=60, cwd=REPO, env=_env(),
        )
        client = redis.Redis.from_url(srv.url)
        assert client.llen("irbench") == 0  # nothing dispatched
    assert proc.returncode == 2, proc.stderr
    stderr = proc.stderr
    lines = stderr.rstrip("\n").split("\n")  # a \r redraw stays on its line
    assert len(lines) == 1 and "Traceback" not in stderr
    assert f"stores runs under {other.resolve()}" in lines[0] and str(data.resolve()) in lines[0]
    assert "irbench worker --broker" in lines[0]
    assert sim.received == []
    assert not list((data / "runs").rglob("*.parquet")) if (data / "runs").exists() else True


def test_worker_on_the_same_store_runs_the_campaign(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with RedisServer() as srv, scripted_server() as sim, CeleryWorkers(
        srv.url, count=1, concurrency=2, env={"IRBENCH_DATA": str(data), "IRBENCH_PRESENCE_INTERVAL_S": "0.5"}
    ):
        proc = subprocess.run(
            [*CLI, "run", str(_campaign(tmp_path, sim.base_url)), "--data", str(data), "--executor", "celery",
             "--broker", srv.url, "--no-progress", "--no-analyze"],
            capture_output=True, text=True, timeout=90, cwd=REPO, env=_env(IRBENCH_NO_WORKER_WARN_S="3"),
        )
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    assert len(sim.received) == 3
    assert len(list((data / "runs").rglob("*.parquet"))) >= 1
