"""Per-cell metrics against hand-computed values, closed forms and a naive reference."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.errors import AnalysisError
from analysis.metrics.agreement import (
    count_agreement,
    id_stability,
    is_node_set_perfect,
    node_set_agreement,
    node_set_jaccard,
    normalise_id,
    normalised_jaccard,
)


def naive_jaccard(sets: list[set[str]]) -> Fraction:
    """Independent reference: exact fractions, plain loops."""
    scores = []
    for a, b in itertools.combinations(sets, 2):
        u = a | b
        scores.append(Fraction(1) if not u else Fraction(len(a & b), len(u)))
    return sum(scores, Fraction(0)) / len(scores)


# ---------------------------------------------------------------- hand-computed


def test_known_three_run_example() -> None:
    # A={a,b,c}, B={a,b,d}, C={a}
    #   A,B: ∩={a,b} (2), ∪={a,b,c,d} (4) -> 1/2
    #   A,C: ∩={a} (1),   ∪={a,b,c} (3)   -> 1/3
    #   B,C: ∩={a} (1),   ∪={a,b,d} (3)   -> 1/3
    #   mean = (1/2 + 1/3 + 1/3) / 3 = 7/18
    #   ID-stability: ∩ of all = {a} (1), ∪ of all = {a,b,c,d} (4) -> 1/4
    sets = [{"a", "b", "c"}, {"a", "b", "d"}, {"a"}]
    assert node_set_jaccard(sets) == pytest.approx(7 / 18, abs=1e-15)
    assert id_stability(sets) == 0.25
    agg = node_set_agreement(sets)
    assert (agg.mean_jaccard, agg.id_stability, agg.node_set_perfect) == (
        pytest.approx(7 / 18, abs=1e-15),
        0.25,
        False,
    )


def test_r2() -> None:
    assert node_set_jaccard([{"a", "b"}, {"b", "c"}]) == pytest.approx(1 / 3)
    assert id_stability([{"a", "b"}, {"b", "c"}]) == pytest.approx(1 / 3)
    assert node_set_jaccard([{"a"}, {"b"}]) == 0.0


def test_r5() -> None:
    # four runs {x}, one run {x,y}: 6 pairs score 1, 4 pairs score 1/2 -> (6 + 2)/10 = 0.8
    sets = [{"x"}] * 4 + [{"x", "y"}]
    assert node_set_jaccard(sets) == pytest.approx(0.8, abs=1e-15)
    assert id_stability(sets) == 0.5


def test_empty_irs() -> None:
    assert node_set_jaccard([set(), set()]) == 1.0
    assert id_stability([set(), set()]) == 1.0
    assert node_set_jaccard([set(), {"a"}]) == 0.0
    assert id_stability([set(), {"a"}]) == 0.0
    # three runs, one empty: pairs (∅,a)=0, (∅,a)=0, (a,a)=1 -> 1/3
    assert node_set_jaccard([set(), {"a"}, {"a"}]) == pytest.approx(1 / 3)
    assert node_set_agreement([set(), set(), set()]).node_set_perfect


def test_duplicate_ids_use_set_semantics() -> None:
    runs = [["a", "a", "b"], ["a", "b"], ["b", "a", "b"]]
    assert node_set_jaccard(runs) == 1.0  # type: ignore[arg-type]
    assert id_stability(runs) == 1.0  # type: ignore[arg-type]
    assert node_set_agreement(runs).node_set_perfect  # type: ignore[arg-type]


def test_needs_two_runs() -> None:
    with pytest.raises(AnalysisError, match="at least 2 runs"):
        node_set_jaccard([{"a"}])
    with pytest.raises(AnalysisError, match="at least 2 runs"):
        count_agreement([3])
    with pytest.raises(AnalysisError):
        id_stability([])
    assert id_stability([{"a"}]) == 1.0


def test_is_node_set_perfect_exact() -> None:
    assert is_node_set_perfect(1.0, 1.0)
    assert not is_node_set_perfect(1.0, 0.999)
    assert not is_node_set_perfect(1 - 1e-16, 1.0)
    # a large near-miss stays below 1: 1000 ids, one missing in one of 10 runs
    big = {str(i) for i in range(1000)}
    sets = [big] * 9 + [big - {"0"}]
    agg = node_set_agreement(sets)
    assert not agg.node_set_perfect
    assert not is_node_set_perfect(agg.mean_jaccard, agg.id_stability)
    assert agg.mean_jaccard < 1.0


@pytest.mark.parametrize(
    ("counts", "agreement", "equal_share"),
    [
        ([3, 3], 1.0, 1.0),
        ([0, 0], 1.0, 1.0),  # max(1, 0, 0) = 1 avoids 0/0
        ([0, 1], 0.0, 0.0),
        ([4, 2], 0.5, 0.0),
        # pairs (2,4)=1/2, (2,4)=1/2, (4,4)=1 -> 2/3; one equal pair of three
        ([2, 4, 4], 2 / 3, 1 / 3),
        # pairs: (5,10)=.5 (5,5)=1 (5,10)=.5 (10,5)=.5 (10,10)=1 (5,10)=.5 -> 4/6
        ([5, 10, 5, 10], 4 / 6, 2 / 6),
    ],
)
def test_count_agreement(counts: list[int], agreement: float, equal_share: float) -> None:
    got = count_agreement(counts)
    assert got == (pytest.approx(agreement, abs=1e-15), pytest.approx(equal_share, abs=1e-15))


# ---------------------------------------------------------------- normaliser


@pytest.mark.parametrize(
    ("raw", "unicode", "ascii"),
    [
        ("SECTION:X", "x", "x"),
        ("SECTION_X", "x", "x"),
        ("section-x", "x", "x"),
        ("RULE:SECTION:Foo Bar", "foo_bar", "foo_bar"),  # repeated stripping
        ("NODE-node_x", "x", "x"),
        ("Rule:", "", ""),
        ("rules:x", "rules_x", "rules_x"),  # 'rules' is not a prefix
        ("__A--B__", "a_b", "a_b"),
        ("RULE:prüfung", "prüfung", "pr_fung"),
        ("规则_一", "规则_一", ""),
        ("RULE:规则", "规则", ""),
        ("CONDITION:Größe über 10", "größe_über_10", "gr_e_ber_10"),
        ("rule:pru\u0308fung", "prüfung", "pru_fung"),  # NFD input; unicode variant composes
        ("RULE:नियम_एक", "नियम_एक", ""),  # Devanagari marks stay inside the word
    ],
)
def test_normalise_id(raw: str, unicode: str, ascii: str) -> None:
    assert normalise_id(raw) == unicode
    assert normalise_id(raw, "unicode") == unicode
    assert normalise_id(raw, "ascii") == ascii


def test_normalise_id_rejects_unknown_variant() -> None:
    with pytest.raises(AnalysisError, match="variant"):
        normalise_id("x", "latin1")  # type: ignore[arg-type]


def test_normalised_jaccard_collisions_and_empties() -> None:
    runs = [{"SECTION:X", "section-x", "RULE:Y"}, {"SECTION_X", "y"}]
    res = normalised_jaccard(runs)
    assert res.mean_jaccard == 1.0
    assert res.colliding_ids == 2  # SECTION:X and section-x in run 1
    assert res.empty_ids == 0
    assert node_set_jaccard(runs) == 0.0  # raw ids share nothing

    cjk = [{"规则_一", "RULE:A"}, {"规则_二", "rule_a"}]
    uni = normalised_jaccard(cjk, "unicode")
    asc = normalised_jaccard(cjk, "ascii")
    # unicode: {规则_一, a} vs {规则_二, a} -> 1/3
    assert uni.mean_jaccard == pytest.approx(1 / 3)
    assert uni.empty_ids == 0
    # ascii: both CJK ids become "" -> {"", a} vs {"", a} -> 1 (the study's inflation)
    assert asc.mean_jaccard == 1.0
    assert asc.empty_ids == 2
    # two empty normalised sets: denominator max(1, 0) -> 0, unlike the raw Jaccard
    assert normalised_jaccard([set(), set()]).mean_jaccard == 0.0


# ---------------------------------------------------------------- properties

ids = st.sampled_from(["a", "b", "c", "d", "e", "f"])
id_set = st.frozensets(ids, max_size=6)
runs_strategy = st.lists(id_set, min_size=2, max_size=6)


@settings(max_examples=200, deadline=None)
@given(runs=runs_strategy, data=st.data())
def test_jaccard_properties(runs: list[frozenset[str]], data: st.DataObject) -> None:
    j = node_set_jaccard(runs)
    assert 0.0 <= j <= 1.0
    assert j == pytest.approx(float(naive_jaccard([set(r) for r in runs])), abs=1e-12)
    perm = data.draw(st.permutations(runs))
    assert node_set_jaccard(perm) == pytest.approx(j, abs=1e-12)
    all_equal = all(r == runs[0] for r in runs)
    assert (j == 1.0) == all_equal
    agg = node_set_agreement(runs)
    assert agg.node_set_perfect == all_equal
    assert is_node_set_perfect(agg.mean_jaccard, agg.id_stability) == all_equal
    s = id_stability(runs)
    assert 0.0 <= s <= j + 1e-12  # the all-runs ratio never exceeds the pairwise mean
