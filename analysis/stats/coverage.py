"""Coverage of mean intervals by simulation with a known truth.

Two generators of per-prompt cell scores (unitless Jaccard in [0, 1]):

* :class:`StudyModel` — panels that look like the study's: each cell is a prompt with 3 + a
  Poisson(6) number of nodes, measured in 2–5 runs (uniform); a share ``perfect_share`` of the
  cells is perfectly stable, in the others each run keeps each node with a probability drawn
  from Beta(a, b); the cell's score is the mean pairwise Jaccard of its runs' node sets. Its
  true mean is the Monte-Carlo mean of a large draw (:func:`true_mean`).
* :class:`CellFit` — the parametric resample of one model's own cells behind the per-model
  coverage self-check: a zero-one-inflated Beta fitted by moments (shares of exact 0 and 1,
  Beta by the mean and variance of the other values); its mean is known in closed form.

:func:`simulated_coverage` draws ``datasets`` samples of n cells, computes each interval with
:func:`analysis.stats.mean_intervals.endpoints` and returns the share that covers the truth.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from analysis.stats.mean_intervals import endpoints
from analysis.stats.small_sample import Resampling

__all__ = ["StudyModel", "STUDY_MODELS", "CellFit", "simulate_cells", "true_mean",
           "simulated_coverage", "fit_cells"]

_MAX_NODES = 24
_MAX_RUNS = 5
_PAIRS = [(r, s) for r in range(_MAX_RUNS) for s in range(r + 1, _MAX_RUNS)]


@dataclass(frozen=True)
class StudyModel:
    """A simulated model: share of perfectly stable cells, Beta(a, b) per-node keep
    probability of the others (per run)."""

    name: str
    perfect_share: float
    keep_a: float
    keep_b: float


# skewed like the study's models: from mostly-perfect to rarely-perfect
STUDY_MODELS = (
    StudyModel("mostly perfect", 0.6, 6.0, 1.0),
    StudyModel("often perfect", 0.35, 4.0, 1.2),
    StudyModel("rarely perfect", 0.1, 3.0, 1.5),
    StudyModel("unstable", 0.05, 1.5, 1.5),
)


def simulate_cells(model: StudyModel, size: tuple[int, ...], rng: np.random.Generator
                   ) -> np.ndarray:
    """Cell scores of ``model``, shape ``size`` (class docstring); vectorised over cells."""
    cells = int(np.prod(size))
    nodes = np.minimum(3 + rng.poisson(6, cells), _MAX_NODES)
    runs = rng.integers(2, _MAX_RUNS + 1, cells)
    keep = np.where(rng.random(cells) < model.perfect_share, 1.0,
                    rng.beta(model.keep_a, model.keep_b, cells))
    real = np.arange(_MAX_NODES)[None, :] < nodes[:, None]  # (cells, nodes)
    inc = (rng.random((cells, _MAX_RUNS, _MAX_NODES)) < keep[:, None, None]) & real[:, None, :]
    total, pairs = np.zeros(cells), np.zeros(cells)
    for r, s in _PAIRS:  # 10 run pairs, vectorised over cells
        inter = np.sum(inc[:, r] & inc[:, s], axis=1)
        union = np.sum(inc[:, r] | inc[:, s], axis=1)
        jac = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
        used = s < runs
        total += np.where(used, jac, 0.0)
        pairs += used
    return (total / pairs).reshape(size)


def true_mean(model: StudyModel, seed: int = 0, cells: int = 400_000) -> float:
    """Monte-Carlo mean cell score of ``model`` (SE below 5e-4 at the default size)."""
    rng = np.random.default_rng(seed)
    parts = [simulate_cells(model, (cells // 8,), rng).mean() for _ in range(8)]
    return float(np.mean(parts))


@dataclass(frozen=True)
class CellFit:
    """Zero-one-inflated Beta: P(0) = share_zero, P(1) = share_one, else Beta(a, b)."""

    share_zero: float
    share_one: float
    beta_a: float
    beta_b: float

    @property
    def mean(self) -> float:
        inner = 1.0 - self.share_zero - self.share_one
        return self.share_one + inner * self.beta_a / (self.beta_a + self.beta_b)

    def draw(self, size: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        u = rng.random(size)
        inner = rng.beta(self.beta_a, self.beta_b, size)
        return np.where(u < self.share_zero, 0.0,
                        np.where(u < self.share_zero + self.share_one, 1.0, inner))


def fit_cells(values: np.ndarray, concentration: float = 4.0) -> CellFit:
    """Moment fit of :class:`CellFit` to one model's cell scores in [0, 1].

    With fewer than 2 values strictly inside (0, 1), or a variance a Beta cannot have, the
    Beta keeps the inside values' mean (0.5 without any) at a + b = ``concentration``
    (a wide Beta, so the check errs on the hard side)."""
    x = np.asarray(values, dtype=float)
    zero, one = float(np.mean(x <= 0.0)), float(np.mean(x >= 1.0))
    inside = x[(x > 0.0) & (x < 1.0)]
    m = float(inside.mean()) if inside.size else 0.5
    v = float(inside.var(ddof=1)) if inside.size >= 2 else 0.0
    total = m * (1 - m) / v - 1.0 if v > 0 else -1.0
    if not total > 0:
        total = concentration
    return CellFit(zero, one, m * total, (1 - m) * total)


IntervalFn = Callable[[np.ndarray, Resampling], tuple[np.ndarray, np.ndarray]]


def simulated_coverage(draw: Callable[[tuple[int, ...], np.random.Generator], np.ndarray],
                       truth: float, n: int, method: str | IntervalFn, spec: Resampling,
                       datasets: int = 1000) -> float:
    """Share of ``datasets`` intervals (method, spec) from samples of n cells drawn by
    ``draw(size, rng)`` that cover ``truth``; datasets are drawn from ``spec.seed``.
    ``method``: a name of :data:`analysis.stats.mean_intervals.METHODS`, or a function
    (values (rows, n), spec) → (low, high) arrays."""
    rng = np.random.default_rng([spec.seed, n])
    per_call = max(1, min(datasets, 200_000 // max(1, n * 10)))
    covered, done = 0, 0
    while done < datasets:  # calls of many datasets, each vectorised over its rows
        k = min(per_call, datasets - done)
        x = draw((k, n), rng)
        call = Resampling(spec.replicates, int(rng.integers(2**31)), spec.level,
                          spec.inner_replicates, spec.bounds, spec.max_elements)
        lo, hi = endpoints(x, method, call) if isinstance(method, str) else method(x, call)
        covered += int(np.sum((lo <= truth + 1e-12) & (truth - 1e-12 <= hi)))
        done += k
    return covered / datasets
