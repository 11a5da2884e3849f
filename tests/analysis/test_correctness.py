"""Correctness scores: definitions by hand, edge cases, and real artifact prompts + IRs."""

import json

import numpy as np
import pytest

from analysis.errors import AnalysisError
from tests.support.paths import ARTIFACT

from analysis.metrics.correctness import (
    emitted_from_json,
    model_means,
    score_run,
    score_runs,
    truth_ids,
)

ART = ARTIFACT


def test_definitions_by_hand():
    s = score_run({"A", "B", "C", "D"}, ["A", "B", "X", "A"], ["A", "X"])
    assert s.recall == pytest.approx(2 / 4)
    assert s.all_precision == pytest.approx(2 / 3)  # distinct emitted {A, B, X}
    assert s.explicit_precision == pytest.approx(1 / 2)
    assert s.f1 == pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5))
    assert (s.n_truth, s.n_emitted, s.n_explicit, s.no_explicit) == (4, 3, 2, False)


def test_edge_cases():
    empty_truth = score_run(set(), ["A"], [])
    assert empty_truth.recall == 1.0 and empty_truth.all_precision == 0.0
    assert empty_truth.no_explicit and empty_truth.explicit_precision == 0.0
    assert empty_truth.f1 == 0.0  # precision 0, recall 1 → 0 (2·0·1/1)
    nothing = score_run({"A"}, [], [])
    assert (nothing.recall, nothing.all_precision, nothing.f1) == (0.0, 0.0, 0.0)
    both_empty = score_run(set(), [], [])
    assert both_empty.recall == 1.0 and both_empty.f1 == 0.0


def test_emitted_parsing():
    doc = {"nodes": [
        {"id": "A", "meta": {"inferred": False}},
        {"id": "B", "meta": {"inferred": "false"}},
        {"id": "C", "meta": {"inferred": True}},
        {"id": "A", "meta": {"inferred": True}},
        {"kind": "Rule"},
        "junk",
    ]}
    emitted, explicit = emitted_from_json(json.dumps(doc))
    assert emitted == {"A", "B", "C"} and explicit == {"A", "B"}
    assert emitted_from_json("{}") == (frozenset(), frozenset())
    with pytest.raises(ValueError):
        emitted_from_json("```json nope")


def test_model_means_are_run_weighted():
    scores = score_runs([{"A"}, {"A"}, {"A", "B"}],
                        [{"A"}, {"B"}, {"A"}],
                        [{"A"}, set(), {"A"}])
    np.testing.assert_allclose(scores[:, 0], [1.0, 0.0, 0.5])
    mm = model_means(["m2", "m1", "m1"], scores, no_explicit=[False, True, False])
    assert mm.models == ("m1", "m2") and list(mm.runs) == [2, 1]
    np.testing.assert_allclose(mm.recall, [0.25, 1.0])
    np.testing.assert_allclose(mm.all_precision, [0.5, 1.0])
    assert list(mm.no_explicit_runs) == [1, 0]
    with pytest.raises(AnalysisError):
        score_runs([set()], [], [])


@pytest.mark.usefixtures("artifact_dir")  # a clear error when the artifact is not there
def test_real_prompt_and_ir():
    prompt = (ART / "corpus/synthetic/code_review.prompt.rtpl").read_text()
    truth = truth_ids(prompt)
    assert {"RULE:ROLE", "CONDITION:LANGUAGE", "BREAKPOINT:BEFORE_VERDICT"} <= truth
    ir = (ART / "results/irs/gemma3_12b/code_review.prompt_r0.json").read_text()
    emitted, explicit = emitted_from_json(ir)
    s = score_run(truth, emitted, explicit)
    assert 0.0 < s.recall <= 1.0 and 0.0 < s.all_precision <= 1.0
    assert s.recall == pytest.approx(len(truth & emitted) / len(truth))
    # gemma3 emits the annotated ids verbatim for this prompt
    assert {"RULE:ROLE", "CONDITION:LANGUAGE"} <= emitted & explicit


# --- correlations (analysis/stats/correlations.py) -------------------------------------------------
from scipy import stats  # noqa: E402

from analysis.stats.correlations import correlate, leave_one_out, stability_vs_correctness  # noqa: E402


def test_correlate_matches_scipy_and_handles_degenerate():
    rng = np.random.default_rng(0)
    x = rng.uniform(size=9)
    y = 0.5 * x + rng.normal(0, 0.1, 9)
    c = correlate(x, y)
    assert c.pearson_r == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert c.pearson_p == pytest.approx(stats.pearsonr(x, y).pvalue)
    # Spearman = Pearson of ranks
    assert c.spearman_rho == pytest.approx(np.corrcoef(stats.rankdata(x), stats.rankdata(y))[0, 1])
    assert np.isnan(correlate(x[:2], y[:2]).pearson_r)
    assert np.isnan(correlate(np.ones(5), y[:5]).spearman_rho)


def test_leave_one_out_detects_a_single_influential_model():
    # 7 unrelated points plus one extreme point that creates the correlation on its own.
    rng = np.random.default_rng(3)
    x = np.append(rng.uniform(0.4, 0.6, 7), 5.0)
    y = np.append(rng.uniform(0.4, 0.6, 7), 5.0)
    names = [f"m{i}" for i in range(8)]
    loo = leave_one_out(x, y, names)
    assert loo.full.pearson_p < 0.05
    assert not loo.pearson_significant[7] and loo.pearson_significant[:7].all()
    assert not loo.survives_pearson and loo.max_change_model == "m7"
    manual = [stats.pearsonr(np.delete(x, i), np.delete(y, i)).statistic for i in range(8)]
    np.testing.assert_allclose(loo.pearson_r, manual)
    jack = np.sqrt(7 / 8 * np.sum((np.array(manual) - np.mean(manual)) ** 2))
    assert loo.jackknife_se_r == pytest.approx(jack)
    assert not loo.small_n


def test_strong_association_survives_and_metric_table():
    x = np.linspace(0.5, 1.0, 10)
    y = x + np.array([0.01, -0.02, 0.015, 0.0, -0.01, 0.02, -0.015, 0.01, 0.0, -0.005])
    res = stability_vs_correctness(x, [("recall", y), ("f1", np.append(y[:-1], np.nan))],
                                   [f"m{i}" for i in range(10)])
    assert [r.metric for r in res] == ["recall", "f1"]
    assert res[0].loo.survives_pearson and res[0].loo.survives_spearman
    assert res[1].full.n == 9 and len(res[1].loo.dropped) == 9
