"""Measurement waves end to end: `irbench run --new-wave` measures every planned run again as the
next wave (local executor through the CLI, Celery executor with real redis + workers), a plain
re-run resumes the latest wave, the served identity is stored per wave, `analyze --wave` selects
rows, and every bad input is one line, exit 2, nothing stored. Counted on both sides: the calls
the simulator received and the rows the store holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from analysis.inputs import read_inputs
from analysis.options import AnalysisOptions
from deploy.processes import free_port
from orchestrator.campaign.spec import load_campaign
from orchestrator.campaign.waves import current_wave, prepare_wave, start_new_wave
from simulator.config import SimConfig, SimModel
from simulator.server import start_background
from storage.runs import RunStore
from storage.wave_selection import WaveSelection
from storage.waves import list_waves
from tests.support.distributed import FAST, Cluster, cluster  # noqa: F401  (cluster: a fixture by name)
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

IRBENCH = [sys.executable, "-m", "orchestrator.cli.app"]
PROMPTS = Path(__file__).resolve().parents[2] / "examples" / "prompts"
N_PROMPTS = 12
MODELS = ("sim-a", "sim-o")  # OpenAI and Ollama wire formats
PLANNED = N_PROMPTS * len(MODELS)


def _irbench(*args: str) -> subprocess.CompletedProcess:
    extra = ["--no-progress"] if args[0] == "run" else []
    out = run_cli([*args, *extra], env={**os.environ, "COLUMNS": "250"}, timeout_s=300)
    assert "Traceback" not in out.stderr, out.stderr
    return out


def _requests(base_url: str) -> int:
    with urllib.request.urlopen(f"{base_url}/_stats") as resp:
        stats = json.load(resp)
    return sum(int(m.get("requests", 0)) for m in stats.get("models", stats).values())


def _campaign(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "waves.toml"
    path.write_text(f'name = "waves-demo"\nruns = 1\n[corpus]\npaths = ["{PROMPTS}"]\n'
                    f'[endpoints.sim]\nbase_url = "http://127.0.0.1:{port}"\n'
                    f'[endpoints.simo]\nbase_url = "http://127.0.0.1:{port}"\nwire_format = "ollama"\n'
                    '[defaults]\nconnect_timeout_s = 2\ntotal_timeout_s = 20\n'
                    '[models.sim-a]\nendpoint = "sim"\n[models.sim-o]\nendpoint = "simo"\n')
    return path


def _sim(fingerprint: str, served: str | None = None) -> SimConfig:
    return SimConfig(seed=5, models={"sim-a": SimModel(system_fingerprint=fingerprint),
                                     "sim-o": SimModel(served_model=served)})


def _identity(data: Path, wave: int) -> Counter:
    table = RunStore(data).read_table(waves=[wave], columns=["model", "served_model", "system_fingerprint", "wave"])
    assert set(table["wave"].to_pylist()) == {wave}
    return Counter(zip(*(table[c].to_pylist() for c in ("model", "served_model", "system_fingerprint"))))


def test_a_new_wave_measures_every_run_again_and_a_plain_rerun_resumes_it(tmp_path: Path) -> None:
    port, data = free_port(), tmp_path / "data"
    campaign = _campaign(tmp_path, port)
    with start_background(_sim("fp_a"), port=port) as sim:
        assert _irbench("run", str(campaign), "--data", str(data)).returncode == 0
        first_calls = _requests(sim.base_url)
    store = RunStore(data)
    wave1_ids = set(store.read_table(waves=[1], columns=["run_id"])["run_id"].to_pylist())
    assert first_calls == PLANNED and len(wave1_ids) == PLANNED
    assert _identity(data, 1) == {("sim-a", "sim-a", "fp_a"): N_PROMPTS, ("sim-o", "sim-o", None): N_PROMPTS}

    # the provider revises both models under their names: a new fingerprint, a new served name
    with start_background(_sim("fp_b", served="sim-o:2026-06"), port=port) as sim:
        new = _irbench("run", str(campaign), "--data", str(data), "--new-wave", "--wave-label", "one month later")
        assert new.returncode == 0, new.stderr
        assert f"waves-demo wave 2: {PLANNED} runs planned, 0 already stored, {PLANNED} executed now" in " ".join(
            new.stdout.split())
        assert _requests(sim.base_url) == PLANNED  # every planned run once more: 2x planned in all
        again = _irbench("run", str(campaign), "--data", str(data))
        assert again.returncode == 0 and _requests(sim.base_url) == PLANNED  # resumes wave 2: nothing left
        retried = _irbench("run", str(campaign), "--data", str(data), "--retry-failed")
        assert retried.returncode == 0 and _requests(sim.base_url) == PLANNED
    assert store.read_table(columns=["run_id"]).num_rows == 2 * PLANNED
    assert set(store.read_table(waves=[1], columns=["run_id"])["run_id"].to_pylist()) == wave1_ids  # unchanged
    assert store.read_table(waves=[2], columns=["run_id"]).num_rows == PLANNED
    assert _identity(data, 2) == {("sim-a", "sim-a", "fp_b"): N_PROMPTS, ("sim-o", "sim-o:2026-06", None): N_PROMPTS}
    waves = list_waves(data, "waves-demo")
    assert [(w.wave, w.label) for w in waves] == [(1, None), (2, "one month later")]
    started = set(store.read_table(waves=[2], columns=["wave_started_at"])["wave_started_at"].to_pylist())
    assert started == {waves[1].started_at}

    status = _irbench("status", str(campaign), "--data", str(data))
    text = " ".join(status.stdout.split())
    assert "wave 2 (the campaign's latest)" in text and f"{PLANNED}/{PLANNED} runs stored" in text
    _check_spend_by_wave(text, store)
    as_json = json.loads(_irbench("status", str(campaign), "--data", str(data), "--json").stdout)
    assert as_json["wave"] == 2 and as_json["total"]["stored"] == PLANNED

    ids = {}
    for wave in ("1", "2", "all", "latest"):
        runs, _, _ = read_inputs(data, AnalysisOptions(waves=WaveSelection.parse(wave)))
        ids[wave] = set(runs["run_id"].to_pylist())
    assert ids["1"] == wave1_ids and ids["2"].isdisjoint(ids["1"]) and len(ids["2"]) == PLANNED
    assert ids["all"] == ids["1"] | ids["2"] and ids["latest"] == ids["2"]
    for wave, runs_read in (("1", PLANNED), ("2", PLANNED), ("all", 2 * PLANNED)):
        out = tmp_path / f"out-{wave}"
        analyzed = _irbench("analyze", "--data", str(data), "--out", str(out), "--wave", wave, "--replicates", "50")
        assert analyzed.returncode == 0, analyzed.stderr
        manifest = json.loads(next(out.glob("*/manifest.json")).read_text())
        assert manifest["input"]["runs_in_panel"] == runs_read, manifest["input"]


def _check_spend_by_wave(text: str, store: RunStore) -> None:
    """Text status: each wave's tokens per model and in total, as the store holds them, then all waves'."""
    rows = store.dataset.read(filters={"campaign": ["waves-demo"]}, dedupe="executions",
                              columns=["wave", "model", "prompt_tokens", "completion_tokens"]).to_pylist()
    sums: Counter = Counter()
    for r in rows:
        for key in ((r["wave"], r["model"]), (r["wave"], "total"), ("1-2", "total")):
            sums[(*key, "p")] += r["prompt_tokens"]
            sums[(*key, "c")] += r["completion_tokens"]
    for wave, name, executions in [(w, m, N_PROMPTS) for w in (1, 2) for m in MODELS] + [(1, "total", PLANNED),
                                                                                          (2, "total", PLANNED)]:
        line = (f"spent in wave {wave}, {name}: {sums[(wave, name, 'p')]:,} prompt + {sums[(wave, name, 'c')]:,} "
                f"completion tokens over {executions} executions, cost unknown")
        assert line in text, (line, text)
    assert sums[(1, "total", "c")] > 0 and sums[(2, "total", "c")] > 0
    assert (f"spent in waves 1-2, total: {sums[('1-2', 'total', 'p')]:,} prompt + {sums[('1-2', 'total', 'c')]:,} "
            f"completion tokens over {2 * PLANNED} executions") in text


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _one_line_exit_2(out: subprocess.CompletedProcess, *words: str) -> None:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert all(w in lines[0] for w in words), lines[0]


def test_bad_wave_input_is_one_line_exit_2_and_stores_nothing(tmp_path: Path) -> None:
    port, data = free_port(), tmp_path / "data"
    campaign = _campaign(tmp_path, port)
    _one_line_exit_2(_irbench("run", str(campaign), "--data", str(data), "--new-wave"), "no stored runs", "run it first")
    assert _files(data) == []
    _one_line_exit_2(_irbench("run", str(campaign), "--data", str(data), "--wave-label", "x"), "--new-wave")
    _one_line_exit_2(_irbench("run", str(campaign), "--data", str(data), "--new-wave", "--retry-failed"),
                     "--new-wave", "--retry-failed")
    assert _files(data) == []
    with start_background(_sim("fp_a"), port=port) as sim:
        assert _irbench("run", str(campaign), "--data", str(data)).returncode == 0
        assert _irbench("run", str(campaign), "--data", str(data), "--new-wave").returncode == 0
        before, calls = _files(data), _requests(sim.base_url)
        for args in (["run", str(campaign), "--data", str(data), "--wave-label", "x"],
                     ["run", str(campaign), "--data", str(data), "--new-wave", "--retry-failed"]):
            _one_line_exit_2(_irbench(*args), "--new-wave")
        _one_line_exit_2(_irbench("analyze", "--data", str(data), "--out", str(tmp_path / "o"), "--wave", "5"),
                         "no wave 5", "waves-demo: 1, 2")
        _one_line_exit_2(_irbench("report", "--data", str(data), "--out", str(tmp_path / "r"), "--wave", "5"),
                         "no wave 5")
        _one_line_exit_2(_irbench("analyze", "--data", str(data), "--out", str(tmp_path / "o"), "--wave", "two"),
                         "--wave 'two'")
        assert _files(data) == before and _requests(sim.base_url) == calls
        assert not (tmp_path / "o").exists() and not (tmp_path / "r").exists()
    # an unfinished latest wave: a third wave is refused until it is complete
    store = RunStore(data)
    spec = load_campaign(campaign)
    latest = prepare_wave(spec, data, max_planned_runs=None, source=None)
    assert latest.wave.number == 2
    wave3 = start_new_wave(latest, store, None)
    assert wave3.number == 3 and current_wave(data, "waves-demo") == wave3
    unfinished = _irbench("run", str(campaign), "--data", str(data), "--new-wave")
    _one_line_exit_2(unfinished, "wave 3", f"{PLANNED} of {PLANNED} planned runs not stored", "finish it first")


def test_waves_on_the_celery_executor(tmp_path: Path, cluster: Cluster) -> None:  # noqa: F811
    from orchestrator.distributed.executor import CeleryRun, run_campaign_celery

    port, data = free_port(), tmp_path / "data"
    campaign = _campaign(tmp_path, port)
    spec = load_campaign(campaign)
    store = RunStore(data)
    with start_background(_sim("fp_a"), port=port) as sim:
        one = prepare_wave(spec, data, max_planned_runs=None, source=None)
        first = run_campaign_celery(one, store, cluster.url, CeleryRun(options=FAST))
        assert first.executed == PLANNED and _requests(sim.base_url) == PLANNED
    wave1_ids = set(store.read_table(waves=[1], columns=["run_id"])["run_id"].to_pylist())
    celery = ("--executor", "celery", "--broker", cluster.url, "--no-analyze")
    with start_background(_sim("fp_b"), port=port) as sim:  # the new wave through the CLI, as a user types it
        new = _irbench("run", str(campaign), "--data", str(data), *celery, "--new-wave", "--wave-label", "w2")
        assert new.returncode == 0, new.stderr
        assert f"wave 2: {PLANNED} runs planned, 0 already stored, {PLANNED} executed now" in " ".join(new.stdout.split())
        assert _requests(sim.base_url) == PLANNED
        plain = _irbench("run", str(campaign), "--data", str(data), *celery)  # resumes wave 2: nothing to do
        assert plain.returncode == 0 and _requests(sim.base_url) == PLANNED
        resumed = prepare_wave(spec, data, max_planned_runs=None, source=None)
        assert resumed.wave.number == 2
        again = run_campaign_celery(resumed, store, cluster.url, CeleryRun(options=FAST))
        assert again.executed == 0 and _requests(sim.base_url) == PLANNED
    assert set(store.read_table(waves=[1], columns=["run_id"])["run_id"].to_pylist()) == wave1_ids
    assert store.read_table(waves=[2], columns=["run_id"]).num_rows == PLANNED
    assert _identity(data, 1)[("sim-a", "sim-a", "fp_a")] == N_PROMPTS
    assert _identity(data, 2)[("sim-a", "sim-a", "fp_b")] == N_PROMPTS
    executions = store.read_executions(campaigns=["waves-demo"], columns=["run_id"])
    assert executions.num_rows == 2 * PLANNED  # one execution per call: no wave ran twice


def test_a_streamed_answer_carries_its_served_identity(tmp_path: Path) -> None:
    port, data = free_port(), tmp_path / "data"
    campaign = _campaign(tmp_path, port)
    campaign.write_text(campaign.read_text().replace('endpoint = "sim"\n', 'endpoint = "sim"\nstream = true\n')
                        .replace('endpoint = "simo"\n', 'endpoint = "simo"\nstream = true\n'))
    with start_background(_sim("fp_s", served="sim-o:s"), port=port):
        assert _irbench("run", str(campaign), "--data", str(data)).returncode == 0
    assert _identity(data, 1) == {("sim-a", "sim-a", "fp_s"): N_PROMPTS, ("sim-o", "sim-o:s", None): N_PROMPTS}
