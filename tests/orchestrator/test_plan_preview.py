"""``irbench plan`` against what a run then stores: run counts exactly, prompt tokens within the
counter's stated error (exact against the simulator, which counts characters / 4 too), the
completion tokens under their bound, and the cost range around the cost of the stored tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pytest

from tests.support.workers import CeleryWorkers
from deploy.redis_server import RedisServer
from simulator.config import SimConfig, SimModel
from simulator.server import RunningSimulator, start_background
from storage.prices import read_prices
from storage.runs import RunStore
from tests.support.campaign_files import write_campaign
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "orchestrator.cli.app"]
RUNS, PROMPTS, MAX_TOKENS = 2, 3, 4000


@pytest.fixture
def sim() -> Iterator[RunningSimulator]:
    with start_background(SimConfig(seed=5, models={"a": SimModel(latency_ms_median=1),
                                                    "b": SimModel(latency_ms_median=1)})) as s:
        yield s


def _campaign(tmp_path: Path, base_url: str) -> Path:
    (tmp_path / "prices.toml").write_text('[b]\ninput_usd_per_mtok = 3.0\noutput_usd_per_mtok = 15.0\n')
    body = (f'[retry]\nmax_attempts = 1\n[endpoints.s]\nbase_url = "{base_url}"\n'
            f'input_usd_per_mtok = 1.0\noutput_usd_per_mtok = 2.0\n[defaults]\nmax_tokens = {MAX_TOKENS}\n'
            '[models.a]\n[models.b]\n')
    path = write_campaign(tmp_path, "costs", body, runs=RUNS, prompts=PROMPTS)
    path.write_text('prices = "prices.toml"\n' + path.read_text())  # a top-level key, before [corpus]
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRBENCH_")}
    return run_cli([*args], env=env, cwd=REPO, timeout_s=120)


def _plan(campaign: Path, data: Path) -> dict:
    proc = _cli("plan", str(campaign), "--data", str(data), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _run_on(executor: str, campaign: Path, data: Path) -> subprocess.CompletedProcess:
    if executor == "local":
        return _cli("run", str(campaign), "--data", str(data), "--no-progress")
    with RedisServer() as srv, CeleryWorkers(srv.url, count=1, concurrency=2, env={"IRBENCH_DATA": str(data)}):
        return _cli("run", str(campaign), "--data", str(data), "--no-progress", "--executor", "celery",
                    "--broker", srv.url, "--no-analyze")


@pytest.mark.parametrize("executor", ["local", "celery"])
def test_plan_matches_what_the_run_stores(tmp_path: Path, sim: RunningSimulator, executor: str) -> None:
    campaign, data = _campaign(tmp_path, sim.base_url), tmp_path / "data"
    before = _plan(campaign, data)
    assert before["total"]["planned"] == before["total"]["to_run"] == 2 * RUNS * PROMPTS
    assert sum(sim.app.state.model_requests.values()) == 0  # the plan made no call
    proc = _run_on(executor, campaign, data)
    assert proc.returncode == 0, proc.stderr
    runs = RunStore(data).read_executions(campaigns=["costs"])
    for model in ("a", "b"):
        rows = runs.filter(pc.equal(runs.column("model"), model))
        p = before["models"][model]
        assert rows.num_rows == p["planned"] == sim.app.state.model_requests[model]
        stored_prompt = pc.sum(rows.column("prompt_tokens")).as_py()
        assert stored_prompt / 2 <= p["prompt_tokens_planned"] <= stored_prompt * 2  # the stated bound
        assert p["prompt_tokens_planned"] == stored_prompt  # the simulator counts as the estimate does
        stored_completion = pc.sum(rows.column("completion_tokens")).as_py()
        assert stored_completion <= p["completion_tokens_max_to_run"] == MAX_TOKENS * RUNS * PROMPTS
        price_in, price_out = (1.0, 2.0) if model == "a" else (3.0, 15.0)  # endpoint default, price file
        cost = (stored_prompt * price_in + stored_completion * price_out) / 1e6
        assert p["cost_usd_min"] <= cost <= p["cost_usd_max"]
        assert p["cost_usd_min"] == pytest.approx(stored_prompt * price_in / 1e6)
    after = _plan(campaign, data)
    assert after["total"]["stored"] == before["total"]["planned"] and after["total"]["to_run"] == 0
    assert after["models"]["a"]["latency_ms_median"] is not None  # now known from the stored runs
    assert read_prices(data)["costs"].models["b"].output_usd_per_mtok == 15.0


def test_a_missing_price_file_is_one_line(tmp_path: Path) -> None:
    campaign = write_campaign(tmp_path, "nofile", '[endpoints.s]\nbase_url = "http://127.0.0.1:9"\n[models.a]\n',
                              runs=1, prompts=1)
    campaign.write_text('prices = "nope.toml"\n' + campaign.read_text())
    proc = _cli("plan", str(campaign), "--data", str(tmp_path / "d"))
    assert proc.returncode == 2
    assert "prices" in proc.stderr and "nope.toml" in proc.stderr and "Traceback" not in proc.stderr


def test_a_negative_price_is_refused(tmp_path: Path) -> None:
    campaign = write_campaign(tmp_path, "neg", '[endpoints.s]\nbase_url = "http://127.0.0.1:9"\n'
                              '[models.a]\ninput_usd_per_mtok = -1\n', runs=1, prompts=1)
    proc = _cli("plan", str(campaign), "--data", str(tmp_path / "d"))
    assert proc.returncode == 2 and "input_usd_per_mtok" in proc.stderr


def test_status_shows_tokens_and_cost(tmp_path: Path, sim: RunningSimulator) -> None:
    campaign, data = _campaign(tmp_path, sim.base_url), tmp_path / "data"
    assert _cli("run", str(campaign), "--data", str(data), "--no-progress").returncode == 0
    proc = _cli("status", str(campaign), "--data", str(data))
    assert proc.returncode == 0, proc.stderr
    runs = RunStore(data).read_executions(campaigns=["costs"])
    b = runs.filter(pc.equal(runs.column("model"), "b"))
    p, c = pc.sum(b.column("prompt_tokens")).as_py(), pc.sum(b.column("completion_tokens")).as_py()
    assert f"spent in wave 1, b: {p:,} prompt + {c:,} completion tokens over {RUNS * PROMPTS} executions, " \
           f"${(p * 3.0 + c * 15.0) / 1e6:,.4f}" in proc.stdout
    assert "spent in wave 1, total:" in proc.stdout


def test_report_spend_table_costs_every_execution(tmp_path: Path, sim: RunningSimulator) -> None:
    from analysis.report.spend import load_spend, spend_blocks

    campaign, data = _campaign(tmp_path, sim.base_url), tmp_path / "data"
    assert _cli("run", str(campaign), "--data", str(data), "--no-progress").returncode == 0
    spend = load_spend(data, "costs")
    assert spend is not None
    runs = RunStore(data).read_executions(campaigns=["costs"])
    a = runs.filter(pc.equal(runs.column("model"), "a"))
    p, c = pc.sum(a.column("prompt_tokens")).as_py(), pc.sum(a.column("completion_tokens")).as_py()
    assert spend["a"].executions == RUNS * PROMPTS
    assert spend["a"].cost_usd == pytest.approx((p * 1.0 + c * 2.0) / 1e6)
    table = spend_blocks("costs", spend)[0]
    assert [row[0].text for row in table.rows] == ["a", "b", "total"]  # type: ignore[attr-defined]
