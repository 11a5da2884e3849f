"""Merge precedence rules: unit cases and the published per-campaign tables (NOTES.md figures)."""

from pathlib import Path

import pytest

from analysis.merge import (
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
    with pytest.raises(ValueError, match="no entry"):
        merge_earliest_then_top_up([row("x")], {"y": 0})
    with pytest.raises(ValueError, match="twice"):
        merge_earliest_then_top_up([row("x"), row("x")], {"x": 0})
    bad = tmp_path / "bad.csv"
    bad.write_text("prompt,model,successful_runs\r\np,m,three\r\n")
    with pytest.raises(ValueError, match="bad.csv:2"):
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
