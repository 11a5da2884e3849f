"""Stabilisation index: hand-worked cases, censoring, a brute-force reference, summaries."""

import numpy as np
import pytest

from analysis.errors import AnalysisError
from analysis.metrics.stabilisation import (
    stabilisation_index,
    stabilisation_ragged,
    summarise_stabilisation,
)


def _brute(seq, tol):
    r = len(seq)
    m = [np.mean(seq[: s + 1]) for s in range(r)]
    big_m = m[-1]
    for start in range(r):
        if all(abs(m[s] - big_m) <= tol + 1e-12 for s in range(start, r)):
            return start + 1
    raise AssertionError


def test_hand_worked():
    # 8,8,8,8,8 → m_1 = M → r* = 1
    res = stabilisation_index([8, 8, 8, 8, 8])
    assert res.r_star_abs[0] == 1 and not res.censored_abs[0]
    # 9,8,8,8,8: M = 8.2; m = 9, 8.5, 8.33, 8.25, 8.2 → abs tol .05: |8.25−8.2| = .05 → r* = 4
    res = stabilisation_index([9, 8, 8, 8, 8])
    assert res.r_star_abs[0] == 4
    # relative: 0.05·8.2 = 0.41 → |8.5−8.2| = .3 ok, |9−8.2| = .8 not → r* = 2
    assert res.r_star_rel[0] == 2
    # 8,8,9: m = 8, 8, 8.33; the last run moves the mean → censored at R = 3 (abs)
    res = stabilisation_index([8, 8, 9])
    assert res.r_star_abs[0] == 3 and res.censored_abs[0]
    assert res.r_star_or_none("abs") == (None,)
    # relative tol .05·8.33 = .417 ≥ .333 → r* = 1
    assert res.r_star_or_none("rel") == (1,)


def test_single_run_is_censored():
    res = stabilisation_index([7])
    assert res.censored_abs[0] and res.censored_rel[0]


def test_vectorised_matches_brute_force():
    rng = np.random.default_rng(0)
    x = rng.integers(5, 12, size=(300, 5)).astype(float)
    res = stabilisation_index(x, tol_abs_nodes=0.3, tol_rel=0.03, rel_floor_nodes=0.1)
    for i in range(x.shape[0]):
        assert res.r_star_abs[i] == _brute(x[i], 0.3)
        tol_rel = max(0.03 * x[i].mean(), 0.1)
        assert res.r_star_rel[i] == _brute(x[i], tol_rel)
    np.testing.assert_array_equal(res.censored_abs, res.r_star_abs == 5)


def test_ragged_equals_per_length_and_summary():
    seqs = [[8, 8, 8], [9, 8, 8, 8, 8], [8, 8, 9], [10, 10], [8, 9, 8, 8, 8]]
    res = stabilisation_ragged(seqs)
    assert list(res.runs) == [3, 5, 3, 2, 5]
    for i, s in enumerate(seqs):
        single = stabilisation_index(s)
        assert res.r_star_abs[i] == single.r_star_abs[0]
        assert res.r_star_rel[i] == single.r_star_rel[0]
    abs_s, rel_s = summarise_stabilisation(res)
    # abs r*: 1, 4, censored(3), 1, [8,9,8,8,8]: M=8.2, m=8,8.5,8.33,8.25,8.2 → 4
    assert list(res.r_star_abs) == [1, 4, 3, 1, 4]
    assert (abs_s.n_stabilising, abs_s.n_censored) == (4, 1)
    assert abs_s.median_r_star == pytest.approx(2.5)
    assert rel_s.kind == "rel" and rel_s.n_cells == 5


def test_errors():
    with pytest.raises(AnalysisError):
        stabilisation_index(np.array([1.0, np.nan]))
    with pytest.raises(AnalysisError):
        stabilisation_index(np.zeros((2, 0)))
