"""analyze on small real stores: bad input, corrupt files, references (scipy), the CLI bodies."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import typer
from scipy.stats import bootstrap
from typer.testing import CliRunner

from analysis.pipeline import CorruptDataError, NoRunsError, run_analysis
from analysis.tables.families import default_family
from analysis.options import AnalysisOptions
from orchestrator.cli.audit import analyze_command, import_artifact_command
from storage.cells import CellMeasurement, CellStore, measurement_id
from storage.records import Outcome, ParseOutcome, RunRecord
from storage.runs import RunStore

DAY = dt.date(2026, 3, 1)


def rec(model: str, prompt: str, k: int, ids: list[str] | None, campaign: str = "c1",
        panel: str = "main") -> RunRecord:
    ok = ids is not None
    doc = {"nodes": [{"id": i, "kind": "Rule", "meta": {"inferred": False}} for i in ids or []]}
    return RunRecord(
        run_id=f"{campaign}|{model}|{prompt}|{k}", campaign=campaign, panel=panel,
        prompt_sha256=f"sha-{prompt}", prompt_name=prompt, model=model,
        endpoint="http://127.0.0.1:1/v1", wire_format="openai", run_index=k,
        instruction_version="v1", instruction_sha256="0" * 64,
        measured_at=dt.datetime.combine(DAY, dt.time(10, k), tzinfo=dt.UTC),
        measurement_date=DAY, outcome=Outcome.OK if ok else Outcome.TIMEOUT_READ,
        parse_outcome=ParseOutcome.OK if ok else ParseOutcome.NOT_ATTEMPTED,
        ir_json=json.dumps(doc) if ok else None, node_ids=sorted(set(ids or [])),
        node_count=len(ids or []))


def panel_records(models: int, prompts: int, seed: int = 0) -> list[RunRecord]:
    rng = np.random.default_rng(seed)
    out = []
    for m in range(models):
        for p in range(prompts):
            for k in range(3):
                ids = ["A", "B"] + (["C"] if rng.random() < 0.3 * m else [])
                out.append(rec(f"model-{m}", f"p{p}", k, ids))
    return out


def write(root: Path, records: list[RunRecord]) -> None:
    RunStore(root, fsync=False).write(records)


def test_bootstrap_interval_is_scipy_bit_for_bit(tmp_path):
    write(tmp_path / "d", panel_records(3, 7))
    opts = AnalysisOptions(replicates=999, seed=11, interval="percentile")
    panel = run_analysis(tmp_path / "d", tmp_path / "o", opts).panels["main"]
    cells = pq.read_table(panel.paths["cells"]).to_pylist()
    for row in pq.read_table(panel.paths["models"]).to_pylist():
        vals = np.array([c["mean_jaccard"] for c in sorted(
            (c for c in cells if c["model"] == row["model"] and c["chosen_highest_budget_first"]),
            key=lambda c: c["prompt_sha256"])])
        if np.ptp(vals) == 0:
            assert row["jaccard_ci_low"] == row["jaccard_ci_high"] == vals[0]
            continue
        ref = bootstrap((vals,), np.mean, method="percentile", n_resamples=999,
                        rng=np.random.default_rng(11)).confidence_interval
        assert (row["jaccard_ci_low"], row["jaccard_ci_high"]) == (ref.low, ref.high)
    manifest = json.loads(panel.manifest_path.read_text())
    rb = manifest["summary"]["rank_bootstrap"]
    assert rb["usable"] + rb["unusable"] == 999


def test_default_interval_is_each_models_calibrated_betting_interval_with_its_coverage(tmp_path):
    from analysis.stats.mean_intervals import equal_n_intervals
    from analysis.stats.small_sample import Resampling

    write(tmp_path / "d", panel_records(3, 7))
    panel = run_analysis(tmp_path / "d", tmp_path / "o",
                         AnalysisOptions(replicates=999, seed=11)).panels["main"]
    cells = pq.read_table(panel.paths["cells"]).to_pylist()
    for row in pq.read_table(panel.paths["models"]).to_pylist():
        vals = np.array([c["mean_jaccard"] for c in sorted(
            (c for c in cells if c["model"] == row["model"] and c["chosen_highest_budget_first"]),
            key=lambda c: c["prompt_sha256"])])
        (ref,) = equal_n_intervals(vals[None, :], "calibrated_betting",
                                   Resampling(replicates=999, seed=11))
        assert (row["jaccard_ci_low"], row["jaccard_ci_high"]) == (ref.low, ref.high)
        assert row["ci_method"] == "calibrated_betting"
        assert 0.0 <= row["jaccard_ci_coverage"] <= 1.0


def test_one_model_and_one_prompt_are_documented_degenerate_results(tmp_path):
    write(tmp_path / "d1", panel_records(1, 4))
    p = run_analysis(tmp_path / "d1", tmp_path / "o1", AnalysisOptions(replicates=100))
    row = p.panels["main"].models.included.to_pylist()[0]
    assert (row["rank_set_low"], row["rank_set_high"], row["partition"]) == (1, 1, "undetermined")
    write(tmp_path / "d2", panel_records(3, 1))
    p = run_analysis(tmp_path / "d2", tmp_path / "o2",
                     AnalysisOptions(replicates=100, min_prompts=1))
    models = p.panels["main"].models.included.to_pylist()
    assert len(models) == 3
    for m in models:  # one value: the betting interval can exclude nothing
        assert (m["jaccard_ci_low"], m["jaccard_ci_high"]) == (0.0, 1.0)
    p = run_analysis(tmp_path / "d2", tmp_path / "o3",
                     AnalysisOptions(replicates=100, min_prompts=1, interval="studentized"))
    for m in p.panels["main"].models.included.to_pylist():
        # studentized: zero width inside (0, 1), the exact one-sided limit at 1
        low = 0.025 if m["mean_jaccard"] == 1.0 else m["mean_jaccard"]
        assert (m["jaccard_ci_low"], m["jaccard_ci_high"]) == pytest.approx((low, m["mean_jaccard"]))
    # with one prompt nothing can be established: every rank set is the whole board
    assert all((m["rank_set_low"], m["rank_set_high"]) == (1, 3) for m in models)


def test_all_failed_cells_list_every_model_as_excluded(tmp_path):
    write(tmp_path / "d", [rec(f"m{i}", f"p{j}", k, None) for i in range(2) for j in range(3)
                           for k in range(2)])
    panel = run_analysis(tmp_path / "d", tmp_path / "o", AnalysisOptions()).panels["main"]
    assert panel.models.included.num_rows == 0
    assert sorted(panel.models.excluded.column("model").to_pylist()) == ["m0", "m1"]
    for name in ("models", "pairs", "drift", "sensitivity", "correlations"):
        assert panel.paths[name].is_file()


def test_nan_imported_cells_are_not_included(tmp_path):
    rows = [CellMeasurement(
        measurement_id=measurement_id("imp", "c", "m", f"p{i}"), panel="imp", campaign="c",
        model="m", prompt_name=f"p{i}", prompt_sha256=f"s{i}", successful_runs=3,
        mean_nodes=4.0, std_nodes=0.0, mean_jaccard=float("nan") if i == 0 else 0.5,
        id_stability=0.5, mean_confidence=None, budget_rank=1, time_order=0,
        declared_budget=None, source="x.csv", measurement_date=DAY, date_is_window=True)
        for i in range(4)]
    CellStore(tmp_path / "d", fsync=False).write(rows)
    panel = run_analysis(tmp_path / "d", tmp_path / "o", AnalysisOptions(replicates=50)).panels["imp"]
    row = panel.models.included.to_pylist()[0]
    assert (row["n_prompts"], row["mean_jaccard"]) == (3, 0.5)
    assert panel.manifest["input"]["imported_cells_in_panel"] == 4


def test_corrupt_file_is_named_and_skipped_only_on_request(tmp_path):
    data = tmp_path / "d"
    write(data, panel_records(2, 3))
    write(data, [rec("model-9", "p0", 0, ["A"])])
    bad = next((data / "runs").rglob("*.parquet")).with_name("zz-corrupt.parquet")
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(CorruptDataError, match="zz-corrupt.parquet.*--skip-corrupt"):
        run_analysis(data, tmp_path / "o", AnalysisOptions(replicates=50))
    res = run_analysis(data, tmp_path / "o", AnalysisOptions(replicates=50, skip_corrupt=True))
    assert res.skipped_files == (str(bad),)
    assert res.runs_read == 2 * 3 * 3 + 1
    assert res.panels["main"].manifest["skipped_corrupt_files"] == [str(bad)]


def test_families_default_and_file(tmp_path):
    assert default_family("gpt-oss:120b") == default_family("gpt-oss:20b") == "gpt-oss"
    assert default_family("minimax-m2.1") == "minimax" and default_family("glm-4.7") == "glm"
    write(tmp_path / "d", panel_records(3, 6))
    fam = tmp_path / "fam.toml"
    fam.write_text('[families]\n"model-0" = "x"\n"model-2" = "x"\n')
    res = run_analysis(tmp_path / "d", tmp_path / "o",
                       AnalysisOptions(replicates=50, families_path=fam))
    pairs = res.panels["main"].tables["pairs"].to_pylist()
    assert [(p["family"], p["model_a"], p["model_b"]) for p in pairs] == [("x", "model-0", "model-2")]
    res = run_analysis(tmp_path / "d", tmp_path / "o2", AnalysisOptions(replicates=50,
                                                                        pair_scope="all"))
    assert res.panels["main"].tables["pairs"].num_rows == 3


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("analyze")(analyze_command)
    app.command("import-artifact")(import_artifact_command)
    return app


def test_cli_errors_are_one_line_not_tracebacks(tmp_path):
    runner = CliRunner()
    r = runner.invoke(_app(), ["analyze", "--data", str(tmp_path / "none"), "--out",
                               str(tmp_path / "o")])
    assert r.exit_code == 2 and "does not exist" in r.output and "Traceback" not in r.output
    r = runner.invoke(_app(), ["import-artifact", str(tmp_path), "--data", str(tmp_path / "d")])
    assert r.exit_code == 2 and "results/" in r.output
    write(tmp_path / "d", panel_records(3, 4))
    r = runner.invoke(_app(), ["analyze", "--data", str(tmp_path / "d"), "--out",
                               str(tmp_path / "o"), "--replicates", "200"])
    assert r.exit_code == 0, r.output
    assert "undetermined" in r.output or "clearly" in r.output
    assert (tmp_path / "o" / "main" / "sensitivity.parquet").is_file()
    with pytest.raises(NoRunsError):
        run_analysis(tmp_path / "d", tmp_path / "o", AnalysisOptions(models=["ghost"]))
