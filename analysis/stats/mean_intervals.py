"""One entry point for the per-model mean interval, by method name.

``METHODS``: "percentile" (the study's interval, scipy-identical), "bca", "studentized",
"double" (:mod:`analysis.stats.small_sample`), "betting" and "calibrated_betting"
(:mod:`analysis.stats.betting`). :func:`equal_n_intervals` computes one method on rows of
equal n; the bootstrap methods but "percentile" end with
:func:`analysis.stats.small_sample.finish_endpoints` (clip to the metric's bounds, exact
one-sided limit for a sample on a bound), so the percentile path stays the published one. The
betting intervals stay inside the bounds by construction; a sample on a bound is widened to
reach at least that exact one-sided limit, and a constant sample inside keeps its (non-zero)
betting width.
"""

from __future__ import annotations

import numpy as np

from analysis.errors import AnalysisError
from analysis.stats.betting import betting_endpoints
from analysis.stats.bootstrap import Interval, bca_ci, percentile_ci
from analysis.stats.small_sample import (
    Resampling,
    double_ci,
    finish_endpoints,
    studentized_ci,
    studentized_endpoints,
)

__all__ = ["METHODS", "betting_with_bounds", "equal_n_intervals", "endpoints", "panel_intervals"]

METHODS = ("percentile", "bca", "studentized", "double", "betting", "calibrated_betting")
# methods without replicates: each model's interval is computed alone at any panel size
_DIRECT = ("betting", "calibrated_betting")


def _bca(x: np.ndarray, spec: Resampling) -> tuple[Interval, ...]:
    raw = bca_ci(x, replicates=spec.replicates, seed=spec.seed, level=spec.level)
    low, high = finish_endpoints(np.array([r.low for r in raw]), np.array([r.high for r in raw]),
                                 x, spec.level, spec.bounds)
    return tuple(Interval(float(lo), float(hi), r.point, r.level, r.n, r.replicates, r.seed,
                          "bca", r.degenerate) for lo, hi, r in zip(low, high, raw))


def betting_with_bounds(values: np.ndarray, spec: Resampling, calibrated: bool,
                        threshold_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) betting endpoints of each row of ``values`` (rows, n) in ``spec.bounds``,
    a sample on a bound widened to reach at least the exact one-sided limit.
    ``threshold_scale``: :func:`analysis.stats.betting.betting_endpoints`'s (1 for the methods)."""
    x = np.atleast_2d(np.asarray(values, dtype=float))
    if spec.bounds is None:
        raise AnalysisError("the betting interval needs the metric's bounds")
    low, high = betting_endpoints(x, spec.level, spec.bounds, calibrated=calibrated,
                                  threshold_scale=threshold_scale)
    exact_low, exact_high = finish_endpoints(low, high, x, spec.level, spec.bounds)
    on_bound = (np.ptp(x, axis=-1) == 0) & np.isin(x[:, 0], spec.bounds)
    return (np.where(on_bound, np.minimum(low, exact_low), low),
            np.where(on_bound, np.maximum(high, exact_high), high))


def _betting(x: np.ndarray, spec: Resampling, method: str) -> tuple[Interval, ...]:
    """Betting intervals (no replicates: ``replicates`` is recorded as 0); needs bounds."""
    low, high = betting_with_bounds(x, spec, calibrated=method == "calibrated_betting")
    degenerate = np.ptp(x, axis=-1) == 0
    return tuple(Interval(float(lo), float(hi), float(pt), spec.level, x.shape[1], 0, spec.seed,
                          method, bool(dg))
                 for lo, hi, pt, dg in zip(low, high, x.mean(axis=-1), degenerate))


def equal_n_intervals(values: np.ndarray, method: str, spec: Resampling
                      ) -> tuple[Interval, ...]:
    """Intervals of the mean of each row of ``values`` (rows, n), unitless scores, by
    ``method`` (one of :data:`METHODS`); rows share their draws. Returns one Interval per row."""
    x = np.atleast_2d(np.asarray(values, dtype=float))
    if method == "percentile":
        return tuple(percentile_ci(x, replicates=spec.replicates, seed=spec.seed,
                                   level=spec.level))
    if method == "bca":
        return _bca(x, spec)
    if method == "studentized":
        return tuple(studentized_ci(x, spec))
    if method == "double":
        return tuple(double_ci(x, spec))
    if method in _DIRECT:
        return _betting(x, spec, method)
    raise AnalysisError(f"interval method must be one of {', '.join(METHODS)}; got {method!r}")


def endpoints(values: np.ndarray, method: str, spec: Resampling
              ) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) arrays of :func:`equal_n_intervals` (for coverage simulations)."""
    ivs = equal_n_intervals(values, method, spec)
    return np.array([iv.low for iv in ivs]), np.array([iv.high for iv in ivs])


def _exact(mets: list[list[np.ndarray]], method: str, spec: Resampling
           ) -> tuple[tuple[Interval, ...], ...]:
    """Per distinct n, rows stacked and computed together (same seed for every n, so a model's
    interval is what it gets alone)."""
    by_n: dict[int, list[int]] = {}
    for i, a in enumerate(mets[0]):
        by_n.setdefault(a.shape[0], []).append(i)
    out = []
    for groups in mets:
        res: list[Interval] = [None] * len(groups)  # type: ignore[list-item]  # filled below
        for members in by_n.values():
            stacked = np.stack([groups[i] for i in members])
            for i, iv in zip(members, equal_n_intervals(stacked, method, spec)):
                res[i] = iv
        out.append(tuple(res))
    return tuple(out)


def _bca_levels(theta_b: np.ndarray, x: np.ndarray, level: float) -> tuple[float, float]:
    """BCa quantile levels of one model from its replicate means and its values (as
    :func:`analysis.stats.bootstrap.bca_ci`: z0 with ties half, jackknife acceleration)."""
    from scipy.special import ndtr, ndtri

    n, theta = x.size, x.mean()
    share = (np.count_nonzero(theta_b < theta) + np.count_nonzero(theta_b <= theta)) / (2.0 * theta_b.size)
    z0 = float(ndtri(share))
    u = (n - 1) * (x - theta) if n > 1 else np.zeros(1)  # the mean's jackknife influence
    den = 6.0 * np.sum(u**2) ** 1.5
    a_hat = float(np.sum(u**3) / den) if den > 0 else 0.0
    z_a = float(ndtri((1.0 - level) / 2.0))
    lo = ndtr(z0 + (z0 + z_a) / (1 - a_hat * (z0 + z_a)))
    hi = ndtr(z0 + (z0 - z_a) / (1 - a_hat * (z0 - z_a)))
    return float(lo), float(hi)


def _shared_one(k: int, groups: list[np.ndarray], stats: np.ndarray, kk: int, method: str,
                spec: Resampling) -> tuple[Interval, ...]:
    """Intervals of metric k from shared-stream replicate means ``stats`` (2·kk, models, B):
    metric means in rows 0..kk−1, means of their squares in rows kk..2kk−1."""
    out = []
    for m, x in enumerate(groups):  # loop over models (few); each is vectorised over replicates
        n = x.size
        row = x[None, :]
        if method == "studentized" and n > 1:
            mean_b = stats[k, m][None, :]
            var_b = np.maximum(stats[kk + k, m] - stats[k, m] ** 2, 0.0) * n / (n - 1)
            ends = studentized_endpoints(np.array([x.mean()]), np.array([x.std(ddof=1)]) / np.sqrt(n),
                                         mean_b, np.sqrt(var_b)[None, :] / np.sqrt(n), spec.level)
        elif method == "bca" and n > 1 and np.ptp(x) > 0:
            ends = tuple(np.quantile(stats[k, m], list(_bca_levels(stats[k, m], x, spec.level)))[:, None])
        else:  # a constant sample (n = 1 included): finish_endpoints decides
            ends = (np.array([np.nan]), np.array([np.nan]))
        low, high = finish_endpoints(ends[0], ends[1], row, spec.level, spec.bounds)
        out.append(Interval(float(low[0]), float(high[0]), float(x.mean()), spec.level, n,
                            spec.replicates, spec.seed, f"{method}_shared", bool(np.ptp(x) == 0)))
    return tuple(out)


def panel_intervals(metrics, method: str, spec: Resampling, exact_max_draws: int = 50_000_000
                    ) -> tuple[tuple[Interval, ...], ...]:
    """Intervals of several metrics of the same cells of many models, by ``method``.

    metrics: K sequences of 1-D arrays (one per model, model m with n_m cells in every metric).
    "percentile" is :func:`analysis.stats.bootstrap.percentile_ci_many_metrics` unchanged.
    Other methods: when replicates × (sum of the distinct n) ≤ ``exact_max_draws`` (paper-scale
    panels) each model's interval is the one it gets alone (:func:`equal_n_intervals`); larger
    panels draw the shared-stream replicates of the metrics and their squares at once
    (:func:`analysis.stats.shared_stream.shared_bootstrap_means`, ``method`` recorded with a
    ``_shared`` suffix). "double" has no large-panel scheme (its cost is replicates × inner ×
    n per model) and fails there with the way out.
    """
    from analysis.stats.bootstrap import percentile_ci_many_metrics
    from analysis.stats.shared_stream import shared_bootstrap_means

    if method == "percentile":
        return percentile_ci_many_metrics(metrics, replicates=spec.replicates, seed=spec.seed,
                                          level=spec.level, exact_max_draws=exact_max_draws)
    mets = [[np.asarray(g, dtype=float) for g in groups] for groups in metrics]
    if not mets:
        return ()
    sizes = [a.shape[0] for a in mets[0]]
    if method in _DIRECT or spec.replicates * sum(set(sizes)) <= exact_max_draws:
        return _exact(mets, method, spec)
    if method not in ("studentized", "bca"):
        raise AnalysisError(f"--interval {method} is too slow for a panel this large "
                            f"(replicates x distinct prompt counts > {exact_max_draws}); use "
                            "studentized, or fewer replicates")
    kk = len(mets)
    stacked = [np.stack([groups[m] for groups in mets] + [groups[m] ** 2 for groups in mets])
               for m in range(len(sizes))]
    stats = shared_bootstrap_means(stacked, replicates=spec.replicates, seed=spec.seed)
    return tuple(_shared_one(k, mets[k], stats, kk, method, spec) for k in range(kk))
