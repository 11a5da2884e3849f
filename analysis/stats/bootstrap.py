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

Many models at once (:func:`percentile_ci_many`, :func:`percentile_ci_many_metrics`): with
``scheme="auto"`` (default) panels where replicates × (sum of the distinct n) ≤ 5·10⁷ — the
paper's 8 × 22 panel and anything near it — use the scipy-identical draws above per distinct n;
larger panels use the *shared-stream* scheme (:func:`shared_bootstrap_means`): still the ordinary
bootstrap (each replicate draws exactly n_m of the model's own n_m values, i.i.d. uniform, and
the endpoints are the same type-7 percentiles), but the random numbers are shared across models
through counts matrices, so the cost is matrix products of O(replicates · max n · models)
instead of O(replicates · Σ n_m) gathers. Such intervals record ``method="percentile_shared"``;
they agree with scipy's within Monte-Carlo error, not bit for bit. :func:`percentile_ci` (one
model, or rows of equal n) is always scipy-identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
# scipy.special only (scipy.stats costs ~45 MiB RSS): stdtrit is what scipy.stats.t.ppf calls
from scipy.special import ndtr, ndtri, stdtrit

from analysis.errors import AnalysisError
from analysis.stats.shared_stream import shared_bootstrap_means

__all__ = [
    "Interval",
    "bootstrap_means",
    "percentile_ci",
    "percentile_ci_many",
    "percentile_ci_many_metrics",
    "shared_bootstrap_means",
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
        raise AnalysisError(f"values must be 1-D or 2-D (models × prompts); got shape {x.shape}")
    return x, False


def _check(x: np.ndarray, level: float, replicates: int) -> None:
    if x.shape[-1] < 1:
        raise AnalysisError("cannot bootstrap an empty sample: pass at least one value per model")
    if not np.all(np.isfinite(x)):
        raise AnalysisError("values contain NaN/inf: drop missing cells before bootstrapping")
    if not 0.0 < level < 1.0:
        raise AnalysisError(f"level must be in (0, 1); got {level}")
    if replicates < 2:
        raise AnalysisError(f"replicates must be >= 2; got {replicates}")


def bootstrap_means(values: np.ndarray, *, replicates: int, seed: int,
                    max_elements: int = 2_000_000) -> np.ndarray:
    """Replicate means of a nonparametric bootstrap.

    values: 1-D (n,) or 2-D (models, n). Returns (replicates,) or (models, replicates) floats.
    One index matrix ``default_rng(seed).integers(0, n, (replicates, n))`` is shared by all rows.
    The gathered values are reduced in blocks of at most ``max_elements`` (16 MB of float64;
    50 models × 10,000 replicates × 80 prompts at once would be a 320 MB temporary); each mean is
    computed from the same values in the same order as on the whole array, so blocks change
    nothing.
    """
    x, was_1d = _as_2d(values)
    m, n = x.shape
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, (replicates, n))
    means = np.empty((m, replicates))
    rows = max(64, max_elements // max(1, n * m))  # replicates per block
    for start in range(0, replicates, rows):  # memory blocks, vectorised inside
        means[:, start:start + rows] = x[:, idx[start:start + rows]].mean(axis=-1)
    return means[0] if was_1d else means


@dataclass(frozen=True)
class _Stamp:
    """What every interval of one call states about how it was made."""

    level: float
    replicates: int
    seed: int
    method: str


def _pack(lows, highs, points, degenerate, stamp: _Stamp, *, n, was_1d):
    out = tuple(
        Interval(float(lo), float(hi), float(pt), stamp.level, n, stamp.replicates, stamp.seed, stamp.method, bool(dg))
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
    return _pack(q[0], q[1], x.mean(axis=-1), degenerate, _Stamp(level, replicates, seed, "percentile"),
                 n=x.shape[-1], was_1d=was_1d)


def _quantile_pack(theta_b: np.ndarray, x_means, degenerate, stamp: _Stamp, *, ns) -> tuple[Interval, ...]:
    alpha = (1.0 - stamp.level) / 2.0
    q = np.quantile(theta_b, [alpha, 1.0 - alpha], axis=-1)  # (2, models)
    lows, highs = q[0].copy(), q[1].copy()
    # a constant sample has a zero-width interval at its value (the fast scheme's matrix
    # products could otherwise leave ±1 ulp of summation noise)
    lows[degenerate] = highs[degenerate] = np.asarray(x_means)[degenerate]
    return tuple(Interval(float(lo), float(hi), float(pt), stamp.level, int(n), stamp.replicates, stamp.seed,
                          stamp.method, bool(dg))
                 for lo, hi, pt, n, dg in zip(lows, highs, x_means, ns, degenerate))


def percentile_ci_many_metrics(metrics, *, replicates: int = 10_000, seed: int,
                               level: float = 0.95, scheme: str = "auto",
                               exact_max_draws: int = 50_000_000, chunk: int | None = None
                               ) -> tuple[tuple[Interval, ...], ...]:
    """Percentile CIs of several metrics of the same cells, resampled together.

    metrics: a sequence of K metrics, each a sequence of 1-D arrays (one per model; model m has
    the same n_m cells in every metric). Returns one tuple of Intervals per metric, each equal
    to :func:`percentile_ci_many` on that metric alone (the resampling depends on the sizes
    only), at the cost of one resampling.
    scheme: "exact" — per distinct n one scipy-identical index matrix (every interval is
    bit-for-bit what ``scipy.stats.bootstrap(method="percentile")`` and :func:`percentile_ci`
    give for that model alone; O(replicates·n) memory per distinct n); "shared" — the
    shared-stream scheme of :func:`shared_bootstrap_means` (same bootstrap, different
    seeded draws, O(replicates·max n·models) matrix-product work); "auto" — "exact" when
    replicates × (sum of the distinct n) ≤ ``exact_max_draws`` (paper-scale panels), else
    "shared". Intervals record ``method="percentile"`` or ``"percentile_shared"``.
    """
    mets = [[np.asarray(g, dtype=float) for g in groups] for groups in metrics]
    if not mets:
        return ()
    sizes = [a.shape[0] for a in mets[0]]
    for groups in mets:
        if [a.shape[0] for a in groups] != sizes:
            raise AnalysisError("every metric must have the same number of cells per model")
        for a in groups:
            _check(a[None, :], level, replicates)
    if scheme == "auto":
        scheme = "exact" if replicates * sum(set(sizes)) <= exact_max_draws else "shared"
    if scheme == "exact":
        out = []
        for groups in mets:
            res: list[Interval | None] = [None] * len(groups)
            by_n: dict[int, list[int]] = {}
            for i, a in enumerate(groups):
                by_n.setdefault(a.shape[0], []).append(i)
            for members in by_n.values():
                stacked = np.stack([groups[i] for i in members])
                for i, r in zip(members, percentile_ci(stacked, replicates=replicates,
                                                       seed=seed, level=level)):
                    res[i] = r
            out.append(tuple(res))
        return tuple(out)  # type: ignore[arg-type]  # as above
    if scheme != "shared":
        raise AnalysisError(f"scheme must be 'auto', 'exact' or 'shared'; got {scheme!r}")
    stacked_groups = [np.stack([groups[m] for groups in mets]) for m in range(len(sizes))]
    theta_b = shared_bootstrap_means(stacked_groups, replicates=replicates, seed=seed,
                                     chunk=chunk)  # (K, models, B)
    out = []
    for k, groups in enumerate(mets):
        means = np.array([a.mean() for a in groups])
        degenerate = np.array([np.ptp(a) == 0 for a in groups])
        out.append(_quantile_pack(theta_b[k], means, degenerate, _Stamp(level, replicates, seed, "percentile_shared"),
                                  ns=sizes))
    return tuple(out)  # type: ignore[arg-type]  # _quantile_pack fills every slot


def percentile_ci_many(groups, *, replicates: int = 10_000, seed: int,
                       level: float = 0.95, scheme: str = "auto",
                       exact_max_draws: int = 50_000_000, chunk: int | None = None
                       ) -> tuple[Interval, ...]:
    """Percentile CIs for many models with different numbers of cells.

    groups: a sequence of 1-D arrays (one per model). With ``scheme="exact"`` (and "auto" on
    small panels, see :func:`percentile_ci_many_metrics`) each model is bootstrapped with the
    same ``seed`` so each interval equals what :func:`percentile_ci` (and scipy) gives for that
    model alone; models with equal n are computed together in one vectorised call. Large
    panels use the shared-stream scheme (same bootstrap, documented different draws).
    """
    return percentile_ci_many_metrics([groups], replicates=replicates, seed=seed, level=level,
                                      scheme=scheme, exact_max_draws=exact_max_draws,
                                      chunk=chunk)[0]


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
    return _pack(lows, highs, theta_hat[:, 0], degenerate, _Stamp(level, replicates, seed, "bca"), n=n, was_1d=was_1d)


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
        p2 = float(ndtr(stdtrit(n - 1, p) * np.sqrt(n / (n - 1))))  # = t.ppf(p, n-1)
        q = np.quantile(theta_b, [1.0 - p2, p2], axis=-1)
        lo, hi = q[0], q[1]
    degenerate = np.ptp(x, axis=-1) == 0
    return _pack(lo, hi, x.mean(axis=-1), degenerate, _Stamp(level, replicates, seed, "expanded_percentile"),
                 n=n, was_1d=was_1d)
