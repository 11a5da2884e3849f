"""Calibration by simulation with known truth (seeded).

* Mean intervals: the per-model 95% percentile interval used in models.parquet
  (:func:`analysis.stats.bootstrap.percentile_ci`) must cover the true mean at the rates of the
  research note's simulation (rank-statistics.md §5; 2000 datasets) within ±3 points:
  Beta(2,5): 0.82 at n = 5, 0.93 at n = 22; "mix_ones" (40% exactly 1.0, 60% Beta(5,2)):
  0.85 at n = 5, 0.94 at n = 22.
* Rank sets: the simultaneous set used for rank_set_low/high and the partition
  (:func:`analysis.stats.ranks.pairwise_rank_set`) must cover all true ranks at once in ≥ 95% of
  panels on a non-tied design with 30% missing cells, and still ≥ 95% with exact ties
  (true rank by "min" ties).
"""

from __future__ import annotations

import numpy as np
import pytest

from analysis.stats.bootstrap import percentile_ci
from analysis.stats.ranks import min_ranks, pairwise_rank_set

N_SIM = 2000
CHUNK = 100  # datasets per call (they share one index matrix; each chunk has its own seed)


def _draw(gen: str, rng: np.random.Generator, size) -> np.ndarray:
    if gen == "beta25":
        return rng.beta(2, 5, size)
    ones = rng.random(size) < 0.4
    return np.where(ones, 1.0, rng.beta(5, 2, size))


TRUE_MEAN = {"beta25": 2 / 7, "mix_ones": 0.4 + 0.6 * 5 / 7}


@pytest.mark.parametrize(("gen", "n", "expected"), [
    ("beta25", 5, 0.82), ("beta25", 22, 0.93), ("mix_ones", 5, 0.85), ("mix_ones", 22, 0.94)])
def test_percentile_interval_coverage_matches_research_note(gen, n, expected):
    seeds = np.random.SeedSequence([20260601, n, len(gen)]).spawn(N_SIM // CHUNK)
    covered = 0
    for ss in seeds:
        rng = np.random.default_rng(ss)
        x = _draw(gen, rng, (CHUNK, n))
        cis = percentile_ci(x, replicates=2000, seed=int(rng.integers(2**31)))
        lo = np.array([c.low for c in cis])
        hi = np.array([c.high for c in cis])
        covered += int(np.sum((lo <= TRUE_MEAN[gen]) & (TRUE_MEAN[gen] <= hi)))
    coverage = covered / N_SIM
    assert abs(coverage - expected) <= 0.03, (gen, n, coverage)


def _panels(theta: np.ndarray, n_panels: int, prompts: int, seed: int):
    rng = np.random.default_rng(seed)
    m = theta.size
    for _ in range(n_panels):
        s = theta[:, None] + rng.normal(0, 0.15, prompts)[None, :] + rng.normal(0, 0.10, (m, prompts))
        s[rng.random((m, prompts)) < 0.3] = np.nan
        for i in range(m):  # every model keeps at least 3 prompts
            if np.isfinite(s[i]).sum() < 3:
                s[i, :3] = theta[i] + rng.normal(0, 0.1, 3)
        yield s


@pytest.mark.parametrize(("theta", "label"), [
    (np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4]), "separated"),
    (np.array([0.9, 0.85, 0.8, 0.75, 0.7, 0.65]), "near"),
    (np.array([0.7, 0.7, 0.7, 0.5, 0.5, 0.3]), "exact ties"),
])
def test_simultaneous_rank_set_covers_all_true_ranks(theta, label):
    truth = min_ranks(theta)
    n_panels = 400
    hits = 0
    informative = 0
    for s in _panels(theta, n_panels, 15, seed=7):
        rs, _, _ = pairwise_rank_set(s, level=0.95)
        hits += bool(np.all((rs.low <= truth) & (truth <= rs.high)))
        informative += bool(np.any(rs.high - rs.low < theta.size - 1))
    coverage = hits / n_panels
    assert coverage >= 0.95, (label, coverage)
    if label == "separated":
        assert informative > 0.9 * n_panels  # the set is not trivially the whole board
