"""Bootstrap intervals for a per-model mean that keep their level at a handful of prompts.

Two methods beside :mod:`analysis.stats.bootstrap`'s percentile and BCa intervals:

* **studentized** (bootstrap-t, Efron & Tibshirani ch. 12): the replicates of
  t* = (θ̂* − θ̂) / se*, se* = sd*(ddof=1)/√n, give the interval
  [θ̂ − t*₍₁₋α/₂₎·se, θ̂ − t*₍α/₂₎·se]. It is the one method here whose endpoints may leave the
  sample's range, which is where the truth often lies at n = 5. A replicate whose values are all
  equal has se* = 0: its t* is ±∞ (the sign of θ̂* − θ̂), i.e. it counts as a tail replicate,
  and an infinite endpoint becomes the bound of the metric.
* **double** (calibrated percentile, Davison & Hinkley §5.6): each outer replicate is
  bootstrapped again (``inner_replicates`` inner draws, one inner index matrix shared by all
  outer replicates); u_b = share of inner means ≤ θ̂ (ties half); the percentile interval is
  read at the levels q_lo = quantile(u, α/2), q_hi = quantile(u, 1 − α/2) instead of α/2, 1 − α/2.

Inputs: per-prompt scores of one model (1-D, unitless, e.g. Jaccard in [0, 1]) or 2-D
``values[row, prompt]`` of rows with the same n (rows share the index matrices, as in
:func:`analysis.stats.bootstrap.percentile_ci`). Outputs: :class:`Interval` records.

Both methods end with :func:`finish_endpoints`: endpoints clipped to ``bounds`` (the metric's
range), and a sample whose values all sit on one bound gets the exact one-sided limit instead of
a zero-width interval: if every one of n values equals the upper bound 1 and the mean is μ, then
P(X = 1) ≤ μ, so P(all n at 1) ≤ μⁿ, and μ < (α/2)^(1/n) is rejected at α/2 (mirrored at 0).
A constant sample strictly inside the bounds keeps its zero-width interval (``degenerate``).
No Python loop runs over replicates; the double bootstrap's inner means are one matrix product
per block of outer replicates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.errors import AnalysisError
from analysis.stats.bootstrap import Interval

__all__ = [
    "Resampling",
    "studentized_ci",
    "studentized_endpoints",
    "double_ci",
    "finish_endpoints",
    "replicate_moments",
]

# a t* of a zero-spread replicate: larger than any finite t*, small enough that
# (θ̂ − BIG·se) stays finite (then clipped to the bounds)
_BIG_T = 1e12


@dataclass(frozen=True)
class Resampling:
    """How an interval is drawn.

    replicates: outer bootstrap replicates; seed: seed of ``numpy.random.default_rng``;
    level: nominal two-sided coverage (0.95); inner_replicates: replicates per outer replicate
    of the double bootstrap; bounds: (low, high) range of the metric in its own units
    (Jaccard and ID-stability: (0, 1)); None = unbounded (no clipping, no boundary rule).
    max_elements: floats held at once by the gathered replicates (memory only; results do not
    depend on it).
    """

    replicates: int = 10_000
    seed: int = 0
    level: float = 0.95
    inner_replicates: int = 200
    bounds: tuple[float, float] | None = (0.0, 1.0)
    max_elements: int = 4_000_000

    def __post_init__(self) -> None:
        if not 0.0 < self.level < 1.0:
            raise AnalysisError(f"level must be in (0, 1); got {self.level}")
        if self.replicates < 2 or self.inner_replicates < 2:
            raise AnalysisError("replicates and inner_replicates must be >= 2")
        if self.bounds is not None and not self.bounds[0] < self.bounds[1]:
            raise AnalysisError(f"bounds must be (low, high) with low < high; got {self.bounds}")


def _rows(values: np.ndarray) -> tuple[np.ndarray, bool]:
    x = np.asarray(values, dtype=float)
    was_1d = x.ndim == 1
    x = x[None, :] if was_1d else x
    if x.ndim != 2 or x.shape[1] < 1:
        raise AnalysisError(f"values must be 1-D or 2-D with at least one prompt; got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise AnalysisError("values contain NaN/inf: drop missing cells before bootstrapping")
    return x, was_1d


def replicate_moments(x: np.ndarray, idx: np.ndarray, max_elements: int = 4_000_000
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Replicate means and SDs (ddof=1) of ``x[:, idx]``: x (rows, n), idx (B, n) → two
    (rows, B) arrays, gathered in blocks of at most ``max_elements`` values."""
    m, n = x.shape
    b = idx.shape[0]
    means, sds = np.empty((m, b)), np.empty((m, b))
    step = max(16, max_elements // max(1, m * n))
    for start in range(0, b, step):  # memory blocks, vectorised inside
        xb = x[:, idx[start:start + step]]
        means[:, start:start + step] = xb.mean(axis=-1)
        sds[:, start:start + step] = xb.std(axis=-1, ddof=1) if n > 1 else 0.0
    return means, sds


def studentized_endpoints(theta_hat: np.ndarray, se_hat: np.ndarray, mean_star: np.ndarray,
                          se_star: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap-t endpoints from replicate means and standard errors.

    theta_hat, se_hat: (rows,) the sample's mean and standard error; mean_star, se_star:
    (rows, B) the replicates'. Returns (low, high), unclipped, in the units of the values.
    """
    diff = mean_star - theta_hat[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se_star > 0, diff / np.where(se_star > 0, se_star, 1.0),
                     np.sign(diff) * _BIG_T)
    alpha = (1.0 - level) / 2.0
    q = np.quantile(t, [alpha, 1.0 - alpha], axis=-1)  # (2, rows), type 7
    return theta_hat - q[1] * se_hat, theta_hat - q[0] * se_hat


def finish_endpoints(low: np.ndarray, high: np.ndarray, x: np.ndarray, level: float,
                     bounds: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray]:
    """Clip (low, high) to ``bounds``; samples on one bound get the exact one-sided limit and
    other constant samples a zero-width interval at their value (module docstring)."""
    low, high = np.array(low, dtype=float), np.array(high, dtype=float)
    n = x.shape[-1]
    const = np.ptp(x, axis=-1) == 0
    low[const] = high[const] = x[const, 0]
    if bounds is None:
        return low, high
    lo_b, hi_b = bounds
    low, high = np.clip(low, lo_b, hi_b), np.clip(high, lo_b, hi_b)
    reach = ((1.0 - level) / 2.0) ** (1.0 / n)  # μ^n < α/2 ⇔ μ < reach (on the unit scale)
    at_top = const & (x[:, 0] == hi_b)
    at_bottom = const & (x[:, 0] == lo_b)
    low[at_top] = hi_b - (hi_b - lo_b) * (1.0 - reach)
    high[at_bottom] = lo_b + (hi_b - lo_b) * (1.0 - reach)
    return low, high


def _pack(x: np.ndarray, ends: tuple[np.ndarray, np.ndarray], spec: Resampling, method: str,
          was_1d: bool):
    low, high = finish_endpoints(ends[0], ends[1], x, spec.level, spec.bounds)
    degenerate = np.ptp(x, axis=-1) == 0
    out = tuple(Interval(float(lo), float(hi), float(pt), spec.level, x.shape[1],
                         spec.replicates, spec.seed, method, bool(dg))
                for lo, hi, pt, dg in zip(low, high, x.mean(axis=-1), degenerate))
    return out[0] if was_1d else out


def studentized_ci(values: np.ndarray, spec: Resampling):
    """Studentized (bootstrap-t) interval of the mean; one :class:`Interval` for 1-D input,
    a tuple for 2-D (rows share one index matrix ``default_rng(seed).integers(0, n, (B, n))``).
    n = 1 is a constant sample (:func:`finish_endpoints`)."""
    x, was_1d = _rows(values)
    n = x.shape[1]
    if n < 2:
        nan = np.full(x.shape[0], np.nan)
        return _pack(x, (nan, nan), spec, "studentized", was_1d)
    idx = np.random.default_rng(spec.seed).integers(0, n, (spec.replicates, n))
    mean_star, sd_star = replicate_moments(x, idx, spec.max_elements)
    root_n = np.sqrt(n)
    ends = studentized_endpoints(x.mean(axis=1), x.std(axis=1, ddof=1) / root_n, mean_star,
                                 sd_star / root_n, spec.level)
    return _pack(x, ends, spec, "studentized", was_1d)


def _inner_shares(xo: np.ndarray, theta_hat: np.ndarray, counts: np.ndarray,
                  max_elements: int) -> np.ndarray:
    """u[row, b] = share of the inner means of outer sample ``xo[row, b]`` below θ̂ (ties half).

    xo: (rows, B1, n) outer samples; counts: (B2, n) inner draw counts (shared by every outer
    sample); inner means = xo @ counts.T / n, one product per block of outer replicates."""
    m, b1, n = xo.shape
    b2 = counts.shape[0]
    weights = counts.T.astype(float) / n  # (n, B2)
    u = np.empty((m, b1))
    step = max(1, max_elements // max(1, m * b2))
    th = theta_hat[:, None, None]
    for start in range(0, b1, step):  # memory blocks, vectorised inside
        inner = xo[:, start:start + step] @ weights  # (rows, block, B2)
        # rounded so that a mean equal to θ̂ in exact arithmetic counts as a tie
        inner = np.round(inner - th, 12)
        u[:, start:start + step] = ((inner < 0).sum(-1) + 0.5 * (inner == 0).sum(-1)) / b2
    return u


def double_ci(values: np.ndarray, spec: Resampling):
    """Calibrated double-bootstrap percentile interval of the mean (module docstring).

    Same shapes as :func:`studentized_ci`. Work: rows × replicates × inner_replicates × n
    multiply-adds; memory bounded by ``spec.max_elements`` per block."""
    x, was_1d = _rows(values)
    m, n = x.shape
    rng = np.random.default_rng(spec.seed)
    idx = rng.integers(0, n, (spec.replicates, n))
    inner_idx = rng.integers(0, n, (spec.inner_replicates, n))
    counts = np.zeros((spec.inner_replicates, n), dtype=np.int64)
    np.add.at(counts, (np.arange(spec.inner_replicates)[:, None], inner_idx), 1)
    theta_hat = x.mean(axis=1)
    alpha = (1.0 - spec.level) / 2.0
    lows, highs = np.empty(m), np.empty(m)
    step = max(1, spec.max_elements // max(1, n * spec.replicates))
    for start in range(0, m, step):  # blocks of rows (memory), vectorised inside
        xo = x[start:start + step][:, idx]  # (rows, B1, n)
        u = _inner_shares(xo, theta_hat[start:start + step], counts, spec.max_elements)
        theta_star = xo.mean(axis=-1)
        q_lo = np.quantile(u, alpha, axis=-1)
        q_hi = np.quantile(u, 1.0 - alpha, axis=-1)
        srt = np.sort(theta_star, axis=-1)
        lows[start:start + step] = _type7(srt, q_lo)
        highs[start:start + step] = _type7(srt, q_hi)
    return _pack(x, (lows, highs), spec, "double", was_1d)


def _type7(sorted_rows: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Row-wise linear-interpolation quantile (numpy's default) at a level per row."""
    b = sorted_rows.shape[-1]
    h = np.clip(q, 0.0, 1.0) * (b - 1)
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, b - 1)
    rows = np.arange(sorted_rows.shape[0])
    a, c = sorted_rows[rows, lo], sorted_rows[rows, hi]
    return a + (h - lo) * (c - a)
