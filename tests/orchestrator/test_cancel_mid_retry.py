"""A run stopped while it waits to retry a failed attempt (a 500 or a 429 met, its backoff not
over) has one outcome: ``cancelled``, with ``cancel_reason`` and the attempts it made, never
``server_error`` / ``rate_limited`` next to a ``cancel_reason``. On the local executor the stop
is the spend cap closing the campaign (the steady model spends it); on the celery one it is
``irbench cancel``. Each side is counted: the calls the simulator received are the attempts
stored, ``status`` calls the stopped runs retryable as ``cancelled``, and the same ``irbench
run`` again resumes exactly the cancelled runs, keeping the earlier execution as history."""

from __future__ import annotations

import os
import subprocess
import threading
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.campaign.prepared import prepare
from orchestrator.campaign.spec import load_campaign
from orchestrator.campaign.spend_cap import SPEND_CAP_EXIT_CODE
from orchestrator.distributed.executor import cancel_campaign
from simulator.config import SimModel
from storage.outcomes import RETRIED_WITHIN_RUN
from storage.records import RunRecord
from storage.runs import RunStore
from tests.support.cli import run_cli
from tests.support.distributed import (  # noqa: F401 - fixtures
    Cluster,
    cluster,
    make_campaign,
    settle,
    sim,
    stats,
    wait_for,
)
from tests.support.paths import REPO
from workers.execute import ExecuteSettings
from workers.spend import SPEND_CAP_REASON, reservation_tokens

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

#: every call of ``flaky`` is a 500 and of ``limited`` a 429 asking for RETRY_AFTER_S; a retry waits
#: up to a second (long enough for the stop to land inside the wait), and a second failure ends the run
RETRY_AFTER_S = 1.0
RETRY = {"max_attempts": 2, "backoff_base_s": 1.0, "backoff_cap_s": 1.0}
FAILING = {"flaky": SimModel(server_error_prob=1.0), "limited": SimModel(rate_limit_prob=1.0, retry_after_s=RETRY_AFTER_S)}
HEALTHY = {m: SimModel(latency_ms_median=2) for m in ("flaky", "limited", "steady")}
RETRIED = {o.value for o in RETRIED_WITHIN_RUN}


def _executions(data: Path, campaign: str) -> list[dict]:
    """Every stored execution of ``campaign`` (copies of one counted once)."""
    return RunStore(data).dataset.read(
        filters={"campaign": [campaign]}, dedupe="executions",
        columns=["run_id", "execution_id", "model", "outcome", "attempts", "cancel_reason"],
    ).to_pylist()


def _latest(data: Path, campaign: str) -> dict[str, RunRecord]:
    return {r.run_id: r for r in RunStore(data).read_records(campaigns=[campaign])}


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRBENCH_")}
    return run_cli(list(args), env={**env, "COLUMNS": "250"}, cwd=REPO, timeout_s=90)


def _calls_by_model(*base_urls: str) -> Counter[str]:
    """The calls each model received, over the simulators at ``base_urls``."""
    return sum((Counter({m: v["requests"] for m, v in stats(u).items()}) for u in base_urls), Counter())


def _assert_one_outcome_each(rows: list[dict], calls: Counter[str], failing: tuple[str, ...]) -> list[dict]:
    """No execution has a failure class and a cancel reason; the ``calls`` each model received
    are its stored attempts; returns the executions stopped between attempts (cancelled, with
    attempts), at least one for each model of ``failing``."""
    mixed = [(r["outcome"], r["cancel_reason"]) for r in rows if r["cancel_reason"] and r["outcome"] != "cancelled"]
    assert not mixed, mixed
    attempts: Counter[str] = Counter()
    for r in rows:
        attempts[r["model"]] += len(r["attempts"])
    assert calls == attempts, (calls, attempts)
    caught = [r for r in rows if r["outcome"] == "cancelled" and r["attempts"]]
    for r in caught:
        assert r["cancel_reason"] and [a["outcome"] for a in r["attempts"]][-1] in RETRIED, r
        assert len(r["attempts"]) < RETRY["max_attempts"], r  # stopped before its retry was sent
    assert {r["model"] for r in caught} >= set(failing), Counter(r["model"] for r in caught)
    return caught


def _assert_resumed(out: subprocess.CompletedProcess, data: Path, campaign: str, before: list[dict],
                    calls: Counter[str]) -> None:
    """The re-run executed exactly the runs whose latest execution was cancelled; each has a new
    latest execution, and the stopped one is still stored with its attempts."""
    text = " ".join(out.stdout.split())
    cancelled = {r["run_id"] for r in before if r["outcome"] == "cancelled"}
    n = len(cancelled)
    assert f"{n} retried (latest execution: cancelled {n}), {n} executed now" in text, text
    after = _executions(data, campaign)
    old = {r["execution_id"] for r in before}
    new = [r for r in after if r["execution_id"] not in old]
    assert sorted(r["run_id"] for r in new) == sorted(cancelled)
    assert {r["execution_id"]: r for r in after if r["execution_id"] in old} == {r["execution_id"]: r for r in before}
    latest = _latest(data, campaign)
    assert not [r for r in latest.values() if r.outcome.value == "cancelled"]
    _assert_one_outcome_each(after, calls, ())


def _exit_after_resume(rows: list[dict]) -> int:
    """``irbench run``'s exit once the cancelled runs are resumed on a healthy endpoint: 3 when
    runs that ended in a failure before the stop (a retry sent in time, failed again) remain."""
    return 3 if any(r["outcome"] not in ("ok", "cancelled") for r in rows) else 0


def _calls(base_url: str, model: str) -> int:
    return _calls_by_model(base_url)[model]


def _status(campaign: Path, data: Path, n_cancelled: int) -> None:
    out = _cli("status", str(campaign), "--data", str(data))
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert f"runs retryable (latest execution cancelled {n_cancelled}" in text, text


# ----- local: the spend cap closes the campaign while runs wait to retry ---------------------------


def _capped(path: Path, concurrent: int) -> str:
    """Cap the campaign's tokens at ``concurrent`` reservations of one call (the first calls of
    every model, made together, fit; the steady model's spend passes it a few calls later);
    returns the file's text without the cap."""
    body = path.read_text().replace("[defaults]\n", "[defaults]\nmax_tokens = 100\n")
    path.write_text(body)
    task = prepare(load_campaign(path)).tasks[0]
    tokens = sum(reservation_tokens(task, ExecuteSettings().chars_per_token, ExecuteSettings().assumed_completion_tokens))
    path.write_text(f"max_total_tokens = {concurrent * tokens + tokens // 2}\n{body}")
    return body


def test_local_runs_stopped_between_attempts_are_cancelled_and_resume(tmp_path: Path) -> None:
    spec = {"flaky": {"max_concurrency": 2}, "limited": {"max_concurrency": 2}, "steady": {"max_concurrency": 1}}
    with sim({**FAILING, "steady": SimModel(latency_ms_median=2)}) as s, sim(HEALTHY) as healthy:
        path = make_campaign(tmp_path, "midretry", s.base_url, spec, prompts=4, runs=2, retry=RETRY)
        body = _capped(path, concurrent=5)
        data = tmp_path / "data"
        first = _cli("run", str(path), "--data", str(data), "--no-analyze", "--no-progress")
        assert first.returncode == SPEND_CAP_EXIT_CODE, (first.stdout, first.stderr)
        rows = _executions(data, "midretry")
        caught = _assert_one_outcome_each(rows, _calls_by_model(s.base_url), ("flaky", "limited"))
        assert all(r["cancel_reason"].startswith(SPEND_CAP_REASON) for r in caught)
        _status(path, data, sum(r["outcome"] == "cancelled" for r in rows))
        # the cap lifted and the endpoint recovered: the same command resumes the cancelled runs
        path.write_text(body.replace(s.base_url, healthy.base_url))
        again = _cli("run", str(path), "--data", str(data), "--no-analyze", "--no-progress")
        assert again.returncode == _exit_after_resume(rows), (again.stdout, again.stderr)
        _assert_resumed(again, data, "midretry", rows, _calls_by_model(s.base_url, healthy.base_url))


# ----- celery: irbench cancel while runs wait to retry ----------------------------------------------


def test_celery_runs_cancelled_between_attempts_are_cancelled_and_resume(live: Cluster, tmp_path: Path) -> None:
    spec = {"flaky": {"max_concurrency": 2}, "limited": {"max_concurrency": 2}}
    with sim(FAILING) as s, sim(HEALTHY) as healthy:
        path = make_campaign(tmp_path, "midretry-c", s.base_url, spec, prompts=2, runs=2, retry=RETRY)
        data = tmp_path / "data"
        args = ("run", str(path), "--data", str(data), "--executor", "celery", "--broker", live.url,
                "--no-analyze", "--no-progress")
        result: list[subprocess.CompletedProcess] = []
        orchestrator = threading.Thread(target=lambda: result.append(_cli(*args)), daemon=True)
        orchestrator.start()
        # a first call of each model made: those runs wait to retry
        wait_for(lambda: _calls(s.base_url, "flaky") >= 2 and _calls(s.base_url, "limited") >= 1, 30, "first calls")
        cancel_campaign("midretry-c", live.url, reason="cancelled by test")
        orchestrator.join(60)
        assert result and result[0].returncode == 4, result
        settle(RunStore(data), live.url, "midretry-c")
        rows = _executions(data, "midretry-c")
        caught = _assert_one_outcome_each(rows, _calls_by_model(s.base_url), ("flaky", "limited"))
        assert all(r["cancel_reason"] == "cancelled by test" for r in caught)
        _status(path, data, sum(r["outcome"] == "cancelled" for r in rows))
        path.write_text(path.read_text().replace(s.base_url, healthy.base_url))  # the endpoint recovered
        again = _cli(*args)
        assert again.returncode == _exit_after_resume(rows), (again.stdout, again.stderr)
        settle(RunStore(data), live.url, "midretry-c")
        _assert_resumed(again, data, "midretry-c", rows, _calls_by_model(s.base_url, healthy.base_url))
