"""stdout holds results, stderr logs and hints; messages say what the user needs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from orchestrator.cli.audit import analyze_command
from simulator.config import SimConfig, SimModel, load_sim_config
from simulator.server import start_background
from storage.availability import AvailabilityStore
from deploy.processes import free_port
from tests.support.cli import run_cli

IRBENCH = [sys.executable, "-m", "orchestrator.cli.app"]
REPO = Path(__file__).resolve().parents[2]
LOG_LINE = re.compile(r"run_finished|campaign_start|\[info|\"level\": ?\"info\"")


def _irbench(*args: str) -> subprocess.CompletedProcess:
    out = run_cli([*args], env={**os.environ, "COLUMNS": "250"}, cwd=REPO, timeout_s=240)
    assert "Traceback" not in out.stderr, out.stderr
    return out


def test_probe_before_and_after_starting_its_simulator(tmp_path: Path, examples_dir: Path) -> None:
    """The README's probe, endpoint not yet started: a hint on stderr; then --retry-failed measures it."""
    port = free_port()
    args = ["probe", str(examples_dir / "probe.toml"), "--data", str(tmp_path / "data"), "--reference-timeout", "1",
            "--endpoint-url", f"sim=http://127.0.0.1:{port}", "--no-progress"]
    down = _irbench(*args)
    assert down.returncode == 0
    assert not LOG_LINE.search(down.stdout), down.stdout[:500]  # no per-run log lines on stdout
    hint = " ".join(down.stderr.split())
    assert "48/48 of the latest runs never reached the endpoint" in hint and "--retry-failed" in hint
    with start_background(load_sim_config(examples_dir / "sim_probe.toml"), port=port):
        plain = _irbench(*args)
        assert "48 already stored, 0 executed now" in " ".join(plain.stdout.split())
        up = _irbench(*args, "--retry-failed")
    assert up.returncode == 0
    text = " ".join(up.stdout.split())
    assert "48 executed now" in text and not LOG_LINE.search(up.stdout)
    for word in ("budget_bound", "timeout_bound", "works_under_both", "fails_under_both"):
        assert word in text
    assert "never reached" not in up.stderr


def test_availability_check_shows_the_stored_message(tmp_path: Path) -> None:
    cfg = SimConfig(models={"alive": SimModel(), "hidden": SimModel(listed=False)})
    data = tmp_path / "data"
    with start_background(cfg) as sim:
        out = _irbench("availability", "check", "--data", str(data), "--models", "alive,ghost",
                       "--base-url", sim.base_url, "--timeout", "5")
    assert out.returncode == 0, out.stderr
    rows = {r["model"]: r for r in AvailabilityStore(data).read().to_pylist()}
    assert rows["ghost"]["status"] != "available" and rows["ghost"]["message"]
    flat = " ".join(out.stdout.split()).replace("│", " ")
    first_words = " ".join(rows["ghost"]["message"].split()[:4])
    assert first_words in " ".join(flat.split()), (first_words, out.stdout)


def test_history_filter_matching_nothing_says_so(tmp_path: Path) -> None:
    data = tmp_path / "data"
    empty = _irbench("availability", "history", "--data", str(data), "--models", "nope")
    assert "no availability checks" in empty.stdout
    with start_background(SimConfig(models={"alive": SimModel()})) as sim:
        assert _irbench("availability", "check", "--data", str(data), "--models", "alive",
                        "--base-url", sim.base_url).returncode == 0
    miss = _irbench("availability", "history", "--data", str(data), "--models", "nope")
    text = " ".join(miss.stdout.split())
    assert miss.returncode == 0 and "matched no checked model" in text and "alive" in text
    assert "no availability checks" not in text


def test_analyze_help_example_points_at_folders_that_exist() -> None:
    example = next(line for line in (analyze_command.__doc__ or "").splitlines() if "Example:" in line)
    args = example.split("irbench", 1)[1].split()
    corpus = args[args.index("--corpus") + 1]
    assert (REPO / corpus).is_dir(), corpus


def test_analyze_says_it_uses_the_latest_execution(tmp_path: Path) -> None:
    from tests.support.run_records import make_record

    from storage.runs import RunStore

    store = RunStore(tmp_path)
    store.write([make_record(1), make_record(2)])
    store.write([make_record(1, run_id="run-000001")])  # a second execution of run 1
    out = _irbench("analyze", "--data", str(tmp_path), "--out", str(tmp_path / "out"), "--replicates", "50",
                   "--min-prompts", "1", "--min-runs", "2")
    text = " ".join(out.stdout.split())
    assert "the latest execution of each of 2 runs is analysed" in text and "1 earlier executions" in text, out


def test_every_analyze_flag_reaches_the_recorded_options(tmp_path: Path) -> None:
    """Each flag of `irbench analyze` lands in the options the manifest records (none dropped on the way)."""
    import json

    from tests.support.run_records import make_record

    from storage.runs import RunStore

    RunStore(tmp_path).write([make_record(1), make_record(2)])
    flags = {"--corpus": str(REPO / "examples" / "prompts"), "--skip-corrupt": None, "--seed": "11",
             "--replicates": "60", "--min-prompts": "1", "--min-runs": "3", "--pairs": "all",
             "--timeouts": "7,9", "--merge-rule": "earliest-then-top-up", "--from": "2000-01-01",
             "--interval-threads": "1", "--interval": "bca"}
    argv = [a for k, v in flags.items() for a in (k, v) if a is not None]
    out = _irbench("analyze", "--data", str(tmp_path), "--out", str(tmp_path / "out"), *argv)
    assert out.returncode == 0, out.stderr
    manifests = list((tmp_path / "out").glob("*/manifest.json"))
    assert manifests, out.stdout
    recorded = {k: v["value"] for k, v in json.loads(manifests[0].read_text())["options"].items()}
    assert recorded["corpus_dirs"] == [flags["--corpus"]] and recorded["skip_corrupt"] is True
    assert (recorded["seed"], recorded["replicates"], recorded["min_prompts"], recorded["min_runs"]) == (11, 60, 1, 3)
    assert recorded["pair_scope"] == "all" and recorded["timeouts_s"] == [7.0, 9.0]
    assert recorded["merge_rule"] == "earliest-then-top-up" and recorded["date_from"] == "2000-01-01"
    assert recorded["interval"] == "bca"
