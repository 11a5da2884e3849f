"""Ad-hoc `irbench run --model ... --base-url ... --prompts ...`, `.env` and IRBENCH_DATA, as a user types them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from orchestrator.campaign.adhoc import AdhocRun
from orchestrator.cli.envfile import load_env_file
from orchestrator.campaign.spec import load_campaign
from simulator.config import SimConfig, SimModel
from simulator.server import start_background
from storage.runs import RunStore
from tests.support.terminal import with_default_sigint
from tests.support.cli import run_cli
from tests.support import forked

pytestmark = pytest.mark.slow

IRBENCH = [sys.executable, "-m", "orchestrator.cli.app"]
REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "examples" / "prompts"
N_PROMPTS = 12


def _irbench(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**(env or os.environ), "PYTHONPATH": str(REPO)}
    return run_cli([*args], env=env, cwd=cwd, timeout_s=180)


def _requests(base_url: str) -> int:
    with urllib.request.urlopen(f"{base_url}/_stats") as resp:
        stats = json.load(resp)
    return sum(int(m["requests"]) for m in stats.get("models", stats).values())


def test_adhoc_run_writes_its_campaign_and_the_same_command_resumes(tmp_path: Path) -> None:
    cfg = SimConfig(models={"sim-a": SimModel(), "sim-b": SimModel()})
    with start_background(cfg) as sim:
        data = tmp_path / "data"
        args = ["run", "--model", "sim-a", "--base-url", sim.base_url, "--prompts", str(PROMPTS),
                "--runs", "2", "--max-tokens", "4000", "--data", str(data), "--no-progress"]
        first = _irbench(*args, cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        assert _requests(sim.base_url) == 2 * N_PROMPTS
        written = sorted((data / "campaigns").glob("*.toml"))
        first_text = written[0].read_text()
        assert len(written) == 1 and written[0].stem.startswith("adhoc-sim-a-")
        spec = load_campaign(written[0])  # the provenance file is a valid campaign
        assert spec.name == written[0].stem and spec.runs == 2
        assert spec.models["sim-a"].max_tokens == 4000 and spec.endpoints["adhoc"].base_url == sim.base_url
        store = RunStore(data)
        assert store.count_by_outcome(spec.name) == {"ok": 2 * N_PROMPTS}

        again = _irbench(*args, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert _requests(sim.base_url) == 2 * N_PROMPTS  # same command: same campaign, nothing to do
        assert f"{2 * N_PROMPTS} already stored, 0 executed" in " ".join(again.stdout.split())
        assert "changes campaign" not in again.stderr and written[0].read_text() == first_text  # file kept as is

        more = _irbench(*[a if a != "2" else "3" for a in args], cwd=tmp_path)  # --runs 3 extends it
        assert more.returncode == 0, more.stderr
        assert _requests(sim.base_url) == 3 * N_PROMPTS
        assert store.count_by_outcome(spec.name) == {"ok": 3 * N_PROMPTS}
        notice = [ln for ln in more.stderr.splitlines() if "changes campaign" in ln]
        assert len(notice) == 1 and "runs = 2 -> runs = 3" in notice[0] and spec.name in notice[0], more.stderr
        assert load_campaign(written[0]).runs == 3  # the provenance says what ran

        other = _irbench("run", "--model", "sim-b", "--base-url", sim.base_url, "--prompts", str(PROMPTS),
                         "--data", str(data), "--no-progress", "--name", "b-check", cwd=tmp_path)
        assert other.returncode == 0, other.stderr
        assert (data / "campaigns" / "b-check.toml").is_file()
        assert store.count_by_outcome("b-check") == {"ok": N_PROMPTS}

        # the written file runs as an ordinary campaign too: zero calls
        via_file = _irbench("run", str(written[0]), "--data", str(data), "--no-progress", cwd=tmp_path)
        assert via_file.returncode == 0 and _requests(sim.base_url) == 4 * N_PROMPTS


@pytest.mark.parametrize("flag", [["--runs", "4"], ["--max-tokens", "10"], ["--temperature", "0.7"],
                                  ["--wire-format", "ollama"], ["--name", "x"], ["--api-key-env", "KEY"]])
def test_an_adhoc_flag_beside_a_campaign_file_is_refused(tmp_path: Path, flag: list[str]) -> None:
    campaign = REPO / "examples" / "demo.toml"
    out = _irbench("run", str(campaign), *flag, "--data", str(tmp_path / "d"), "--no-progress", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{flag[0]} only go with an ad-hoc run" in lines[0] and str(campaign) in lines[0]
    assert not (tmp_path / "d").exists()  # nothing ran, nothing was written


def test_dotenv_supplies_the_key_and_irbench_data_the_root(tmp_path: Path) -> None:
    secret = "sim-dotenv-secret-5f3a9c"
    cfg = SimConfig(api_key=secret, models={"sim-a": SimModel()})
    work = tmp_path / "work"
    work.mkdir()
    (work / ".env").write_text(f"# keys for this folder\nSIM_DOTENV_KEY={secret}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("SIM_DOTENV_KEY", "IRBENCH_DATA")}
    env["IRBENCH_DATA"] = str(tmp_path / "from-env")
    with start_background(cfg) as sim:
        out = _irbench("run", "--model", "sim-a", "--base-url", sim.base_url, "--prompts", str(PROMPTS),
                       "--api-key-env", "SIM_DOTENV_KEY", "--no-progress", cwd=work, env=env)
        assert out.returncode == 0, out.stderr
        assert _requests(sim.base_url) == N_PROMPTS
    store = RunStore(tmp_path / "from-env")  # no --data: IRBENCH_DATA is the root
    campaign = next((tmp_path / "from-env" / "campaigns").glob("*.toml")).stem
    assert store.count_by_outcome(campaign) == {"ok": N_PROMPTS}  # 401 without the key
    assert not (work / "data").exists()
    for f in (tmp_path / "from-env").rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    assert secret not in out.stdout + out.stderr

    # IRBENCH_DATA is the default of the other commands too
    status = _irbench("status", str(next((tmp_path / "from-env" / "campaigns").glob("*.toml"))), cwd=work, env=env)
    assert status.returncode == 0 and f"{N_PROMPTS}/{N_PROMPTS} runs stored" in " ".join(status.stdout.split())


def test_environment_wins_over_dotenv_and_names_only_are_returned(tmp_path: Path) -> None:
    f = tmp_path / ".env"
    f.write_text("A=from-file\nB=from-file\n")
    environ = {"A": "from-env"}
    assert load_env_file(f, environ) == ["B"]
    assert environ == {"A": "from-env", "B": "from-file"}
    assert load_env_file(tmp_path / "missing.env", environ) == []


def test_adhoc_name_depends_on_what_is_measured_not_on_runs(tmp_path: Path) -> None:
    base = AdhocRun(model="gpt-oss:20b", base_url="http://h:1/v1", prompts=PROMPTS)
    assert base.campaign_name().startswith("adhoc-gpt-oss-20b-")
    assert base.model_copy(update={"runs": 5}).campaign_name() == base.campaign_name()
    for change in ({"model": "x"}, {"base_url": "http://h:2/v1"}, {"max_tokens": 100}, {"temperature": 0.7},
                   {"wire_format": "ollama"}, {"prompts": tmp_path}):
        assert base.model_copy(update=change).campaign_name() != base.campaign_name(), change
    assert base.model_copy(update={"name": "mine"}).campaign_name() == "mine"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "say what to run"),
        (["--model", "m"], "missing --base-url, --prompts"),
        (["--model", "m", "--base-url", "http://h", "--prompts", "nowhere"], "not a folder"),
        (["--model", "m", "--base-url", "http://h", "--prompts", str(PROMPTS), "--api-key-env", "sk-abcdefghijklmnopqrstuv"],
         "NAME of an environment variable"),
        (["--model", "m", "--base-url", "http://h", "--prompts", str(PROMPTS), "--wire-format", "grpc"], "'openai' or 'ollama'"),
    ],
)
def test_adhoc_mistakes_are_one_line_errors(tmp_path: Path, args: list[str], message: str) -> None:
    out = _irbench("run", *args, "--data", str(tmp_path / "d"), "--no-progress", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert message in " ".join(out.stderr.split())


def test_ctrl_c_says_run_again_and_the_same_command_resumes(tmp_path: Path) -> None:
    import signal
    import time

    # slow enough that the 120 runs cannot all finish between the 20th request and the signal,
    # even on a loaded machine (at 100 ms they sometimes did: exit 0 instead of 130)
    cfg = SimConfig(models={"slow": SimModel(latency_ms_median=400)})
    with start_background(cfg) as sim:
        args = [*IRBENCH, "run", "--model", "slow", "--base-url", sim.base_url, "--prompts", str(PROMPTS),
                "--runs", "10", "--data", str(tmp_path / "data"), "--no-progress"]
        # the Ctrl-C a terminal delivers, even when this pytest runs with SIGINT ignored (a background job)
        proc = forked.popen(with_default_sigint(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
        store = RunStore(tmp_path / "data")
        try:
            # no deadline of our own: a start-up slowed by load must not turn into a signal during
            # the imports (pytest's timeout bounds the wait)
            while _requests(sim.base_url) < 20 and proc.poll() is None:
                time.sleep(0.1)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 130 and "Traceback" not in err
        assert "run the same command again to resume" in " ".join(err.split())
        assert "(interrupted)" in out
        campaign = next((tmp_path / "data" / "campaigns").glob("*.toml")).stem
        stored = sum(store.count_by_outcome(campaign).values())
        assert 0 < stored < 10 * N_PROMPTS
        before_resume = _requests(sim.base_url)
    # the resume needs no slow model (only the interrupt did): the same model on the same port,
    # answering at once, so the ~100 remaining runs take a second instead of ~10
    with start_background(SimConfig(models={"slow": SimModel(latency_ms_median=5)}), port=sim.port) as fast:
        again = _irbench(*args[3:], cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert f"{stored} already stored, {10 * N_PROMPTS - stored} executed now" in " ".join(again.stdout.split())
        assert store.count_by_outcome(campaign) == {"ok": 10 * N_PROMPTS}
        # calls cut off by Ctrl-C are made again
        assert before_resume + _requests(fast.base_url) >= 10 * N_PROMPTS
