"""import-artifact on the real published artifact, and analyze on what it imported."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy.stats import wilcoxon

from analysis.pipeline import run_analysis
from storage.annotations import parse_annotations
from analysis.tables.cells import build_cells
from analysis.options import AnalysisOptions
from analysis.tables.families import FAMILIES_FILE, families_for, load_families
from orchestrator.jobs.artifact_import import import_artifact
from storage.cells import CellStore
from storage.runs import RunStore

MAPPING = Path(__file__).resolve().parents[2] / "examples" / "artifact_campaigns.toml"
CSV_CAMPAIGNS = ["ir_stability", "ir_stability_xmodel", "ir_stability_combined",
                 "ir_stability_minimax", "ir_stability_ministral", "ir_stability_qwen",
                 "ir_stability_scaled", "ir_stability_paid_tierB", "ir_stability_paid_tierC",
                 "ir_stability_paid_tierD"]
# NOTES.md: IRs that could not be copied; these cells lost a run and may differ from the CSV
LOST = {("gemma3:12b", "gen_014_extract_invoice_fields.prompt.rtpl"),
        ("gemma3:12b", "gen_015_detect_spam_comments.prompt.rtpl"),
        ("gpt-oss:120b", "code_review.prompt.rtpl"),
        ("minimax-m2.1", "code_review.prompt.rtpl"),
        ("minimax-m2.1", "content_moderation.prompt.rtpl"),
        ("mistral-large-3:675b", "gen_010_classify_incoming_emails.prompt.rtpl")}


@pytest.fixture(scope="module")
def imported(tmp_path_factory, artifact_dir):
    data = tmp_path_factory.mktemp("artifact-data")
    first = import_artifact(artifact_dir, data, MAPPING, fsync=False)
    second = import_artifact(artifact_dir, data, MAPPING, fsync=False)
    return data, first, second


def test_import_counts_and_idempotence(imported):
    data, first, second = imported
    assert first.runs_read == 283 + 5 and first.runs_written == 288
    assert first.runs_by_outcome == {"ok": 288}
    assert first.cells_read == 505 and first.cells_written == 505  # 274 annotated + 35 + 196
    assert (second.runs_written, second.cells_written) == (0, 0)
    runs = RunStore(data).read_table()
    assert runs.num_rows == 288
    assert set(runs.column("date_is_window").to_pylist()) == {True}
    assert {str(d) for d in runs.column("measurement_date").to_pylist()} == {"2026-05-30"}
    cells = CellStore(data).read_table()
    assert cells.num_rows == 505
    assert dict(zip(*np.unique(cells.column("panel").to_pylist(), return_counts=True))) == {
        "annotated": 274, "real": 35, "recovery": 196}
    # prompt keys are sha256 of the corpus file; some SKILL.md files are not in the copy
    for panel, sha in zip(runs.column("panel").to_pylist(), runs.column("prompt_sha256").to_pylist()):
        assert panel != "annotated" or len(sha) == 64
    assert first.missing_prompt_files and all(
        m.lower().endswith("_skill.md") for m in first.missing_prompt_files)
    lost = [c for c in first.coverage if c.runs_found == 0 and c.model == "gpt-oss:20b"]
    assert lost and all(c.csv_successful_runs >= 2 for c in lost)  # never persisted


def test_recomputed_cells_equal_csv_where_runs_complete(imported):
    data, _, _ = imported
    cells = build_cells(RunStore(data).read_table()).to_pylist()
    csv = CellStore(data).read_table().to_pylist()
    by: dict = {}
    for c in csv:
        by.setdefault((c["panel"], c["model"], c["prompt_name"]), []).append(c)
    matched, differing = 0, []
    for c in cells:
        rows = by.get((c["panel"], c["model"], c["prompt_name"]), [])
        if c["runs_ok"] < 2 or not rows:
            continue
        same = [r for r in rows if r["successful_runs"] == c["runs_ok"]
                and round(c["mean_jaccard"], 3) == r["mean_jaccard"]
                and round(c["id_stability"], 3) == r["id_stability"]]
        if same:
            matched += 1
        else:
            differing.append((c["model"], c["prompt_name"], c["runs_ok"],
                              max(r["successful_runs"] for r in rows)))
    assert matched == 91
    # every differing cell is one that lost runs (fewer found than any campaign's count)
    assert {(m, p) for m, p, _, _ in differing} == LOST
    assert all(found < csv_n for _, _, found, csv_n in differing)


@pytest.fixture(scope="module")
def analysed(imported, tmp_path_factory, artifact_dir):
    data, _, _ = imported
    out = tmp_path_factory.mktemp("artifact-out")
    opts = AnalysisOptions(panel="annotated", replicates=2000,
                           corpus_dirs=[artifact_dir / "corpus" / "synthetic"])
    return run_analysis(data, out, opts).panels["annotated"], artifact_dir


def test_analyze_outputs_on_artifact(analysed):
    panel, artifact = analysed
    files = {p.name for p in panel.directory.iterdir()}
    assert files >= {f"{n}.parquet" for n in (
        "cells", "models", "excluded", "pairs", "sensitivity", "drift", "stabilisation",
        "correctness", "correlations", "normalised")} | {"manifest.json"}
    models = pq.read_table(panel.paths["models"])
    need = {"model", "n_prompts", "mean_jaccard", "jaccard_ci_low", "jaccard_ci_high",
            "id_stability", "id_ci_low", "id_ci_high", "perfect", "mean_nodes", "rank",
            "rank_held", "rank_ci_low", "rank_ci_high", "rank_set_low", "rank_set_high",
            "partition"}
    assert need <= set(models.column_names)
    assert models.column("model").to_pylist()[-1] == "gpt-oss:120b"
    assert pq.read_table(panel.paths["excluded"]).column("model").to_pylist() == ["glm-4.7"]
    corr = pq.read_table(panel.paths["correctness"])
    assert corr.num_rows == 283  # every annotated raw IR
    row = corr.to_pylist()[0]
    text = (artifact / "corpus" / "synthetic" / row["prompt"]).read_text(encoding="utf-8")
    assert row["n_truth"] == len(parse_annotations(text).ids)
    assert pq.read_table(panel.paths["drift"]).num_rows == 97
    pairs = pq.read_table(panel.paths["pairs"]).to_pylist()
    # §4.2's within-family contrasts come from the families the import recorded, no flags
    assert {(p["model_a"], p["model_b"], p["family"]) for p in pairs} == {
        ("gpt-oss:120b", "gpt-oss:20b", "gpt-oss"), ("minimax-m2.1", "minimax-m2.7", "minimax"),
        ("ministral-3:8b", "mistral-large-3:675b", "mistral")}
    assert panel.manifest["families_source"].endswith("families.toml")


def test_import_records_the_studys_families(imported, tmp_path):
    data, _, _ = imported
    assert load_families(data / FAMILIES_FILE) == {
        "ministral-3:8b": "mistral", "mistral-large-3:675b": "mistral",
        "gpt-oss:20b": "gpt-oss", "gpt-oss:120b": "gpt-oss"}
    # an explicit --families file wins over the recorded one
    own = tmp_path / "fam.toml"
    own.write_text('[families]\n"ministral-3:8b" = "ministral"\n', encoding="utf-8")
    fams, source = families_for(data, own)
    assert fams == {"ministral-3:8b": "ministral"} and source == str(own)
    # without a recorded file (a plain run store) the default rule applies
    assert families_for(tmp_path, None) == ({}, "default rule")


def _pair_check(panel, model_a: str, model_b: str) -> tuple[dict, np.ndarray]:
    """The pairs.parquet row of (model_a, model_b) and its per-prompt differences b − a,
    recomputed from cells.parquet's chosen cells."""
    cells = pq.read_table(panel.paths["cells"]).to_pylist()
    chosen = {(c["model"], c["prompt_sha256"]): c["mean_jaccard"] for c in cells
              if c["chosen_highest_budget_first"]}
    a = {p: v for (m, p), v in chosen.items() if m == model_a}
    b = {p: v for (m, p), v in chosen.items() if m == model_b}
    d = np.round(np.array([b[p] - a[p] for p in sorted(set(a) & set(b))]), 12)
    row = [p for p in pq.read_table(panel.paths["pairs"]).to_pylist()
           if (p["model_a"], p["model_b"]) == (model_a, model_b)][0]
    return row, d


@pytest.mark.parametrize("model_a, model_b, n", [
    ("gpt-oss:120b", "gpt-oss:20b", None), ("ministral-3:8b", "mistral-large-3:675b", 18)])
def test_pairs_agree_with_scipy(analysed, model_a, model_b, n):
    panel, _ = analysed
    row, d = _pair_check(panel, model_a, model_b)
    assert row["n_common"] == d.size and (n is None or d.size == n)
    assert row["mean_diff"] == pytest.approx(d.mean())
    assert row["p_drop"] == pytest.approx(wilcoxon(d, zero_method="wilcox").pvalue, rel=1e-12)
    assert row["p_zsplit"] == pytest.approx(wilcoxon(d, zero_method="zsplit").pvalue, rel=1e-12)


def test_merge_figures_on_csv_campaigns(imported, tmp_path):
    data, _, _ = imported
    res = run_analysis(data, tmp_path, AnalysisOptions(panel="annotated", campaigns=CSV_CAMPAIGNS,
                                                       replicates=200))
    merge = res.panels["annotated"].manifest["summary"]["merge"]
    # the published tables' figures (tests/analysis/test_merge.py): 35/127 vs 26/127, 75 cells change
    assert merge["cells"] == {"highest-budget-first": 127, "earliest-then-top-up": 127}
    assert merge["share_perfect"]["highest-budget-first"] == pytest.approx(35 / 127)
    assert merge["share_perfect"]["earliest-then-top-up"] == pytest.approx(26 / 127)
    assert merge["cells_changing_source"] == 75 and merge["cells_changing_perfect"] == 15
    sens = pq.read_table(res.panels["annotated"].paths["sensitivity"]).to_pylist()
    base = [r for r in sens if r["axis"] == "baseline"]
    assert base and all(r["headline_shift"] == 0 for r in base)
    other = [r for r in sens if r["merge_rule"] == "earliest-then-top-up" and r["min_runs"] == 2
             and r["min_prompts"] == 3]
    assert other[0]["headline_shift"] == pytest.approx(-9 / 127)
