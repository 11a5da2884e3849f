"""Confidence intervals for the mean of a bounded variable by betting (Waudby-Smith & Ramdas,
"Estimating means of bounded random variables by betting", JRSS-B 2024).

Inputs: ``values`` (rows, n) of i.i.d. scores in ``bounds`` (unitless, e.g. Jaccard in [0, 1]);
outputs: (low, high) arrays in the units of the values. No bootstrap, no random numbers: the
interval is a function of the values in their given order.

On the unit scale, a gambler who bets that the mean is above a candidate m keeps the capital
K⁺ₜ(m) = ∏ᵢ≤ₜ (1 + λᵢ⁺(m)(xᵢ − m)); one who bets it is below keeps
K⁻ₜ(m) = ∏ᵢ≤ₜ (1 − λᵢ⁻(m)(xᵢ − m)). Under mean m both are nonnegative martingales, so by
Markov's inequality P(K⁺ₙ(m) ≥ 2/α) ≤ α/2, and likewise for K⁻. The interval is every m that
neither gambler rejects at n, i.e. log K < c_α on both sides:

* **exact** (``calibrated=False``), c_α = log(2/α): valid at every n for every distribution on
  the bounds (no asymptotics). It over-covers: for large n it tends to x̄ ± √(2 log(2/α))·σ̂/√n
  (√(2 log 40) = 2.72 at α = 0.05 instead of 1.96).
* **calibrated** (``calibrated=True``), c_α = z²/2 with z = Φ⁻¹(1 − α/2): the same bets and
  test read at the threshold whose large-n interval is x̄ ± z·σ̂/√n, the normal interval at the
  nominal level; at small n it stays wider than that, which is where the bootstrap intervals
  are too narrow. Its worst-case guarantee is only 1 − 2e^(−z²/2) (0.707 at level 0.95); its
  coverage on study-like data is measured by ``bench/interval_coverage.py``.

The bets are the paper's predictable plug-in, tuned to the fixed n:
λᵢ = √(2 c_α / (n σ̂²ᵢ₋₁)), σ̂² the running variance with a prior observation (mean 1/2,
variance 1/4), truncated at c/m for K⁺ and c/(1 − m) for K⁻ (c = ``truncation`` = 1/2) so
that no factor falls below 1 − c. With these truncations K⁺ falls and K⁻ rises with m, so each
endpoint is the boundary of a monotone rejection region, found by bisection (``iterations``
halvings of the range, vectorised over rows). The two one-sided tests at α/2 each (instead of
the paper's hedged sum) keep the endpoints separable; they cost at most a factor 2 in the
rejection threshold.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri

from analysis.errors import AnalysisError

__all__ = ["betting_bets", "betting_endpoints", "lower_capital", "threshold"]


def threshold(level: float, calibrated: bool, scale: float = 1.0) -> float:
    """c_α of the module docstring: log(2/α) (exact) or z²/2 (calibrated), times ``scale``."""
    alpha = 1.0 - level
    c = float(ndtri(1.0 - alpha / 2.0) ** 2 / 2.0) if calibrated else float(np.log(2.0 / alpha))
    return scale * c


def betting_bets(u: np.ndarray, c_alpha: float) -> np.ndarray:
    """Untruncated predictable bets λ (rows, n) of unit-scale values ``u`` (rows, n)."""
    n = u.shape[1]
    t = np.arange(1, n + 1)
    mu = (0.5 + np.cumsum(u, axis=1)) / (t + 1)
    sig2 = (0.25 + np.cumsum((u - mu) ** 2, axis=1)) / (t + 1)
    prev = np.concatenate([np.full((u.shape[0], 1), 0.25), sig2[:, :-1]], axis=1)
    return np.sqrt(2.0 * c_alpha / (n * prev))


def lower_capital(u: np.ndarray, bets: np.ndarray, m: np.ndarray, truncation: float
                  ) -> np.ndarray:
    """log K⁺ₙ(m) per row: u, bets (rows, n); m (rows,) candidate means in (0, 1]."""
    lam = np.minimum(bets, truncation / m[:, None])
    return np.sum(np.log1p(lam * (u - m[:, None])), axis=1)


def _lower(u: np.ndarray, c_alpha: float, truncation: float, iterations: int) -> np.ndarray:
    """Lower endpoint on the unit scale: the smallest m that K⁺ does not reject (searched
    below the mean; a boundary above it is reported as the mean, the wider side)."""
    bets = betting_bets(u, c_alpha)
    lo, hi = np.zeros(u.shape[0]), u.mean(axis=1)
    hi = np.maximum(hi, np.finfo(float).tiny)
    for _ in range(iterations):  # bisection: vectorised over rows, one pass per halving
        mid = 0.5 * (lo + hi)
        reject = lower_capital(u, bets, np.maximum(mid, np.finfo(float).tiny),
                               truncation) >= c_alpha
        lo = np.where(reject, mid, lo)
        hi = np.where(reject, hi, mid)
    return lo


def betting_endpoints(values: np.ndarray, level: float, bounds: tuple[float, float],
                      calibrated: bool = False, truncation: float = 0.5, iterations: int = 32,
                      threshold_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) betting interval of each row's mean (module docstring).

    values: (rows, n), every value inside ``bounds``; level: nominal two-sided coverage;
    calibrated: the threshold (module docstring); truncation: c in (0, 1]; iterations:
    bisection halvings (32 → endpoints within 2.5e-10 of the range, each on its wider side);
    threshold_scale: a factor on c_α (and so on the bets), 1 for the methods themselves and
    other values for the threshold sweep of ``bench/interval_coverage.py``."""
    x = np.atleast_2d(np.asarray(values, dtype=float))
    lo_b, hi_b = bounds
    if x.shape[1] < 1 or not np.all(np.isfinite(x)):
        raise AnalysisError("betting interval needs finite values and at least one prompt")
    if np.any(x < lo_b) or np.any(x > hi_b):
        raise AnalysisError(f"betting interval needs values inside {bounds}")
    if not 0.0 < truncation <= 1.0:
        raise AnalysisError(f"truncation must be in (0, 1]; got {truncation}")
    if not threshold_scale > 0.0:
        raise AnalysisError(f"threshold_scale must be positive; got {threshold_scale}")
    u = (x - lo_b) / (hi_b - lo_b)
    c_alpha = threshold(level, calibrated, threshold_scale)
    low = _lower(u, c_alpha, truncation, iterations)
    # the upper endpoint is the lower one of the mirrored values 1 − u (K⁻ is K⁺ mirrored)
    high = 1.0 - _lower(1.0 - u, c_alpha, truncation, iterations)
    return lo_b + (hi_b - lo_b) * low, lo_b + (hi_b - lo_b) * high
