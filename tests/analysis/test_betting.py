"""The betting intervals for bounded means: an independent per-candidate loop reference, the
large-n closed forms, and coverage by simulation with known truth (binomial tolerances)."""

import math

import numpy as np
import pytest
from scipy.stats import norm

from analysis.stats.betting import betting_endpoints
from analysis.stats.coverage import STUDY_MODELS, simulate_cells, simulated_coverage, true_mean
from analysis.stats.mean_intervals import equal_n_intervals
from analysis.stats.small_sample import Resampling


def _loop_rejects(x, m, c_alpha, side, c=0.5):
    """One candidate mean, written out as in the paper: predictable bets from the past values
    (prior mean 1/2, variance 1/4), truncated, terminal capital against exp(c_alpha)."""
    n = len(x)
    capital, total, sq = 1.0, 0.0, 0.0
    for i, xi in enumerate(x):
        t = i + 1
        sig2_prev = 0.25 if i == 0 else (0.25 + sq) / t
        lam = math.sqrt(2 * c_alpha / (n * sig2_prev))
        if side > 0:
            capital *= 1 + min(lam, c / m) * (xi - m)
        else:
            capital *= 1 - min(lam, c / (1 - m)) * (xi - m)
        total += xi
        mu_t = (0.5 + total) / (t + 1)
        sq += (xi - mu_t) ** 2
    return capital >= math.exp(c_alpha)


@pytest.mark.parametrize("calibrated", [False, True])
def test_endpoints_match_a_per_candidate_loop(calibrated):
    rng = np.random.default_rng(4)
    samples = [rng.beta(2, 5, 6), np.r_[rng.uniform(0.2, 0.33, 6), 0.95], rng.beta(6, 1, 12)]
    alpha = 0.05
    c_alpha = norm.ppf(1 - alpha / 2) ** 2 / 2 if calibrated else math.log(2 / alpha)
    grid = np.linspace(0.0005, 0.9995, 1000)
    for x in samples:
        low, high = betting_endpoints(x[None, :], 0.95, (0.0, 1.0), calibrated=calibrated)
        kept_low = [m for m in grid if m <= x.mean() and not _loop_rejects(x, m, c_alpha, +1)]
        kept_high = [m for m in grid if m >= x.mean() and not _loop_rejects(x, m, c_alpha, -1)]
        assert low[0] == pytest.approx(min(kept_low), abs=0.0011)
        assert high[0] == pytest.approx(max(kept_high), abs=0.0011)


def test_large_n_half_widths_are_the_closed_forms():
    """For large n the exact interval is x̄ ± √(2 log(2/α))·σ/√n and the calibrated one the
    normal interval x̄ ± z·σ/√n (to the bets' truncation and plug-in error, a few %)."""
    x = np.random.default_rng(8).beta(2, 3, 40_000)
    half = x.std() / math.sqrt(x.size)
    for calibrated, factor in ((False, math.sqrt(2 * math.log(40))), (True, norm.ppf(0.975))):
        low, high = betting_endpoints(x[None, :], 0.95, (0.0, 1.0), calibrated=calibrated)
        assert (high[0] - low[0]) / 2 == pytest.approx(factor * half, rel=0.03), calibrated
        assert low[0] < x.mean() < high[0]


def test_rescaled_bounds_and_inputs_outside_them():
    x = np.random.default_rng(1).beta(2, 2, (3, 9))
    unit = betting_endpoints(x, 0.95, (0.0, 1.0))
    scaled = betting_endpoints(10 * x - 5, 0.95, (-5.0, 5.0))
    assert np.allclose(scaled[0], 10 * unit[0] - 5) and np.allclose(scaled[1], 10 * unit[1] - 5)
    with pytest.raises(Exception, match="inside"):
        betting_endpoints(np.array([[0.5, 1.2]]), 0.95, (0.0, 1.0))


def test_constant_samples_keep_a_width_and_the_exact_limit_on_a_bound():
    spec = Resampling()
    ones, inside = equal_n_intervals(np.array([[1.0] * 5, [0.5] * 5]), "calibrated_betting", spec)
    assert ones.high == 1.0 and ones.low <= 0.025 ** (1 / 5) + 1e-12
    assert inside.degenerate and inside.low < 0.5 < inside.high


def _coverage(draw, truth, n, method, datasets=1000, seed=3):
    return simulated_coverage(draw, truth, n, method, Resampling(replicates=2, seed=seed),
                              datasets)


def _floor(p, datasets=1000):
    """A one-sided binomial tolerance of 3 standard errors below p."""
    return p - 3 * math.sqrt(p * (1 - p) / datasets)


def _bimodal(size, rng):
    """Most cells tight around 0.25, a sixth of them near 1 (an artifact model's shape)."""
    return np.where(rng.random(size) < 1 / 6, rng.uniform(0.85, 1.0, size),
                    rng.uniform(0.2, 0.33, size))


BIMODAL_MEAN = (1 / 6) * 0.925 + (5 / 6) * 0.265


@pytest.mark.parametrize("n", [5, 12])
def test_exact_betting_keeps_its_level_on_hard_bounded_data(n):
    def bernoulli(size, rng):
        return (rng.random(size) < 0.1).astype(float)

    for draw, truth in ((bernoulli, 0.1), (_bimodal, BIMODAL_MEAN)):
        assert _coverage(draw, truth, n, "betting") >= _floor(0.95)


@pytest.mark.parametrize("n", [5, 22])
def test_calibrated_betting_reaches_the_band_where_the_bootstrap_does_not(n):
    """On the bimodal shape at 5 prompts the studentized bootstrap covers ~0.8; the calibrated
    betting interval covers >= 0.93, and at 22 prompts it does not over-cover grossly."""
    model = STUDY_MODELS[1]
    truth = true_mean(model, seed=0, cells=40_000)

    def study(size, rng):
        return simulate_cells(model, size, rng)

    covs = [_coverage(study, truth, n, "calibrated_betting"),
            _coverage(_bimodal, BIMODAL_MEAN, n, "calibrated_betting")]
    assert min(covs) >= _floor(0.93), covs
    if n == 22:
        assert max(covs) <= 0.99, covs
    if n == 5:
        stud = simulated_coverage(_bimodal, BIMODAL_MEAN, 5, "studentized",
                                  Resampling(replicates=300, seed=3), 500)
        assert stud < 0.9, stud


def test_threshold_scale_moves_the_calibrated_interval_onto_the_exact_one():
    """The sweep's factor scales c_α of bets and test alike: the calibrated interval at
    log(2/α) / (z²/2) is the exact interval, and a smaller factor gives a narrower one."""
    x = np.random.default_rng(6).beta(2, 3, (4, 9))
    to_exact = math.log(40) / (norm.ppf(0.975) ** 2 / 2)
    exact = betting_endpoints(x, 0.95, (0.0, 1.0))
    scaled = betting_endpoints(x, 0.95, (0.0, 1.0), calibrated=True, threshold_scale=to_exact)
    assert np.allclose(exact, scaled, atol=1e-9)
    calibrated = betting_endpoints(x, 0.95, (0.0, 1.0), calibrated=True)
    narrower = betting_endpoints(x, 0.95, (0.0, 1.0), calibrated=True, threshold_scale=0.5)
    assert np.all(narrower[1] - narrower[0] < calibrated[1] - calibrated[0])
