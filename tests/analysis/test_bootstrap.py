"""Bootstrap CIs checked against scipy.stats.bootstrap and a small coverage simulation."""

import numpy as np
import pytest
from scipy import stats

from analysis.errors import AnalysisError
from analysis.stats.bootstrap import (
    bca_ci,
    bootstrap_means,
    expanded_percentile_ci,
    percentile_ci,
    percentile_ci_many,
)

DATA = np.array([1.0, 0.913, 1.0, 0.761, 0.8, 1.0, 0.5, 0.927, 1.0, 0.667, 0.889, 1.0])


def _scipy(x, method, seed, B=10_000, level=0.95):
    res = stats.bootstrap((x,), np.mean, method=method, n_resamples=B, confidence_level=level,
                          rng=np.random.default_rng(seed))
    return res.confidence_interval


@pytest.mark.parametrize("seed", [0, 7, 2024])
def test_percentile_matches_scipy_bit_for_bit(seed):
    ours = percentile_ci(DATA, seed=seed)
    ref = _scipy(DATA, "percentile", seed)
    assert ours.low == pytest.approx(ref.low, abs=1e-12)
    assert ours.high == pytest.approx(ref.high, abs=1e-12)
    assert ours.point == pytest.approx(DATA.mean())
    assert (ours.n, ours.replicates, ours.seed, ours.method) == (12, 10_000, seed, "percentile")


@pytest.mark.parametrize("seed", [1, 99])
def test_bca_matches_scipy(seed):
    ours = bca_ci(DATA, seed=seed)
    ref = _scipy(DATA, "BCa", seed)
    assert ours.low == pytest.approx(ref.low, abs=1e-9)
    assert ours.high == pytest.approx(ref.high, abs=1e-9)


def test_independent_seeds_agree_within_monte_carlo_error():
    # Different draws: endpoints should agree with scipy within MC error (~0.01 here).
    ours = percentile_ci(DATA, seed=3)
    ref = _scipy(DATA, "percentile", 4)
    assert abs(ours.low - ref.low) < 0.02 and abs(ours.high - ref.high) < 0.02
    b_ours = bca_ci(DATA, seed=5)
    b_ref = _scipy(DATA, "BCa", 6)
    assert abs(b_ours.low - b_ref.low) < 0.03 and abs(b_ours.high - b_ref.high) < 0.03


def test_batched_rows_equal_scipy_along_last_axis():
    rng = np.random.default_rng(11)
    x = rng.beta(2, 5, size=(4, 9))
    ours = percentile_ci(x, seed=12, replicates=2000)
    ref = stats.bootstrap((x,), np.mean, axis=-1, method="percentile", n_resamples=2000,
                          rng=np.random.default_rng(12)).confidence_interval
    np.testing.assert_allclose([iv.low for iv in ours], ref.low, atol=1e-12)
    np.testing.assert_allclose([iv.high for iv in ours], ref.high, atol=1e-12)
    bca = bca_ci(x, seed=12, replicates=2000)
    ref_b = stats.bootstrap((x,), np.mean, axis=-1, method="BCa", n_resamples=2000,
                            rng=np.random.default_rng(12)).confidence_interval
    np.testing.assert_allclose([iv.low for iv in bca], ref_b.low, atol=1e-9)
    np.testing.assert_allclose([iv.high for iv in bca], ref_b.high, atol=1e-9)


def test_many_ragged_equals_single_calls():
    groups = [DATA[:5], DATA, DATA[2:7], DATA[:3]]
    many = percentile_ci_many(groups, seed=8, replicates=3000)
    for g, iv in zip(groups, many):
        single = percentile_ci(g, seed=8, replicates=3000)
        assert (iv.low, iv.high, iv.n) == (single.low, single.high, len(g))


def test_degenerate_data():
    ones = np.ones(6)
    iv = percentile_ci(ones, seed=0, replicates=500)
    assert iv.degenerate and iv.low == iv.high == 1.0
    with np.errstate(all="ignore"):
        b = bca_ci(ones, seed=0, replicates=500)
    assert b.degenerate and np.isnan(b.low) and np.isnan(b.high)


def test_input_errors():
    with pytest.raises(AnalysisError, match="NaN"):
        percentile_ci(np.array([1.0, np.nan]), seed=0)
    with pytest.raises(AnalysisError, match="empty"):
        percentile_ci(np.array([]), seed=0)
    with pytest.raises(AnalysisError, match="level"):
        percentile_ci(DATA, seed=0, level=1.5)


def test_replicate_means_are_means_of_resamples():
    m = bootstrap_means(DATA, replicates=50, seed=1)
    idx = np.random.default_rng(1).integers(0, DATA.size, (50, DATA.size))
    np.testing.assert_allclose(m, DATA[idx].mean(axis=1))


def test_coverage_simulation_known_mean():
    # Normal data, known mean 0.5, n = 20: percentile coverage is ~0.93-0.94 in theory.
    # 400 datasets × B=1000; MC SE of coverage ≈ 0.012, so accept [0.88, 0.98].
    rng = np.random.default_rng(123)
    n_sim, n = 400, 20
    x = rng.normal(0.5, 0.2, size=(n_sim, n))
    ivs = percentile_ci(x, seed=5, replicates=1000)
    lo = np.array([iv.low for iv in ivs])
    hi = np.array([iv.high for iv in ivs])
    cover = np.mean((lo <= 0.5) & (0.5 <= hi))
    assert 0.88 <= cover <= 0.98, cover
    exp = expanded_percentile_ci(x, seed=5, replicates=1000)
    lo_e = np.array([iv.low for iv in exp])
    hi_e = np.array([iv.high for iv in exp])
    # expanded interval contains the plain one and covers at least as often
    assert np.all(lo_e <= lo + 1e-12) and np.all(hi_e >= hi - 1e-12)
    assert np.mean((lo_e <= 0.5) & (0.5 <= hi_e)) >= cover


# ---------------------------------------------------------------- shared-stream scheme (large panels)

from analysis.stats.bootstrap import percentile_ci_many_metrics, shared_bootstrap_means  # noqa: E402


def test_shared_scheme_resamples_exactly_n_values_multinomially():
    # One band (n in (4.5, 9]) forces both the trim and the top-up paths; a second band (3, 4).
    # Identity rows scaled by n turn replicate means into the count vector of each model, which
    # must be Multinomial(n, 1/n): size exactly n, mean 1, var 1 − 1/n, cov −1/n.
    sizes = [5, 6, 7, 9, 9, 4, 3]
    groups = []
    for n in sizes:
        g = np.zeros((9, n))
        g[np.arange(n), np.arange(n)] = n
        groups.append(g)
    reps = 40_000
    counts = shared_bootstrap_means(groups, replicates=reps, seed=5, chunk=256)
    for m, n in enumerate(sizes):
        c = counts[:n, m, :]
        np.testing.assert_allclose(c.sum(axis=0), n, atol=1e-9)
        z = (c.mean(axis=1) - 1) / np.sqrt((1 - 1 / n) / reps)
        assert np.all(np.abs(z) < 4.5), (n, z)
        np.testing.assert_allclose(np.cov(c), np.eye(n) - 1 / n, atol=0.03)
        # P(all n draws hit value 0) = n^-n
        p0 = np.mean(np.isclose(c[0], n))
        assert abs(p0 - n ** -float(n)) < 5 * np.sqrt(n ** -float(n) / reps) + 1e-4


def test_shared_scheme_intervals_agree_with_scipy_within_mc_error():
    rng = np.random.default_rng(4)
    groups = [rng.beta(2, 5, n) for n in (5, 12, 22, 40, 41, 80, 700)]
    shared = percentile_ci_many(groups, seed=3, scheme="shared")
    for g, iv in zip(groups, shared):
        ref = _scipy(g, "percentile", 3)
        assert iv.method == "percentile_shared" and iv.n == g.size
        assert abs(iv.low - ref.low) < 0.01 and abs(iv.high - ref.high) < 0.01
    # metrics resampled together give the same intervals as one metric at a time
    both = percentile_ci_many_metrics([groups, [1 - g for g in groups]], seed=3, scheme="shared")
    assert both[0] == shared
    assert both[1] == percentile_ci_many([1 - g for g in groups], seed=3, scheme="shared")


def test_auto_scheme_is_scipy_exact_at_paper_scale_and_shared_above():
    groups = [DATA[:5], DATA, DATA[2:7]]
    auto = percentile_ci_many(groups, seed=8, replicates=3000)
    assert all(iv.method == "percentile" for iv in auto)
    assert auto == percentile_ci_many(groups, seed=8, replicates=3000, scheme="exact")
    big = percentile_ci_many(groups, seed=8, replicates=3000, exact_max_draws=10)
    assert all(iv.method == "percentile_shared" for iv in big)
    const = percentile_ci_many([np.full(30, 0.7), DATA], seed=1, scheme="shared")
    assert const[0].degenerate and const[0].low == const[0].high == np.full(30, 0.7).mean()
