"""The `irbench` command line as a user types it: help, bad input, and the distributed path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.redis_server import RedisServer
from tests.support.cli import run_cli
from tests.support import forked

pytestmark = pytest.mark.slow

IRBENCH = [sys.executable, "-m", "orchestrator.cli.app"]
VERBS = ["run", "status", "resume", "cancel", "worker", "analyze", "compact", "simulate", "demo", "probe"]


def _irbench(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli([*args], env=env, timeout_s=timeout)


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_has_help_with_an_example(verb: str) -> None:
    out = _irbench(verb, "--help")
    assert out.returncode == 0, out.stderr
    assert "Example" in out.stdout and "irbench" in out.stdout


def test_bad_campaign_fails_with_one_line_per_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nruns = 0\n[corpus]\npaths = ["p"]\n[endpoints.e]\nbase_url = "http://h"\n'
                   '[models.m]\nendpoint = "nope"\nmax_tokenz = 5\n')
    out = _irbench("run", str(bad), "--data", str(tmp_path / "d"), "--no-progress")
    assert out.returncode == 2
    text = " ".join(out.stderr.split())
    assert "bad.toml" in text and "runs" in text and "nope" in text and "max_tokenz" in text
    assert "Traceback" not in out.stderr


def test_analyze_on_empty_data_dir_says_what_to_do(tmp_path: Path) -> None:
    out = _irbench("analyze", "--data", str(tmp_path / "nothing"), "--out", str(tmp_path / "o"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "irbench run" in " ".join(out.stderr.split())


def test_distributed_run_through_the_cli(tmp_path: Path, examples_dir: Path) -> None:
    """`irbench worker` + `irbench run --executor celery` + `irbench status --broker`, for real."""
    from simulator.config import load_sim_config
    from simulator.server import start_background

    with RedisServer() as redis, start_background(load_sim_config(examples_dir / "sim.toml")) as sim:
        campaign = tmp_path / "c.toml"
        campaign.write_text(
            (examples_dir / "demo.toml").read_text()
            .replace('paths = ["prompts"]', f'paths = ["{examples_dir / "prompts"}"]')
            .replace("http://127.0.0.1:8765", sim.base_url)
        )
        data = tmp_path / "data"
        env = dict(os.environ, IRBENCH_BROKER_URL=redis.url)
        worker = forked.popen([*IRBENCH, "worker", "--data", str(data), "--concurrency", "8"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        try:
            out = _irbench("run", str(campaign), "--data", str(data), "--executor", "celery", "--no-progress",
                           env=env, timeout=180)
            assert out.returncode == 0, out.stderr
            assert "180 executed now" in " ".join(out.stdout.split())
            status = _irbench("status", str(campaign), "--data", str(data), env=env)
            assert "180/180 runs stored" in status.stdout and "outstanding (dispatched, not done): 0" in status.stdout
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
