"""Stability versus correctness over models, with a leave-one-out robustness table.

Unit of analysis: the model (one point per model measured both ways), so points are independent.
Inputs: ``stability`` (M,) per-model stability (e.g. mean Jaccard, unitless) and a correctness
metric (M,) (fraction in [0, 1]); ``models`` (M,) names. Outputs: :class:`Correlation` (Pearson r
with its t-test p, ``scipy.stats.pearsonr``; Spearman ρ with scipy's t-approximation p,
``scipy.stats.spearmanr``) and :class:`LeaveOneOut` (the same after dropping each model in turn).
Fewer than 3 points, or a constant input, give NaN statistics. ``small_n`` flags n < 6 (each
drop-one estimate then rests on ≤ 4 points).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analysis.errors import AnalysisError

__all__ = ["Correlation", "LeaveOneOut", "MetricCorrelation", "correlate", "leave_one_out",
           "stability_vs_correctness"]


@dataclass(frozen=True)
class Correlation:
    """n points; pearson_r/pearson_p; spearman_rho/spearman_p (two-sided); NaN when undefined."""

    n: int
    pearson_r: float
    pearson_p: float
    spearman_rho: float
    spearman_p: float


def correlate(x: np.ndarray, y: np.ndarray) -> Correlation:
    """Pearson and Spearman of two aligned 1-D arrays (NaN pairs dropped)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise AnalysisError(f"x and y must be aligned 1-D arrays; got {x.shape} and {y.shape}")
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    n = int(x.size)
    nan = float("nan")
    if n < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return Correlation(n, nan, nan, nan, nan)
    from scipy.stats import pearsonr, spearmanr  # lazy: scipy.stats costs ~45 MiB RSS

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns near-constant input; NaN is returned then
        pr = pearsonr(x, y)
        sr = spearmanr(x, y)
    return Correlation(n, float(pr.statistic), float(pr.pvalue), float(sr.statistic),
                       float(sr.pvalue))


@dataclass(frozen=True, eq=False)
class LeaveOneOut:
    """Drop-one table. dropped (M,) model names; pearson_r/pearson_p/spearman_rho/spearman_p
    (M,) after dropping that model; pearson_significant / spearman_significant (M,) bool p < α.
    full: the all-models Correlation; alpha; survives_pearson / survives_spearman: True iff no
    single deletion flips the sign or the significance; max_abs_change_r (and the model
    attaining it); jackknife_se_r = sqrt((n−1)/n · Σ (r_(−i) − mean)²); small_n: n < 6."""

    dropped: tuple[str, ...]
    pearson_r: np.ndarray
    pearson_p: np.ndarray
    spearman_rho: np.ndarray
    spearman_p: np.ndarray
    pearson_significant: np.ndarray
    spearman_significant: np.ndarray
    full: Correlation
    alpha: float
    survives_pearson: bool
    survives_spearman: bool
    max_abs_change_r: float
    max_change_model: str
    jackknife_se_r: float
    small_n: bool


def _survives(full_stat, full_p, stats, ps, alpha) -> bool:
    if not np.isfinite(full_stat):
        return False
    same_sign = np.sign(stats) == np.sign(full_stat)
    same_sig = (ps < alpha) == (full_p < alpha)
    return bool(np.all(same_sign & same_sig))


def leave_one_out(x: np.ndarray, y: np.ndarray, models: Sequence[str], *,
                  alpha: float = 0.05) -> LeaveOneOut:
    """Recompute both correlations with each model removed (see :class:`LeaveOneOut`)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    names = tuple(str(m) for m in models)
    if len(names) != x.size:
        raise AnalysisError(f"models has {len(names)} names for {x.size} points")
    full = correlate(x, y)
    keep = ~np.eye(x.size, dtype=bool)
    rows = [correlate(x[k], y[k]) for k in keep]  # one correlation per dropped model
    r = np.array([c.pearson_r for c in rows])
    rp = np.array([c.pearson_p for c in rows])
    rho = np.array([c.spearman_rho for c in rows])
    sp = np.array([c.spearman_p for c in rows])
    change = np.abs(r - full.pearson_r)
    if np.any(np.isfinite(change)):
        i = int(np.nanargmax(change))
        max_change, who = float(change[i]), names[i]
    else:
        max_change, who = float("nan"), ""
    n = x.size
    jack = float(np.sqrt((n - 1) / n * np.sum((r - r.mean()) ** 2))) if n else float("nan")
    return LeaveOneOut(
        dropped=names, pearson_r=r, pearson_p=rp, spearman_rho=rho, spearman_p=sp,
        pearson_significant=rp < alpha, spearman_significant=sp < alpha, full=full, alpha=alpha,
        survives_pearson=_survives(full.pearson_r, full.pearson_p, r, rp, alpha),
        survives_spearman=_survives(full.spearman_rho, full.spearman_p, rho, sp, alpha),
        max_abs_change_r=max_change, max_change_model=who, jackknife_se_r=jack,
        small_n=n < 6)


@dataclass(frozen=True, eq=False)
class MetricCorrelation:
    """One correctness metric's correlation with stability: metric name, full result, drop-one."""

    metric: str
    full: Correlation
    loo: LeaveOneOut


def stability_vs_correctness(stability: np.ndarray, metrics: Sequence[tuple[str, np.ndarray]],
                             models: Sequence[str], *, alpha: float = 0.05
                             ) -> tuple[MetricCorrelation, ...]:
    """For each (name, values) correctness metric aligned with ``models``: correlation with
    ``stability`` plus its leave-one-out table. Models with NaN in either are dropped first."""
    st = np.asarray(stability, dtype=float)
    out = []
    for name, values in metrics:
        v = np.asarray(values, dtype=float)
        ok = np.isfinite(st) & np.isfinite(v)
        kept = [m for m, k in zip(models, ok) if k]
        loo = leave_one_out(st[ok], v[ok], kept, alpha=alpha)
        out.append(MetricCorrelation(name, loo.full, loo))
    return tuple(out)
