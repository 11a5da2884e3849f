"""Bootstrap confidence intervals for a per-model mean (metrics.md, "95% percentile bootstrap").

Inputs are the per-cell scores of one model (a 1-D float array, one value per prompt, unitless —
e.g. Jaccard in [0, 1]) or a 2-D array ``values[model, prompt]`` of models with the same number of
cells. Outputs are :class:`Interval` records in the units of the input.

Resampling convention (chosen so that the result is bit-for-bit equal to
``scipy.stats.bootstrap(..., method="percentile"|"BCa", n_resamples=B,
rng=numpy.random.default_rng(seed))`` with ``batch=None``): one index matrix
``rng.integers(0, n, (B, n))`` is drawn, the replicate means are the row means of ``x[idx]``, and
the endpoints are linear-interpolation quantiles (Hyndman–Fan type 7, ``numpy.quantile``'s default).
A 2-D input shares the same index matrix across its rows, exactly as scipy does for ``axis=-1``.

No Python loop runs over replicates; memory is O(B·n) per call (B=10,000, n=22 → 1.8 MB of int64).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri
from scipy.stats import t as student_t

__all__ = [
    "Interval",
    "bootstrap_means",
    "percentile_ci",
    "percentile_ci_many",
    "bca_ci",
    "expanded_percentile_ci",
]


@dataclass(frozen=True)
class Interval:
    """A two-sided confidence interval for a mean.

    low/high/point are in the units of the input values; ``level`` is the nominal coverage
    (0.95 = 95%); ``n`` is the number of cells (prompts) the mean is over; ``replicates`` and
    ``seed`` record how the bootstrap was drawn; ``method`` is "percentile", "bca" or
    "expanded_percentile". ``degenerate`` is True when every value is identical (zero-width
    interval; BCa is then NaN, as in scipy).
    """

    low: float
    high: float
    point: float
    level: float
    n: int
    replicates: int
    seed: int
    method: str
    degenerate: bool


def _as_2d(values: np.ndarray) -> tuple[np.ndarray, bool]:
    x = np.asarray(values, dtype=float)
    if x.ndim == 1:
        return x[None, :], True
    if x.ndim != 2:
        raise ValueError(f"values must be 1-D or 2-D (models × prompts); got shape {x.shape}")
    return x, False


def _check(x: np.ndarray, level: float, replicates: int) -> None:
    if x.shape[-1] < 1:
        raise ValueError("cannot bootstrap an empty sample: pass at least one value per model")
    if not np.all(np.isfinite(x)):
        raise ValueError("values contain NaN/inf: drop missing cells before bootstrapping")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1); got {level}")
    if replicates < 2:
        raise ValueError(f"replicates must be >= 2; got {replicates}")


def bootstrap_means(values: np.ndarray, *, replicates: int, seed: int) -> np.ndarray:
    """Replicate means of a nonparametric bootstrap.

    values: 1-D (n,) or 2-D (models, n). Returns (replicates,) or (models, replicates) floats.
    One index matrix ``default_rng(seed).integers(0, n, (replicates, n))`` is shared by all rows.
    """
    x, was_1d = _as_2d(values)
    n = x.shape[-1]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, (replicates, n))
    means = x[:, idx].mean(axis=-1)  # (models, replicates)
    return means[0] if was_1d else means


def _pack(lows, highs, points, degenerate, *, level, n, replicates, seed, method, was_1d):
    out = tuple(
        Interval(float(lo), float(hi), float(pt), level, n, replicates, seed, method, bool(dg))
        for lo, hi, pt, dg in zip(lows, highs, points, degenerate)
    )
    return out[0] if was_1d else out


def percentile_ci(values: np.ndarray, *, replicates: int = 10_000, seed: int,
                  level: float = 0.95):
    """Percentile bootstrap CI of the mean.

    values: 1-D array of per-prompt scores → one :class:`Interval`; or 2-D (models, n) → a tuple
    of Intervals (same resample indices for every row, as scipy does along ``axis=-1``).
    Endpoints: the (1−level)/2 and (1+level)/2 linear quantiles of the replicate means.
    """
    x, was_1d = _as_2d(values)
    _check(x, level, replicates)
    theta_b = bootstrap_means(x, replicates=replicates, seed=seed)
    alpha = (1.0 - level) / 2.0
    q = np.quantile(theta_b, [alpha, 1.0 - alpha], axis=-1)  # (2, models)
    degenerate = np.ptp(x, axis=-1) == 0
    return _pack(q[0], q[1], x.mean(axis=-1), degenerate, level=level, n=x.shape[-1],
                 replicates=replicates, seed=seed, method="percentile", was_1d=was_1d)


def percentile_ci_many(groups, *, replicates: int = 10_000, seed: int,
                       level: float = 0.95) -> tuple[Interval, ...]:
    """Percentile CIs for many models with different numbers of cells.

    groups: a sequence of 1-D arrays (one per model). Each model is bootstrapped with the same
    ``seed`` so each interval equals what :func:`percentile_ci` (and scipy) gives for that model
    alone. Models with equal n are computed together in one vectorised call.
    """
    arrays = [np.asarray(g, dtype=float) for g in groups]
    out: list[Interval | None] = [None] * len(arrays)
    by_n: dict[int, list[int]] = {}
    for i, a in enumerate(arrays):
        by_n.setdefault(a.shape[0], []).append(i)
    for n, members in by_n.items():
        stacked = np.stack([arrays[i] for i in members]) if n else np.empty((len(members), 0))
        res = percentile_ci(stacked, replicates=replicates, seed=seed, level=level)
        for i, r in zip(members, res):
            out[i] = r
    return tuple(out)  # type: ignore[arg-type]


def bca_ci(values: np.ndarray, *, replicates: int = 10_000, seed: int, level: float = 0.95):
    """Bias-corrected and accelerated (BCa) bootstrap CI of the mean (Efron & Tibshirani 14.3).

    Same input/output shapes as :func:`percentile_ci`. z0 = Φ⁻¹(share of replicates below θ̂,
    ties counted half); acceleration from jackknife influence values; adjusted levels
    Φ(z0 + (z0+z_α)/(1 − a(z0+z_α))). Degenerate data (all values equal) give NaN endpoints,
    as scipy does. Matches ``scipy.stats.bootstrap(method="BCa")`` with the same Generator.
    """
    x, was_1d = _as_2d(values)
    _check(x, level, replicates)
    n = x.shape[-1]
    theta_b = bootstrap_means(x, replicates=replicates, seed=seed)  # (models, B)
    theta_hat = x.mean(axis=-1, keepdims=True)
    share_below = (np.count_nonzero(theta_b < theta_hat, axis=-1)
                   + np.count_nonzero(theta_b <= theta_hat, axis=-1)) / (2.0 * replicates)
    z0 = ndtri(share_below)
    # jackknife means without resampling loops: (sum − x_i)/(n − 1)
    if n > 1:
        jack = (x.sum(axis=-1, keepdims=True) - x) / (n - 1)
        u = (n - 1) * (jack.mean(axis=-1, keepdims=True) - jack)
        with np.errstate(invalid="ignore", divide="ignore"):
            a_hat = (np.sum(u**3, axis=-1) / n**3) / 6.0 / (np.sum(u**2, axis=-1) / n**2) ** 1.5
    else:
        a_hat = np.full(x.shape[0], np.nan)
    alpha = (1.0 - level) / 2.0
    z_a = float(ndtri(alpha))
    with np.errstate(invalid="ignore", divide="ignore"):
        a1 = ndtr(z0 + (z0 + z_a) / (1 - a_hat * (z0 + z_a)))
        a2 = ndtr(z0 + (z0 - z_a) / (1 - a_hat * (z0 - z_a)))
    lows = np.full(x.shape[0], np.nan)
    highs = np.full(x.shape[0], np.nan)
    ok = np.isfinite(a1) & np.isfinite(a2)
    for m in np.flatnonzero(ok):  # loop over models (few), never over replicates
        lows[m], highs[m] = np.quantile(theta_b[m], [a1[m], a2[m]])
    degenerate = np.ptp(x, axis=-1) == 0
    return _pack(lows, highs, theta_hat[:, 0], degenerate, level=level, n=n,
                 replicates=replicates, seed=seed, method="bca", was_1d=was_1d)


def expanded_percentile_ci(values: np.ndarray, *, replicates: int = 10_000, seed: int,
                           level: float = 0.95):
    """Hesterberg's expanded percentile interval (small-n sensitivity column).

    Uses the quantile levels p₂ = Φ(t_{p, n−1}·sqrt(n/(n−1))) for p = (1∓level)/2, which corrects
    the percentile interval's narrowness (factor sqrt((n−1)/n)) and its z-vs-t gap. Needs n ≥ 2;
    n = 1 gives NaN endpoints. Same shapes as :func:`percentile_ci`.
    """
    x, was_1d = _as_2d(values)
    _check(x, level, replicates)
    n = x.shape[-1]
    theta_b = bootstrap_means(x, replicates=replicates, seed=seed)
    if n < 2:
        lo = hi = np.full(x.shape[0], np.nan)
    else:
        p = (1.0 + level) / 2.0
        p2 = float(ndtr(student_t.ppf(p, n - 1) * np.sqrt(n / (n - 1))))
        q = np.quantile(theta_b, [1.0 - p2, p2], axis=-1)
        lo, hi = q[0], q[1]
    degenerate = np.ptp(x, axis=-1) == 0
    return _pack(lo, hi, x.mean(axis=-1), degenerate, level=level, n=n, replicates=replicates,
                 seed=seed, method="expanded_percentile", was_1d=was_1d)
