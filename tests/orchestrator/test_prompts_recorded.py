"""``irbench run`` records what it asked in ``DATA/prompts/`` (on both executors): each prompt
file's text and the user message it became, keyed as the runs are, once however often it runs."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.workers import CeleryWorkers
from deploy.redis_server import RedisServer
from simulator.config import SimConfig, SimModel
from simulator.server import RunningSimulator, start_background
from storage.prompts import PromptStore
from storage.runs import RunStore
from tests.support.campaign_files import write_campaign
from tests.support.cli import run_cli

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "orchestrator.cli.app"]
BEGIN, END = "--- BEGIN PROMPT ---\n", "\n--- END PROMPT ---"


@pytest.fixture
def sim() -> Iterator[RunningSimulator]:
    with start_background(SimConfig(seed=3, models={"steady": SimModel(latency_ms_median=1)})) as s:
        yield s


def _run(campaign: Path, data: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRBENCH_")}
    return run_cli(["run", str(campaign), "--data", str(data), "--no-progress", *extra], env=env, cwd=REPO, timeout_s=120)


def _campaign(tmp_path: Path, base_url: str) -> Path:
    path = write_campaign(tmp_path, "asked", f'[endpoints.s]\nbase_url = "{base_url}"\n[models.steady]\n',
                          runs=2, prompts=3)
    (tmp_path / "prompts" / "p1.txt").write_text("Rule 1: {uri} and {prompt} stay as written.\n<b>x</b>\n")
    return path


def _assert_recorded(tmp_path: Path, data: Path) -> None:
    rows = PromptStore(data).read().to_pylist()
    files = {f.name: f.read_bytes() for f in (tmp_path / "prompts").iterdir()}
    assert sorted(r["prompt_name"] for r in rows) == sorted(files)
    runs = RunStore(data).read_table(columns=["prompt_sha256", "prompt_name", "instruction_sha256"]).to_pylist()
    keys = {(r["prompt_sha256"], r["prompt_name"], r["instruction_sha256"]) for r in runs}
    assert {(r["prompt_sha256"], r["prompt_name"], r["instruction_sha256"]) for r in rows} == keys
    for row in rows:
        raw = files[row["prompt_name"]]
        assert row["prompt_sha256"] == hashlib.sha256(raw).hexdigest()
        assert row["prompt_text"] == raw.decode()
        message = row["user_message"]
        inside = message[message.index(BEGIN) + len(BEGIN):message.index(END)]
        assert inside == raw.decode().rstrip("\n")  # the prompt, braces untouched
        assert message.index(BEGIN) > 100  # the instruction comes first
        assert row["instruction_version"] == "irbench-v1"


def test_a_local_run_records_its_prompts_once(tmp_path: Path, sim: RunningSimulator) -> None:
    campaign, data = _campaign(tmp_path, sim.base_url), tmp_path / "data"
    assert _run(campaign, data).returncode == 0
    _assert_recorded(tmp_path, data)
    files = PromptStore(data).dataset.data_files()
    assert len(files) == 1
    assert _run(campaign, data).returncode == 0  # a resume: nothing new to record
    assert PromptStore(data).dataset.data_files() == files


def test_a_celery_run_records_its_prompts(tmp_path: Path, sim: RunningSimulator) -> None:
    campaign, data = _campaign(tmp_path, sim.base_url), tmp_path / "data"
    with RedisServer() as srv, CeleryWorkers(srv.url, count=1, concurrency=2, env={"IRBENCH_DATA": str(data)}):
        proc = _run(campaign, data, "--executor", "celery", "--broker", srv.url, "--no-analyze")
    assert proc.returncode == 0, proc.stderr
    _assert_recorded(tmp_path, data)


def test_a_failed_prompt_write_does_not_stop_the_campaign(tmp_path: Path) -> None:
    """The texts are a reading aid: a store root that cannot hold them is logged, not raised
    (the runs' own writes report the cause), and nothing is half-written."""
    from orchestrator.campaign.prepared import prepare, record_prompts
    from orchestrator.campaign.spec import load_campaign

    prepared = prepare(load_campaign(_campaign(tmp_path, "http://127.0.0.1:9")))
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("x")
    assert record_prompts(prepared, blocked, fsync=False) == 0
    assert record_prompts(prepared, tmp_path / "data", fsync=False) == 3
    assert record_prompts(prepared, tmp_path / "data", fsync=False) == 0
