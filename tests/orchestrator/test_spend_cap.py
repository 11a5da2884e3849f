"""A spend cap set at half a campaign's cost stops it there, on both executors (two workers for
celery): every call the endpoint received is a stored execution, the settled spend stays under
the cap and within one round of reservations of it, the rest is stored ``cancelled`` with the
reason, ``irbench run`` exits 5 with one line; raising the cap and running again finishes the
campaign, and no run reaches the endpoint twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.workers import CeleryWorkers
from deploy.redis_server import RedisServer
from orchestrator.campaign.spend_cap import SPEND_CAP_EXIT_CODE
from simulator.config import SimConfig, SimModel
from simulator.server import RunningSimulator, start_background
from storage.runs import RunStore
from tests.support.campaign_files import write_campaign
from workers.spend import SPEND_CAP_REASON
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "orchestrator.cli.app"]
RUNS, PROMPTS, MAX_TOKENS, CONCURRENCY = 6, 4, 100, 2
USD_IN, USD_OUT = 1.0 / 1e6, 2.0 / 1e6  # per token, as the campaign below prices them


@pytest.fixture
def sim() -> Iterator[RunningSimulator]:
    with start_background(SimConfig(seed=5, models={"steady": SimModel(latency_ms_median=2)})) as s:
        yield s


def _campaign(tmp_path: Path, base_url: str, cap: str) -> Path:
    body = (f"[retry]\nmax_attempts = 1\n[defaults]\nmax_tokens = {MAX_TOKENS}\nmax_concurrency = {CONCURRENCY}\n"
            f"input_usd_per_mtok = 1.0\noutput_usd_per_mtok = 2.0\n[endpoints.s]\nbase_url = \"{base_url}\"\n"
            "[models.steady]\n")
    path = write_campaign(tmp_path, "capped", body, runs=RUNS, prompts=PROMPTS)
    path.write_text(f"{cap}\n{path.read_text()}")  # a top-level key, before the first table
    return path


def _run(campaign: Path, data: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRBENCH_")}
    return run_cli(["run", str(campaign), "--data", str(data), "--no-progress", *extra], env=env, cwd=REPO, timeout_s=180)


def _executions(data: Path) -> list[dict]:
    return RunStore(data).dataset.read(
        filters={"campaign": ["capped"]}, dedupe="executions",
        columns=["run_id", "outcome", "attempts", "prompt_tokens", "completion_tokens", "cancel_reason"],
    ).to_pylist()


def _cost(rows: list[dict]) -> float:
    return sum((r["prompt_tokens"] or 0) * USD_IN + (r["completion_tokens"] or 0) * USD_OUT for r in rows)


def _called(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["attempts"]]


def _full_cost(tmp_path: Path, sim: RunningSimulator) -> tuple[float, float]:
    """(the uncapped campaign's cost, the largest reservation of one call), measured in-process."""
    data = tmp_path / "full"
    (tmp_path / "f").mkdir()
    assert _run(_campaign(tmp_path / "f", sim.base_url, ""), data).returncode == 0
    rows = _executions(data)
    assert len(rows) == RUNS * PROMPTS and all(r["outcome"] == "ok" for r in rows)
    sim.app.state.model_requests.clear()
    reserve = max(r["prompt_tokens"] for r in rows) * USD_IN + MAX_TOKENS * USD_OUT
    return _cost(rows), reserve


def _check_stopped(proc: subprocess.CompletedProcess, data: Path, sim: RunningSimulator, cap: float,
                   reserve: float) -> None:
    assert proc.returncode == SPEND_CAP_EXIT_CODE, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith(SPEND_CAP_REASON)]
    assert len(lines) == 1 and "max_cost_usd" in lines[0] and "raise it" in lines[0], proc.stderr
    rows = _executions(data)
    called = _called(rows)
    assert sim.app.state.model_requests["steady"] == len(called) > 0  # both sides: calls = stored executions
    spent = _cost(called)
    assert spent <= cap  # each reply's usage stayed within its reservation: no overshoot
    assert spent >= cap - (CONCURRENCY + 1) * reserve  # stopped at the cap, not long before it
    cancelled = [r for r in rows if r["outcome"] == "cancelled"]
    assert cancelled and all(r["cancel_reason"].startswith(SPEND_CAP_REASON) for r in cancelled)
    assert len(called) + len(cancelled) == RUNS * PROMPTS  # every planned run has a record


def _check_resumed(proc: subprocess.CompletedProcess, data: Path, sim: RunningSimulator) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _executions(data)
    per_run = Counter(r["run_id"] for r in _called(rows))
    assert len(per_run) == RUNS * PROMPTS and set(per_run.values()) == {1}  # nothing executed twice
    assert sim.app.state.model_requests["steady"] == RUNS * PROMPTS
    latest = RunStore(data).read_table(campaigns=["capped"], columns=["outcome"]).column("outcome").to_pylist()
    assert latest == ["ok"] * RUNS * PROMPTS


def test_local_cap_at_half_stops_there_and_resumes_once_raised(tmp_path: Path, sim: RunningSimulator) -> None:
    full, reserve = _full_cost(tmp_path, sim)
    data = tmp_path / "data"
    cap = full / 2
    campaign = _campaign(tmp_path, sim.base_url, f"max_cost_usd = {cap!r}")
    _check_stopped(_run(campaign, data), data, sim, cap, reserve)
    _check_status_json(campaign, data, cap)
    _check_resumed(_run(_campaign(tmp_path, sim.base_url, f"max_cost_usd = {full * 10!r}"), data), data, sim)


def _check_status_json(campaign: Path, data: Path, cap: float) -> None:
    """``status --json`` says what was spent, per model, in total and per wave, and the cap."""
    proc = run_cli(["status", str(campaign), "--data", str(data), "--json"], cwd=REPO, timeout_s=60)
    assert proc.returncode == 0, proc.stderr
    spend = json.loads(proc.stdout)["spend"]
    rows = _called(_executions(data))
    tokens = sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows)
    assert spend["total"]["total_tokens"] == spend["models"]["steady"]["total_tokens"] == tokens
    assert spend["total"]["cost_usd"] == pytest.approx(_cost(rows))
    assert spend["waves"]["1"]["total"] == spend["total"]
    assert spend["caps"] == {"campaign": {"max_cost_usd": cap}}


def test_celery_cap_holds_across_two_workers_and_resumes(tmp_path: Path, sim: RunningSimulator) -> None:
    full, reserve = _full_cost(tmp_path, sim)
    data = tmp_path / "data"
    cap = full / 2
    with RedisServer() as srv, CeleryWorkers(srv.url, count=2, concurrency=2, env={"IRBENCH_DATA": str(data)}):
        flags = ("--executor", "celery", "--broker", srv.url, "--no-analyze")
        stopped = _run(_campaign(tmp_path, sim.base_url, f"max_cost_usd = {cap!r}"), data, *flags)
        _check_stopped(stopped, data, sim, cap, reserve)
        resumed = _run(_campaign(tmp_path, sim.base_url, f"max_cost_usd = {full * 10!r}"), data, *flags)
        _check_resumed(resumed, data, sim)


def test_a_cost_cap_needs_prices(tmp_path: Path) -> None:
    body = '[endpoints.s]\nbase_url = "http://127.0.0.1:9"\n[models.steady]\n'
    path = write_campaign(tmp_path, "noprice", body, runs=1)
    path.write_text(f"max_cost_usd = 1.0\n{path.read_text()}")
    proc = _run(path, tmp_path / "data")
    assert proc.returncode == 2 and "max_cost_usd: models steady have no input_usd_per_mtok" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
