"""``irbench run`` tells a script how the campaign ended: exit 0 when every planned run is ok, 3 when
some failed, 4 when all did, with one stderr line per failing model (its classes and first error) —
on both executors, counted against what the endpoint received and what the store holds."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.workers import CeleryWorkers
from deploy.processes import free_port
from deploy.redis_server import RedisServer
from orchestrator.campaign.outcome import ALL_FAILED_EXIT_CODE, SOME_FAILED_EXIT_CODE
from simulator.config import SimConfig, SimModel
from simulator.server import RunningSimulator, start_background
from storage.runs import RunStore
from tests.support.campaign_files import write_campaign
from tests.support.cli import run_cli

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "orchestrator.cli.app"]
RUNS, PROMPTS = 2, 2


@pytest.fixture
def sim() -> Iterator[RunningSimulator]:
    with start_background(SimConfig(seed=3, models={"steady": SimModel(latency_ms_median=1)})) as s:
        yield s


def _campaign(tmp_path: Path, base_url: str, models: list[str]) -> Path:
    body = f'[retry]\nmax_attempts = 1\n[endpoints.s]\nbase_url = "{base_url}"\n'
    body += "".join(f"[models.{m}]\n" for m in models)
    return write_campaign(tmp_path, "exits", body, runs=RUNS, prompts=PROMPTS)


def _run(campaign: Path, data: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRBENCH_")}
    return run_cli(["run", str(campaign), "--data", str(data), "--no-progress", *extra], env=env, cwd=REPO, timeout_s=120)


def _outcomes(data: Path) -> dict[str, list[str]]:
    table = RunStore(data).read_table(campaigns=["exits"], columns=["model", "outcome"])
    out: dict[str, list[str]] = {}
    for model, outcome in zip(table.column("model").to_pylist(), table.column("outcome").to_pylist()):
        out.setdefault(model, []).append(outcome)
    return out


def test_every_run_ok_exits_0(tmp_path: Path, sim: RunningSimulator) -> None:
    proc = _run(_campaign(tmp_path, sim.base_url, ["steady"]), tmp_path / "data")
    assert proc.returncode == 0, proc.stderr
    assert "failed:" not in proc.stderr
    assert _outcomes(tmp_path / "data") == {"steady": ["ok"] * RUNS * PROMPTS}
    assert sim.app.state.model_requests["steady"] == RUNS * PROMPTS


def test_an_unreachable_host_exits_4_and_names_the_class(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    proc = _run(_campaign(tmp_path, url, ["steady"]), tmp_path / "data")
    assert proc.returncode == ALL_FAILED_EXIT_CODE, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("failed: ")]
    assert len(lines) == 1 and lines[0].startswith(f"failed: steady: {RUNS * PROMPTS}/{RUNS * PROMPTS} runs failed "
                                                   "(connect_error 4): ")
    assert "Traceback" not in proc.stderr
    assert _outcomes(tmp_path / "data") == {"steady": ["connect_error"] * RUNS * PROMPTS}


def test_an_unknown_model_beside_a_good_one_exits_3(tmp_path: Path, sim: RunningSimulator) -> None:
    proc = _run(_campaign(tmp_path, sim.base_url, ["steady", "gone"]), tmp_path / "data")
    _assert_some_failed(proc, tmp_path / "data", sim)


def test_the_celery_executor_exits_the_same_way(tmp_path: Path, sim: RunningSimulator) -> None:
    data = tmp_path / "data"
    with RedisServer() as srv, CeleryWorkers(srv.url, count=1, concurrency=2, env={"IRBENCH_DATA": str(data)}):
        proc = _run(_campaign(tmp_path, sim.base_url, ["steady", "gone"]), data,
                    "--executor", "celery", "--broker", srv.url, "--no-analyze")
    _assert_some_failed(proc, data, sim)


def _assert_some_failed(proc: subprocess.CompletedProcess, data: Path, sim: RunningSimulator) -> None:
    assert proc.returncode == SOME_FAILED_EXIT_CODE, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("failed: ")]
    assert len(lines) == 1 and lines[0].startswith("failed: gone: 4/4 runs failed (not_found"), lines
    assert "does not exist" in lines[0]  # the endpoint's own words, the first error
    assert "4/8 planned runs failed" in proc.stderr
    stored = _outcomes(data)
    assert stored["steady"] == ["ok"] * RUNS * PROMPTS
    assert len(stored["gone"]) == RUNS * PROMPTS and "ok" not in stored["gone"]
    # both sides: every ok run was a call the endpoint answered; the unknown model's calls stop
    # once it is disabled, the rest are stored cancelled
    assert sim.app.state.model_requests["steady"] == RUNS * PROMPTS
    assert 1 <= sim.app.state.unknown_requests["gone"] == stored["gone"].count("not_found")


def test_status_does_not_call_an_unknown_models_cancelled_runs_retryable(tmp_path: Path, sim: RunningSimulator) -> None:
    # one call at a time, closed at the first not_found: the rest of its runs are stored cancelled
    body = (f'[retry]\nmax_attempts = 1\ndisable_after_consecutive = 1\n[endpoints.s]\nbase_url = "{sim.base_url}"\n'
            "[models.steady]\n[models.gone]\nmax_concurrency = 1\n")
    campaign, data = write_campaign(tmp_path, "exits", body, runs=RUNS, prompts=PROMPTS), tmp_path / "data"
    assert _run(campaign, data).returncode == SOME_FAILED_EXIT_CODE
    stored = _outcomes(data)["gone"]
    assert "cancelled" in stored and "not_found" in stored  # closed after its first not_found(s)
    status = run_cli(["status", str(campaign), "--data", str(data)], cwd=REPO, timeout_s=120)
    assert status.returncode == 0 and "retryable" not in status.stdout, status.stdout
    calls = sim.app.state.unknown_requests["gone"]
    again = _run(campaign, data, "--retry-failed")  # nothing to retry: no call
    assert "0 executed now" in " ".join(again.stdout.split()) and sim.app.state.unknown_requests["gone"] == calls
    # choosing the class says the model is fixed: its not_found and cancelled runs run again
    chosen = _run(campaign, data, "--retry-failed", "--outcomes", "not_found,cancelled")
    # ... and meet the same wall: one call, the model closed again, the rest cancelled (not work done)
    assert "1 executed now (ok 0, failed 1), 3 cancelled" in " ".join(chosen.stdout.split()), chosen.stdout
