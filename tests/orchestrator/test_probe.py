"""The failure-attribution probe: all four classes against simulated models over loopback, the
pure attribution rules on hand-made cells, and the study's published probe."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.tables.probes import (
    Attribution,
    ProbeSettings,
    attribute,
    probe_input_from_study_csv,
    probe_table,
    summarise_cells,
)
from orchestrator.jobs.probe import ProbeExecution, attribution_lines, load_probe, probe_rich_table, run_probe
from simulator.config import load_sim_config
from simulator.server import start_background
from storage.probes import ProbeStore
from workers.errors import ConfigError

NOW = dt.datetime(2026, 9, 1, 12, 0, tzinfo=dt.timezone.utc)
REFERENCE_S = 1.0  # the simulated slow models answer in ~2 s (latency_sigma 0.05), fast ones in ~5 ms


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory, examples_dir: Path):
    data = tmp_path_factory.mktemp("probe") / "data"
    with start_background(load_sim_config(examples_dir / "sim_probe.toml")) as sim:
        first = run_probe(
            examples_dir / "probe.toml", data, settings=ProbeSettings(reference_timeout_s=REFERENCE_S),
            base_urls={"sim": sim.base_url}, execution=ProbeExecution(secrets={}), now=lambda: NOW,
        )
        again = run_probe(
            examples_dir / "probe.toml", data, settings=ProbeSettings(reference_timeout_s=REFERENCE_S),
            base_urls={"sim": sim.base_url}, execution=ProbeExecution(secrets={}), now=lambda: NOW + dt.timedelta(hours=1),
        )
    return data, first, again


def _rows(table: pa.Table) -> dict[tuple[str, int], dict]:
    return {(r["model"], r["budget_max_tokens"]): r for r in table.to_pylist()}


def test_each_attribution_class_from_simulated_models(probe_run) -> None:
    _, result, _ = probe_run
    expected = {
        "probe-fast": "works_under_both",
        "probe-reasoner": "budget_bound",
        "probe-slow": "timeout_bound",
        "probe-slow-reasoner": "fails_under_both",
    }
    got = {r["model"]: r["attribution"] for r in result.table.to_pylist()}
    assert got == expected
    assert result.planned == 4 * 2 * 3 * 2 and result.executed == result.planned
    rows = _rows(result.table)
    assert len(rows) == 8 and all(r["runs"] == 6 for r in rows.values())
    # budget exhaustion, closed form: the simulator spends the budget on reasoning first, so a
    # truncated run returns budget × chars_per_token (1500 × 4) reasoning chars and no answer
    tight = rows[("probe-reasoner", 1500)]
    assert tight["cell_verdict"] == "budget_exhausted" and tight["n_truncated"] >= 4
    assert tight["reasoning_chars_median"] == 6000.0 and tight["answer_chars_median"] == 0.0
    room = rows[("probe-reasoner", 8000)]
    assert room["runs_succeeded"] == 6 and room["reasoning_chars_median"] > 6000
    # slow: every run usable under the generous timeout, none within the reference
    for budget in (1500, 8000):
        slow = rows[("probe-slow", budget)]
        assert slow["runs_succeeded"] == 6 and slow["succeeded_within_reference"] == 0
        assert slow["latency_ms_median"] > REFERENCE_S * 1000 and slow["cell_verdict"] == "too_slow"
    fast = rows[("probe-fast", 1500)]
    assert fast["succeeded_within_reference"] == 6 and fast["latency_ms_max"] < REFERENCE_S * 1000
    assert rows[("probe-slow-reasoner", 8000)]["cell_verdict"] == "too_slow"
    # evidence names the numbers it rests on
    lines = {line.split(":")[0]: line for line in attribution_lines(result.table)}
    assert "truncated" in lines["probe-reasoner"] and "1500 tok" in lines["probe-reasoner"]
    assert f"within {REFERENCE_S:g} s" in lines["probe-slow"]
    assert "budget binds" in lines["probe-slow-reasoner"] and "timeout binds" in lines["probe-slow-reasoner"]


def test_outputs_and_resume(probe_run) -> None:
    data, first, again = probe_run
    assert again.executed == 0 and again.skipped == first.planned  # resumed: nothing re-run
    on_disk = pq.read_table(first.parquet_path)
    assert on_disk.num_rows == 8
    stored = ProbeStore(data).read(campaigns=["probe-budgets"])
    assert stored.num_rows == 8  # the second summary replaced the first, no duplicates
    assert set(stored.column("computed_at").to_pylist()) == {NOW + dt.timedelta(hours=1)}
    assert _rows(stored).keys() == _rows(first.table).keys()
    assert probe_rich_table(first.table).row_count == 8


def _cells(spec: list[tuple[str, int | None, str, bool, float]], ref_s: float = 60.0):
    table = pa.table({
        "model": [s[0] for s in spec],
        "budget_max_tokens": pa.array([s[1] for s in spec], pa.int64()),
        "outcome": [s[2] for s in spec],
        "succeeded": [s[3] for s in spec],
        "latency_ms": [s[4] for s in spec],
        "reasoning_chars": [0.0] * len(spec),
        "answer_chars": [0.0] * len(spec),
    })
    return summarise_cells(table, ProbeSettings(reference_timeout_s=ref_s))


def test_attribution_rules_on_hand_made_cells() -> None:
    # nothing works at any budget, even with the generous timeout
    dead = _cells([("m", 1500, "server_error", False, 10.0), ("m", 8000, "server_error", False, 10.0)])
    assert attribute(dead)[0] is Attribution.FAILS_UNDER_BOTH
    # tight fails by server errors, room works: neither budget nor timeout explains it
    odd = _cells([("m", 1500, "server_error", False, 10.0), ("m", 8000, "ok", True, 10.0)])
    verdict, why = attribute(odd)
    assert verdict is Attribution.INCONCLUSIVE and "server_error" in why
    # the majority threshold: 1 usable of 2 (= 0.5) works, 1 of 3 does not
    half = _cells([("m", 1500, "ok", True, 1.0), ("m", 1500, "truncated", False, 1.0),
                   ("m", 8000, "ok", True, 1.0)])
    assert attribute(half)[0] is Attribution.WORKS_UNDER_BOTH
    third = _cells([("m", 1500, "ok", True, 1.0), ("m", 1500, "truncated", False, 1.0),
                    ("m", 1500, "truncated", False, 1.0), ("m", 8000, "ok", True, 1.0)])
    assert attribute(third)[0] is Attribution.BUDGET_BOUND
    # latency exactly at the reference counts as within it
    edge = _cells([("m", 1500, "ok", True, 60_000.0), ("m", 8000, "ok", True, 60_000.1)])
    assert [c.works_under_reference for c in edge] == [True, False]
    assert attribute(edge)[0] is Attribution.TIMEOUT_BOUND


def test_study_probe_attributions(artifact_dir: Path) -> None:
    """The study's 11 models × 2 budgets under its 60 s harness timeout (its verdict column)."""
    table, audit = probe_input_from_study_csv(artifact_dir / "results" / "failure_attribution.csv")
    assert audit == dt.date(2026, 8, 17) and table.num_rows == 22
    rows = probe_table(table, ProbeSettings(reference_timeout_s=60.0), source="artifact",
                       campaign="study-probe", probe_date=audit, computed_at=NOW)
    got = {r["model"]: r["attribution"] for r in rows.to_pylist()}
    works = {"mistral-large-3:675b", "gemma4:31b", "glm-5.2"}
    assert {m for m, a in got.items() if a == "works_under_both"} == works
    # truncated at 1500, usable at 8000 but 77.7 s > 60 s: the study's "harness timeout"
    assert got["nemotron-3-ultra"] == "fails_under_both"
    assert {m for m, a in got.items() if a == "budget_bound"} == set(got) - works - {"nemotron-3-ultra"}


def test_probe_spec_checks(tmp_path: Path, examples_dir: Path) -> None:
    text = (examples_dir / "probe.toml").read_text()
    (tmp_path / "prompts").symlink_to(examples_dir / "prompts")
    one = tmp_path / "one.toml"
    one.write_text(text.replace("budgets = [1500, 8000]", "budgets = [1500]"))
    with pytest.raises(ConfigError, match="at least two token budgets"):
        load_probe(one, ProbeSettings())
    short = tmp_path / "short.toml"
    short.write_text(text.replace("total_timeout_s = 600", "total_timeout_s = 30"))
    with pytest.raises(ConfigError, match="not above the reference timeout 60 s"):
        load_probe(short, ProbeSettings(reference_timeout_s=60))
    assert load_probe(short, ProbeSettings(reference_timeout_s=20)).budgets == [1500, 8000]


def test_probe_command(tmp_path: Path, examples_dir: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from orchestrator.cli.ops import probe_command

    app = typer.Typer()
    app.command("probe")(probe_command)
    app.command("noop")(lambda: None)  # two commands: typer keeps the "probe" subcommand name
    runner = CliRunner()
    bad = runner.invoke(app, ["probe", str(examples_dir / "probe.toml"), "--endpoint-url", "nourl"])
    assert bad.exit_code == 2 and "NAME=URL" in bad.output
    with start_background(load_sim_config(examples_dir / "sim_probe.toml")) as sim:
        res = runner.invoke(app, [
            "probe", str(examples_dir / "probe.toml"), "--data", str(tmp_path / "data"), "--no-progress",
            "--reference-timeout", str(REFERENCE_S), "--endpoint-url", f"sim={sim.base_url}",
        ])
    assert res.exit_code == 0, res.output
    for word in ("budget_bound", "timeout_bound", "works_under_both", "fails_under_both"):
        assert word in res.output
    assert (tmp_path / "data" / "probes.parquet").is_file()
