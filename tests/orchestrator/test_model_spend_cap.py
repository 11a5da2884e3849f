"""A spend cap on one model, through the CLI on both executors (two workers for celery): that
model stops near its cap (tokens settled under it, within one round of reservations of it) with
its other runs stored ``cancelled`` with the reason naming it, the other model finishes, ``irbench
run`` exits 5 with one line; ``irbench plan`` said beforehand after about how many runs the cap
is reached and says afterwards what was spent; raising the cap and running again finishes the
capped model only, and no run reaches the endpoint twice."""

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
PLANNED = RUNS * PROMPTS  # per model
CAPPED, FREE = "steady", "other"


@pytest.fixture
def sim() -> Iterator[RunningSimulator]:
    models = {CAPPED: SimModel(latency_ms_median=2), FREE: SimModel(latency_ms_median=2)}
    with start_background(SimConfig(seed=5, models=models)) as s:
        yield s


def _campaign(directory: Path, base_url: str, cap_tokens: int | None) -> Path:
    cap = f"max_total_tokens = {cap_tokens}\n" if cap_tokens is not None else ""
    body = (f"[retry]\nmax_attempts = 1\n[defaults]\nmax_tokens = {MAX_TOKENS}\nmax_concurrency = {CONCURRENCY}\n"
            f"[endpoints.s]\nbase_url = \"{base_url}\"\n[models.{CAPPED}]\n{cap}[models.{FREE}]\n")
    directory.mkdir(exist_ok=True)
    return write_campaign(directory, "permodel", body, runs=RUNS, prompts=PROMPTS)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRBENCH_")}
    return run_cli([*args], env=env, cwd=REPO, timeout_s=180)


def _run(campaign: Path, data: Path, *extra: str) -> subprocess.CompletedProcess:
    return _cli("run", str(campaign), "--data", str(data), "--no-progress", *extra)


def _executions(data: Path, model: str) -> list[dict]:
    return RunStore(data).dataset.read(
        filters={"campaign": ["permodel"], "model": [model]}, dedupe="executions",
        columns=["run_id", "outcome", "attempts", "prompt_tokens", "completion_tokens", "cancel_reason"],
    ).to_pylist()


def _tokens(rows: list[dict]) -> int:
    return sum((r["prompt_tokens"] or 0) + (r["completion_tokens"] or 0) for r in rows)


def _called(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["attempts"]]


def _full_tokens(tmp_path: Path, sim: RunningSimulator) -> tuple[int, int]:
    """(the capped model's tokens uncapped, the largest reservation of one of its calls), in-process."""
    data = tmp_path / "full"
    assert _run(_campaign(tmp_path / "f", sim.base_url, None), data).returncode == 0
    rows = _executions(data, CAPPED)
    assert len(rows) == PLANNED and all(r["outcome"] == "ok" for r in rows)
    sim.app.state.model_requests.clear()
    return _tokens(rows), max(r["prompt_tokens"] for r in rows) + MAX_TOKENS


def _cap_check(campaign: Path, data: Path) -> dict:
    proc = _cli("plan", str(campaign), "--data", str(data), "--json")
    assert proc.returncode == 0, proc.stderr
    checks = json.loads(proc.stdout)["caps"]
    assert [(c["scope"], c["limit"]) for c in checks] == [(CAPPED, "max_total_tokens")], checks
    return checks[0]


def _check_stopped(proc: subprocess.CompletedProcess, data: Path, sim: RunningSimulator, cap: int, reserve: int,
                   before: dict) -> None:
    assert proc.returncode == SPEND_CAP_EXIT_CODE, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith(SPEND_CAP_REASON)]
    assert len(lines) == 1 and f"max_total_tokens {cap} of model {CAPPED}" in lines[0], proc.stderr
    rows = _executions(data, CAPPED)
    called = _called(rows)
    assert sim.app.state.model_requests[CAPPED] == len(called) > 0  # both sides: calls = stored executions
    assert cap - (CONCURRENCY + 1) * reserve <= _tokens(called) <= cap  # near the cap, never past it
    # the plan's range held: at least the runs that fit at max_tokens, at most those that fit on prompts alone
    assert before["runs_fit_min"] <= len(called) <= before["runs_fit_max"], (before, len(called))
    cancelled = [r for r in rows if r["outcome"] == "cancelled"]
    assert cancelled and all(r["cancel_reason"].startswith(SPEND_CAP_REASON) and f"model {CAPPED}" in r["cancel_reason"]
                             for r in cancelled)
    assert len(called) + len(cancelled) == PLANNED  # every planned run has a record
    free = _executions(data, FREE)  # the uncapped model is not held back by the other's cap
    assert len(free) == PLANNED and all(r["outcome"] == "ok" for r in free)
    assert sim.app.state.model_requests[FREE] == PLANNED


def _check_resumed(proc: subprocess.CompletedProcess, data: Path, sim: RunningSimulator) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for model in (CAPPED, FREE):
        per_run = Counter(r["run_id"] for r in _called(_executions(data, model)))
        assert len(per_run) == PLANNED and set(per_run.values()) == {1}  # nothing executed twice
        assert sim.app.state.model_requests[model] == PLANNED
    latest = RunStore(data).read_table(campaigns=["permodel"], columns=["outcome"]).column("outcome").to_pylist()
    assert latest == ["ok"] * 2 * PLANNED


def _check_plan_after(campaign: Path, data: Path, cap: int) -> None:
    """After the stop the plan counts the capped model's stored spend and its cancelled runs as to
    run; the text status shows the cap against that spend."""
    after = _cap_check(campaign, data)
    called = _called(_executions(data, CAPPED))
    assert after["spent"] == _tokens(called) and after["cap"] == cap
    assert after["runs_to_run"] == PLANNED - len(called) and not after["within_cap"]
    status = _cli("status", str(campaign), "--data", str(data))
    assert status.returncode == 0, status.stderr
    spent = _tokens(called)
    assert (f"spend cap max_total_tokens {cap:,} tokens of model {CAPPED}: wave 1 spent {spent:,} tokens "
            f"({spent / cap:.0%} of it)") in status.stdout, status.stdout
    assert f"spent in wave 1, {CAPPED}: " in status.stdout and f"spent in wave 1, {FREE}: " in status.stdout


def _stop_then_resume(tmp_path: Path, sim: RunningSimulator, *flags: str) -> None:
    full, reserve = _full_tokens(tmp_path, sim)
    data, cap = tmp_path / "data", full // 2
    campaign = _campaign(tmp_path, sim.base_url, cap)
    before = _cap_check(campaign, data)
    assert before["runs_to_run"] == PLANNED and before["spent"] == 0 and "cap reached after about" in before["verdict"]
    _check_stopped(_run(campaign, data, *flags), data, sim, cap, reserve, before)
    _check_plan_after(campaign, data, cap)
    raised = _campaign(tmp_path, sim.base_url, full * 10)
    _check_plan_text(raised, data, f"of model {CAPPED}: wave 1 spent", "within cap (the upper bound reaches")
    _check_resumed(_run(raised, data, *flags), data, sim)
    _check_plan_text(raised, data, f"of model {CAPPED}: wave 1 spent {_tokens(_executions(data, CAPPED)):,} tokens",
                     "within cap (nothing left to run)")


def _check_plan_text(campaign: Path, data: Path, *phrases: str) -> None:
    """The text plan has one cap line, and it has each phrase."""
    proc = _cli("plan", str(campaign), "--data", str(data))
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("spend cap max_total_tokens")]
    assert len(lines) == 1 and all(p in lines[0] for p in phrases), proc.stdout


def test_local_model_cap_stops_that_model_only_and_resumes_once_raised(tmp_path: Path, sim: RunningSimulator) -> None:
    _stop_then_resume(tmp_path, sim)


def test_celery_model_cap_holds_across_two_workers_and_resumes(tmp_path: Path, sim: RunningSimulator) -> None:
    data = tmp_path / "data"
    with RedisServer() as srv, CeleryWorkers(srv.url, count=2, concurrency=2, env={"IRBENCH_DATA": str(data)}):
        _stop_then_resume(tmp_path, sim, "--executor", "celery", "--broker", srv.url, "--no-analyze")
