"""Merge precedence rules: unit cases and the published per-campaign tables (NOTES.md figures)."""

import dataclasses
from pathlib import Path

import pytest

from analysis.errors import AnalysisError
from analysis.tables.merge import (
    CellRow,
    compare_merges,
    merge_earliest_then_top_up,
    merge_highest_budget_first,
    read_cell_csv,
)

RESULTS = Path("/work/shared/paper-artifact/results")
BY_BUDGET = ["ir_stability_paid_tierD.csv", "ir_stability_paid_tierC.csv",
             "ir_stability_paid_tierB.csv", "ir_stability_scaled.csv",
             "ir_stability_combined.csv", "ir_stability_qwen.csv", "ir_stability_ministral.csv",
             "ir_stability_minimax.csv", "ir_stability_xmodel.csv", "ir_stability.csv"]
BY_TIME = ["ir_stability.csv", "ir_stability_xmodel.csv", "ir_stability_combined.csv",
           "ir_stability_minimax.csv", "ir_stability_ministral.csv", "ir_stability_qwen.csv",
           "ir_stability_scaled.csv", "ir_stability_paid_tierB.csv",
           "ir_stability_paid_tierC.csv", "ir_stability_paid_tierD.csv"]
BUDGET = {c: len(BY_BUDGET) - i for i, c in enumerate(BY_BUDGET)}
TIME = {c: i for i, c in enumerate(BY_TIME)}


def row(campaign, prompt="p1", model="m", jac=1.0, ids=1.0):
    return CellRow(campaign, prompt, model, 3, 8.0, 0.0, jac, ids, 1.0)


def test_rules_on_small_panel_with_budget_tie():
    rows = [row("early", "p1", jac=0.9), row("late", "p1"), row("big", "p1", jac=0.5),
            row("early", "p2"), row("late", "p3", jac=0.8)]
    budget = {"early": 1, "late": 1, "big": 2}
    time = {"early": 0, "big": 1, "late": 2}
    h = merge_highest_budget_first(rows, budget, time)
    assert h.provenance == (("m", "p1", "big"), ("m", "p2", "early"), ("m", "p3", "late"))
    e = merge_earliest_then_top_up(rows, time)
    assert e.provenance == (("m", "p1", "early"), ("m", "p2", "early"), ("m", "p3", "late"))
    # tie in budget between early and late → the later campaign wins
    tie = merge_highest_budget_first([row("early"), row("late", jac=0.7)], budget, time)
    assert tie.provenance == (("m", "p1", "late"),)
    cmp = compare_merges(h, e)
    assert [(c.prompt, c.row_a.campaign, c.row_b.campaign) for c in cmp.changes] == [
        ("p1", "big", "early")]
    assert cmp.share_perfect_a == pytest.approx(1 / 3) and cmp.share_perfect_b == pytest.approx(1 / 3)
    assert cmp.changes[0].perfect_changed is False  # 0.5 and 0.9 are both imperfect


def test_validation_errors(tmp_path):
    with pytest.raises(AnalysisError, match="no entry"):
        merge_earliest_then_top_up([row("x")], {"y": 0})
    with pytest.raises(AnalysisError, match="twice"):
        merge_earliest_then_top_up([row("x"), row("x")], {"x": 0})
    bad = tmp_path / "bad.csv"
    bad.write_text("prompt,model,successful_runs\r\np,m,three\r\n")
    with pytest.raises(AnalysisError, match="bad.csv:2"):
        read_cell_csv(bad)


@pytest.fixture(scope="module")
def published():
    rows = [r for f in BY_TIME for r in read_cell_csv(RESULTS / f)]
    return rows, merge_highest_budget_first(rows, BUDGET, TIME), merge_earliest_then_top_up(rows, TIME)


def test_published_tables_read(published):
    rows, _, _ = published
    per_file = {f: len(read_cell_csv(RESULTS / f)) for f in BY_TIME}
    # NOTES.md row counts
    assert per_file == {"ir_stability.csv": 26, "ir_stability_xmodel.csv": 36,
                        "ir_stability_combined.csv": 56, "ir_stability_minimax.csv": 3,
                        "ir_stability_ministral.csv": 19, "ir_stability_qwen.csv": 20,
                        "ir_stability_scaled.csv": 21, "ir_stability_paid_tierB.csv": 38,
                        "ir_stability_paid_tierC.csv": 12, "ir_stability_paid_tierD.csv": 43}
    assert len(rows) == 274
    assert read_cell_csv(RESULTS / "ir_stability_deepseek.csv") == ()


def test_published_highest_budget_first_matches_notes(published):
    _, h, _ = published
    # NOTES.md: `scaled` supplies 9 gemma3 cells, `ir_stability.csv` gemma3 gen_007 and
    # `ministral` ministral gen_016
    gemma = dict(h.by_campaign("gemma3:12b"))
    assert gemma == {"ir_stability.csv": 1, "ir_stability_paid_tierC.csv": 12,
                     "ir_stability_scaled.csv": 9}
    first = [r.prompt for r in h.rows if r.model == "gemma3:12b" and r.campaign == "ir_stability.csv"]
    assert first == ["gen_007_generate_release_notes.prompt.rtpl"]
    mini = [r.prompt for r in h.rows
            if r.model == "ministral-3:8b" and r.campaign == "ir_stability_ministral.csv"]
    assert mini == ["gen_016_answer_hr_policy_questions.prompt.rtpl"]
    assert dict(h.by_campaign("qwen3-coder-next")) == {"ir_stability_paid_tierB.csv": 20}


def test_published_comparison_figures(published):
    _, h, e = published
    assert len(h.rows) == len(e.rows) == 127
    assert dict(e.by_campaign("gpt-oss:20b")) == {"ir_stability.csv": 13,
                                                  "ir_stability_xmodel.csv": 7}
    cmp = compare_merges(h, e)
    # measured on the published tables: 35/127 vs 26/127 node-set-perfect cells
    assert cmp.share_perfect_a == pytest.approx(35 / 127)
    assert cmp.share_perfect_b == pytest.approx(26 / 127)
    assert cmp.shift == pytest.approx(-9 / 127)
    assert len(cmp.changes) == 75
    assert sum(c.perfect_changed for c in cmp.changes) == 15


# ------------------------------------------------- vectorised merge_cells vs the row-wise rules

import datetime as dt  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from analysis.tables.measurements import (  # noqa: E402
    AUDIT_CELL_SCHEMA,
    chosen_flags,
    measurement_cells,
    merge_cells,
    precedence,
)


def _random_cells(seed: int, n: int = 400) -> pa.Table:
    rng = np.random.default_rng(seed)
    camps = ["c0", "c1", "c2", "c3"]
    rows = []
    for _i in range(n):
        jac = float(rng.choice([1.0, 0.5, 0.75, 1.0]))
        rows.append({
            "panel": "p", "campaign": camps[rng.integers(4)], "model": f"m{rng.integers(5)}",
            "prompt_sha256": f"s{rng.integers(12):02d}", "prompt_name": "x",
            "budget_max_tokens": [None, 100, 200][rng.integers(3)],
            "runs_total": 3, "runs_ok": int(rng.integers(1, 4)), "included": bool(rng.random() < .8),
            "mean_jaccard": jac, "id_stability": float(rng.choice([1.0, 0.9])),
            "node_set_perfect": None, "mean_nodes": [None, 4.0][rng.integers(2)],
            "std_nodes": 0.5, "count_agreement": None, "count_equal_share": None,
            "first_date": dt.date(2026, 1, 1 + int(rng.integers(5))),
            "last_date": dt.date(2026, 2, 1), "source": ["runs", "imported:x"][rng.integers(2)]})
    return pa.Table.from_pylist(rows, schema=AUDIT_CELL_SCHEMA)


def _reference_merge(cells: pa.Table, budget, time):
    """The previous row-wise implementation: CellRow objects through analysis.tables.merge."""
    rows = [r for r in cells.to_pylist() if r["included"]]
    best = {}
    for i, r in enumerate(rows):
        k = (r["campaign"], r["model"], r["prompt_sha256"])
        b = r["budget_max_tokens"] if r["budget_max_tokens"] is not None else -1
        if k not in best or b > (rows[best[k]]["budget_max_tokens"] or -1):
            best[k] = i
    inc = [rows[i] for i in sorted(best.values())]
    nan = float("nan")
    cr = [CellRow(r["campaign"], r["prompt_sha256"], r["model"], r["runs_ok"],
                  r["mean_nodes"] if r["mean_nodes"] is not None else nan, r["std_nodes"],
                  r["mean_jaccard"], r["id_stability"], nan) for r in inc]
    index = {(r.campaign, r.model, r.prompt): i for i, r in enumerate(cr)}
    h = merge_highest_budget_first(cr, budget, time)
    e = merge_earliest_then_top_up(cr, time)
    tables = {m.rule: [inc[index[(r.campaign, r.model, r.prompt)]] for r in m.rows]
              for m in (h, e)}
    return tables, compare_merges(h, e)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorised_merge_cells_equals_rowwise_rules(seed):
    cells = _random_cells(seed)
    budget = {"c0": 1, "c1": 3, "c2": 3, "c3": 0}  # c1/c2 budget tie → later wins
    time = {"c0": 0, "c1": 2, "c2": 1, "c3": 3}
    got = merge_cells(cells, budget, time)
    ref_tables, ref_cmp = _reference_merge(cells, budget, time)
    for rule, rows in ref_tables.items():
        assert got.tables[rule].to_pylist() == rows, rule
    c = got.comparison
    assert (c.rule_a, c.rule_b, c.n_cells_a, c.n_cells_b) == (
        ref_cmp.rule_a, ref_cmp.rule_b, ref_cmp.n_cells_a, ref_cmp.n_cells_b)
    assert c.share_perfect_a == ref_cmp.share_perfect_a
    assert c.share_perfect_b == ref_cmp.share_perfect_b and c.shift == ref_cmp.shift
    assert len(c.changes) == len(ref_cmp.changes) > 0
    for a, b in zip(c.changes, ref_cmp.changes):
        assert (a.model, a.prompt, a.row_a.campaign, a.row_b.campaign, a.perfect_changed) == (
            b.model, b.prompt, b.row_a.campaign, b.row_b.campaign, b.perfect_changed)
    flags = chosen_flags(cells, got)
    rows = cells.to_pylist()
    for rule, chosen in ref_tables.items():
        keys = {tuple(r[k] for k in ("campaign", "model", "prompt_sha256",
                                     "budget_max_tokens", "source")) for r in chosen}
        expect = [tuple(r[k] for k in ("campaign", "model", "prompt_sha256",
                                       "budget_max_tokens", "source")) in keys for r in rows]
        assert flags[rule].tolist() == expect
    # the source-row shortcut and the key lookup agree (and the lookup still works alone)
    by_key = chosen_flags(cells, dataclasses.replace(got, source_rows=None))
    assert {r: f.tolist() for r, f in by_key.items()} == {r: f.tolist() for r, f in flags.items()}
    assert got.source_rows is not None and all(f.any() for f in flags.values())


def test_merge_cells_names_a_campaign_missing_from_the_mapping():
    cells = _random_cells(0, 40)
    with pytest.raises(AnalysisError, match="no entry in the precedence mapping"):
        merge_cells(cells, {"c0": 1}, {"c0": 0, "c1": 1, "c2": 2, "c3": 3})
    empty = merge_cells(cells.slice(0, 0), {}, {})
    assert all(t.num_rows == 0 for t in empty.tables.values())
    assert empty.comparison.changes == () and empty.comparison.shift == 0.0


def test_measurement_cells_columnwise_rules():
    nan = float("nan")
    rows = pa.table({
        "panel": ["a"] * 5, "campaign": ["c"] * 5, "model": ["m"] * 5,
        "prompt_sha256": list("vwxyz"), "prompt_name": list("VWXYZ"),
        "successful_runs": pa.array([3, 1, 3, 3, 2], pa.int64()),
        "mean_jaccard": [1.0, 1.0, nan, None, 0.5], "id_stability": [1.0, 1.0, 1.0, 1.0, 0.25],
        "mean_nodes": [4.0, nan, None, 2.0, 3.0], "std_nodes": [0.0, 0.0, 0.0, 0.0, nan],
        "source": ["csv"] * 5,
        "measurement_date": [dt.date(2026, 5, 30)] * 5,
        "window_end": [dt.date(2026, 6, 11), None, None, None, None],
        "budget_rank": [1] * 5, "time_order": [0] * 5})
    t = measurement_cells(rows, min_runs=2)
    assert t.schema.equals(AUDIT_CELL_SCHEMA, check_metadata=False)
    assert t.schema.metadata[b"irbench.min_runs"] == b"2"
    assert t.column("included").to_pylist() == [True, False, False, False, True]
    assert t.column("mean_jaccard").to_pylist() == [1.0, 1.0, None, None, 0.5]
    assert t.column("node_set_perfect").to_pylist() == [True, True, None, None, False]
    assert t.column("mean_nodes").to_pylist() == [4.0, None, None, 2.0, 3.0]
    assert t.column("std_nodes").to_pylist() == [0.0, 0.0, 0.0, 0.0, None]
    assert t.column("last_date").to_pylist() == [dt.date(2026, 6, 11)] + [dt.date(2026, 5, 30)] * 4
    assert set(t.column("source").to_pylist()) == {"imported:csv"}
    assert t.column("runs_ok").to_pylist() == [3, 1, 3, 3, 2]
    budget, time = precedence(t, rows)
    assert budget == {"c": 1} and time == {"c": 0}
