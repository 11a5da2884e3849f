"""Paired comparisons against scipy, golden vectors from rank-statistics.md §3.1, closed forms."""

import numpy as np
import pytest
from scipy import stats

from analysis.errors import AnalysisError
from analysis.stats.pairs import paired_comparison, rank_biserial

CURETON = np.array([6, 8, 14, 16, 23, 24, 28, 29, 41, -48, 49, 56, 60, -67, 75], dtype=float)


def test_cureton_golden_value():
    # no zeros/ties: exact p = 0.041259765625 under both conventions (R: V = 96, p = 0.04126)
    res = paired_comparison(np.zeros(15), CURETON)
    assert res.p_zsplit == pytest.approx(0.041259765625, abs=1e-12)
    assert res.p_drop == pytest.approx(0.041259765625, abs=1e-12)
    assert (res.n_common, res.n_nonzero) == (15, 15)
    # W+ = 96, W- = 24 → r = 72/120
    assert res.rank_biserial == pytest.approx(0.6)
    assert res.mean_diff == pytest.approx(CURETON.mean())


def test_tie_golden_value_auto():
    x = np.array([-0.2, -0.05, 0.1, 0.15, 0.2])
    res = paired_comparison(np.zeros(5), x)
    assert res.p_drop == pytest.approx(0.6875, abs=1e-12)


def test_rank_biserial_reference_example():
    d = np.array([0.3, 0, 0.1, -0.05, 0, 0.2, 0.4, -0.1])
    assert rank_biserial(d) == pytest.approx(2 / 3, abs=1e-4)
    res = paired_comparison(np.zeros(8), d)
    assert res.rank_biserial == pytest.approx(0.6667, abs=1e-4)
    assert res.n_nonzero == 6 and res.p_floor == pytest.approx(2.0 ** -5)
    assert res.p_zsplit == pytest.approx(stats.wilcoxon(d, zero_method="zsplit").pvalue)
    assert res.p_drop == pytest.approx(stats.wilcoxon(d, zero_method="wilcox").pvalue)
    assert res.p_zsplit != res.p_drop


def test_common_prompts_only_and_direction():
    a = np.array([0.5, np.nan, 0.7, 0.9, 0.2, 0.6, np.nan])
    b = np.array([0.9, 0.8, np.nan, 1.0, 0.6, 0.7, 0.1])
    res = paired_comparison(a, b)
    d = np.array([0.4, 0.1, 0.4, 0.1])
    assert res.n_common == 4 and res.mean_diff == pytest.approx(d.mean())
    assert res.rank_biserial == 1.0  # b always larger
    # float noise does not create spurious non-ties (0.9-0.5 vs 0.6-0.2 both → 0.4)
    assert res.p_drop == pytest.approx(stats.wilcoxon(np.round(d, 12)).pvalue)


def test_all_zero_and_tiny_samples():
    same = np.array([1.0, 0.8, 0.5])
    res = paired_comparison(same, same.copy())
    assert res.p_zsplit == 1.0 and res.p_drop == 1.0 and np.isnan(res.rank_biserial)
    assert res.mdd == 0.0 and res.n_nonzero == 0
    one = paired_comparison(np.array([0.5, np.nan]), np.array([0.9, 0.1]))
    assert one.n_common == 1 and np.isnan(one.p_zsplit) and np.isnan(one.mdd)
    assert one.rank_biserial == 1.0
    none = paired_comparison(np.array([np.nan]), np.array([1.0]))
    assert none.n_common == 0 and np.isnan(none.mean_diff) and np.isnan(none.p_drop)
    with pytest.raises(AnalysisError):
        paired_comparison(np.zeros(3), np.zeros(4))


def test_mdd_closed_form_and_power_by_simulation():
    rng = np.random.default_rng(0)
    d = rng.normal(0, 0.2, 20)
    res = paired_comparison(np.zeros(20), d)
    expected = (stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * d.std(ddof=1) / np.sqrt(20)
    assert res.mdd == pytest.approx(expected)
    # a true shift equal to the MDD (σ known = 0.2, n = 40) is detected ~80% of the time by a
    # paired z-test; the t-test is a bit below that at n = 40
    sigma, n = 0.2, 40
    shift = (stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * sigma / np.sqrt(n)
    sims = rng.normal(shift, sigma, (2000, n))
    p = stats.ttest_1samp(sims, 0.0, axis=1).pvalue
    assert 0.74 <= np.mean(p < 0.05) <= 0.84
