"""`irbench run --retry-failed`: the runs whose latest execution failed transiently run again,
earlier executions stay stored, and status says how many are retryable. Counted on both sides:
the calls the simulated endpoint received and the executions the store holds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from orchestrator.campaign.prepared import prepare
from orchestrator.campaign.retry import parse_outcomes, retryable
from storage.outcomes import RERUN_BY_DEFAULT
from orchestrator.campaign.spec import load_campaign
from simulator.config import SimConfig, SimModel
from simulator.server import start_background
from storage.records import Outcome
from orchestrator.campaign.outcome import ALL_FAILED_EXIT_CODE, SOME_FAILED_EXIT_CODE
from storage.runs import RunStore
from workers.errors import ConfigError
from deploy.processes import free_port
from tests.support.cli import run_cli

IRBENCH = [sys.executable, "-m", "orchestrator.cli.app"]
PROMPTS = Path(__file__).resolve().parents[2] / "examples" / "prompts"
N_PROMPTS = 12


def _irbench(*args: str) -> subprocess.CompletedProcess:
    out = run_cli([*args, "--no-progress"] if args[0] == "run" else args, timeout_s=180,
                  env={**os.environ, "COLUMNS": "250"})
    assert "Traceback" not in out.stderr, out.stderr
    return out


def _requests(base_url: str, model: str) -> int:
    with urllib.request.urlopen(f"{base_url}/_stats") as resp:
        stats = json.load(resp)
    return int(stats.get("models", stats).get(model, {}).get("requests", 0))


def _campaign(tmp_path: Path, port: int, models: dict[str, str]) -> Path:
    path = tmp_path / "retry.toml"
    body = "".join(f"[models.{m}]\n{extra}\n" for m, extra in models.items())
    path.write_text(f'name = "retry-demo"\nruns = 2\n[corpus]\npaths = ["{PROMPTS}"]\n'
                    f'[endpoints.sim]\nbase_url = "http://127.0.0.1:{port}"\n'
                    f'[defaults]\nconnect_timeout_s = 2\ntotal_timeout_s = 20\n'
                    f'[retry]\nmax_attempts = 1\n{body}')
    return path


def test_endpoint_down_then_up_retry_executes_each_failed_run_once_more(tmp_path: Path) -> None:
    port = free_port()
    campaign = _campaign(tmp_path, port, {"sim-a": ""})
    data = tmp_path / "data"
    planned = 2 * N_PROMPTS
    first = _irbench("run", str(campaign), "--data", str(data))  # nothing listens: connect_error
    assert first.returncode == ALL_FAILED_EXIT_CODE, first.stderr
    store = RunStore(data)
    assert store.count_by_outcome("retry-demo") == {"connect_error": planned}

    status = _irbench("status", str(campaign), "--data", str(data))
    text = " ".join(status.stdout.split())
    assert f"{planned} runs retryable (latest execution connect_error {planned})" in text
    assert f"irbench run {campaign} --data {data} --retry-failed" in text

    with start_background(SimConfig(models={"sim-a": SimModel()}), port=port) as sim:
        plain = _irbench("run", str(campaign), "--data", str(data))  # a plain re-run keeps failures
        assert plain.returncode == ALL_FAILED_EXIT_CODE and _requests(sim.base_url, "sim-a") == 0
        again = _irbench("run", str(campaign), "--data", str(data), "--retry-failed")
        assert again.returncode == 0, again.stderr
        assert _requests(sim.base_url, "sim-a") == planned  # each failed run called exactly once
        assert f"{planned} retried (latest execution: connect_error {planned}), {planned} executed now" in " ".join(
            again.stdout.split())
        executions = store.read_executions(campaigns=["retry-demo"], columns=["run_id", "outcome"])
        assert executions.num_rows == 2 * planned  # the failed executions stay stored as history
        assert sorted(executions.column("outcome").to_pylist()) == ["connect_error"] * planned + ["ok"] * planned
        assert store.count_by_outcome("retry-demo") == {"ok": planned}  # readers use the latest
        once_more = _irbench("run", str(campaign), "--data", str(data), "--retry-failed")
        assert once_more.returncode == 0 and _requests(sim.base_url, "sim-a") == planned  # nothing left to retry
    assert "retryable" not in _irbench("status", str(campaign), "--data", str(data)).stdout


def test_only_the_chosen_classes_are_retried(tmp_path: Path) -> None:
    cfg = SimConfig(seed=3, models={"sim-flaky": SimModel(server_error_prob=0.4), "sim-ok": SimModel()})
    with start_background(cfg) as sim:
        campaign = _campaign(tmp_path, sim.port, {"sim-flaky": "", "sim-ok": ""})
        data = tmp_path / "data"
        assert _irbench("run", str(campaign), "--data", str(data)).returncode == SOME_FAILED_EXIT_CODE
        store = RunStore(data)
        prepared = prepare(load_campaign(campaign))
        failed = retryable(prepared, store).by_outcome.get("server_error", 0)
        assert failed > 0 and retryable(prepared, store).total == failed
        calls = _requests(sim.base_url, "sim-flaky")
        assert calls == 2 * N_PROMPTS

        none = _irbench("run", str(campaign), "--data", str(data), "--retry-failed", "--outcomes", "rate_limited,timeouts")
        assert none.returncode == SOME_FAILED_EXIT_CODE and _requests(sim.base_url, "sim-flaky") == calls
        rounds = 0
        while (left := retryable(prepared, store).total) and rounds < 20:
            before = _requests(sim.base_url, "sim-flaky")
            code = _irbench("run", str(campaign), "--data", str(data), "--retry-failed").returncode
            assert _requests(sim.base_url, "sim-flaky") - before == left  # exactly the retryable runs
            assert code == (SOME_FAILED_EXIT_CODE if retryable(prepared, store).total else 0)
            rounds += 1
        assert retryable(prepared, store).total == 0
        total_calls = _requests(sim.base_url, "sim-flaky") + _requests(sim.base_url, "sim-ok")
        executions = store.read_executions(campaigns=["retry-demo"], columns=["run_id"])
        assert executions.num_rows == total_calls  # one execution stored per call received
        assert _requests(sim.base_url, "sim-ok") == 2 * N_PROMPTS  # never retried: all ok


def test_outcome_names_and_groups() -> None:
    assert parse_outcomes(None) == RERUN_BY_DEFAULT
    assert parse_outcomes("timeouts") == {Outcome.TIMEOUT_CONNECT, Outcome.TIMEOUT_READ, Outcome.TIMEOUT_TOTAL}
    assert parse_outcomes("auth_error, rate_limited") == {Outcome.AUTH_ERROR, Outcome.RATE_LIMITED}
    with pytest.raises(ConfigError, match="unknown class"):
        parse_outcomes("rate-limited")
    with pytest.raises(ConfigError, match="not failures"):
        parse_outcomes("ok")


def test_outcomes_without_retry_failed_is_a_user_error(tmp_path: Path) -> None:
    campaign = _campaign(tmp_path, free_port(), {"sim-a": ""})
    out = _irbench("run", str(campaign), "--data", str(tmp_path / "d"), "--outcomes", "rate_limited")
    assert out.returncode == 2 and "--retry-failed" in out.stderr


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_retry_failed_on_the_celery_executor_with_a_real_worker(tmp_path: Path) -> None:
    """Endpoint down: every run is connect_error; endpoint up + --retry-failed on real `irbench
    worker` processes (deploy.celery_workers): each failed run is called once more, both executions are stored, and
    `status --broker` shows nothing left to retry."""
    from tests.support.workers import CeleryWorkers
    from deploy.redis_server import RedisServer

    port = free_port()
    campaign = _campaign(tmp_path, port, {"sim-a": ""})
    data = tmp_path / "data"
    planned = 2 * N_PROMPTS
    with RedisServer() as redis_srv, CeleryWorkers(redis_srv.url, count=1):
        env = {**os.environ, "IRBENCH_BROKER_URL": redis_srv.url, "COLUMNS": "250"}

        def celery(*args: str, code: int = 0) -> subprocess.CompletedProcess:
            out = run_cli(["run", str(campaign), "--data", str(data), "--executor", "celery", "--no-progress", "--no-analyze", *args], env=env, timeout_s=240)
            assert out.returncode == code and "Traceback" not in out.stderr, out.stderr
            return out

        first = celery(code=ALL_FAILED_EXIT_CODE)
        assert f"{planned} executed now" in " ".join(first.stdout.split())
        store = RunStore(data)
        assert store.count_by_outcome("retry-demo") == {"connect_error": planned}
        with start_background(SimConfig(models={"sim-a": SimModel()}), port=port) as sim:
            plain = celery(code=ALL_FAILED_EXIT_CODE)
            assert "0 executed now" in " ".join(plain.stdout.split()) and _requests(sim.base_url, "sim-a") == 0
            again = celery("--retry-failed")
            text = " ".join(again.stdout.split())
            assert f"{planned} retried (latest execution: connect_error {planned}), {planned} executed now" in text
            assert _requests(sim.base_url, "sim-a") == planned
            executions = store.read_executions(campaigns=["retry-demo"], columns=["outcome"])
            assert sorted(executions.column("outcome").to_pylist()) == ["connect_error"] * planned + ["ok"] * planned
            assert store.count_by_outcome("retry-demo") == {"ok": planned}
            status = run_cli(["status", str(campaign), "--data", str(data)], env=env, timeout_s=120)
            assert "retryable" not in status.stdout and f"{planned}/{planned} runs stored" in " ".join(status.stdout.split())
            assert _requests(sim.base_url, "sim-a") == planned
            live = run_cli(["status", str(campaign), "--data", str(data), "--broker", redis_srv.url], env=env, timeout_s=120)
            flat = " ".join(live.stdout.split())
            assert live.returncode == 0 and "runs finished in the last 120 s" in flat, live.stdout + live.stderr
            assert re.search(rf"sim-a │ 0 │ {2 * planned} │ [\d.]+ │ 0 │ 0:00:00", flat), flat  # both executions, just now


def test_a_run_whose_worker_died_is_retryable_and_resumed_by_a_plain_run(tmp_path: Path) -> None:
    """``worker_died`` (what a recovered spool stores for a call in flight at a SIGKILL) is a
    retryable failure for ``status``, and the same ``irbench run`` again executes such a run,
    as it does a cancelled one; the store keeps both executions."""
    import datetime as dt

    from storage.records import Attempt
    from workers.execute import DIED_TEXT, worker_error_record

    port = free_port()
    campaign = _campaign(tmp_path, port, {"sim-a": ""})
    data = tmp_path / "d"
    with start_background(SimConfig(models={"sim-a": SimModel(latency_ms_median=1)}), port=port) as sim:
        assert _irbench("run", str(campaign), "--data", str(data)).returncode == 0
        store, prepared = RunStore(data), prepare(load_campaign(campaign))
        victims = prepared.tasks[:2]
        now = dt.datetime.now(dt.timezone.utc)
        died = [worker_error_record(t, "").model_copy(update={
            "outcome": Outcome.WORKER_DIED, "cancel_reason": None, "finished_at": now,
            "attempts": [Attempt(attempt=1, outcome=Outcome.WORKER_DIED, started_at=now, latency_ms=0.0,
                                 error=DIED_TEXT)]}) for t in victims]
        store.write(died)
        status = _irbench("status", str(campaign), "--data", str(data))
        assert "2 runs retryable (latest execution worker_died 2)" in status.stdout, status.stdout
        calls = _requests(sim.base_url, "sim-a")
        again = _irbench("run", str(campaign), "--data", str(data))  # no --retry-failed
        assert again.returncode == 0, again.stderr
        assert _requests(sim.base_url, "sim-a") == calls + 2
    latest = {r.run_id: r.outcome for r in store.read_records()}
    assert set(latest.values()) == {Outcome.OK} and len(latest) == len(prepared.tasks)
    assert len(store.read_executions(columns=["run_id"])) == len(prepared.tasks) + 4  # ok, died, ok again
