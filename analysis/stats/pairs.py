"""Paired within-family comparison of two models on their common prompts (metrics.md).

Inputs: two prompt-aligned 1-D float arrays ``a`` and ``b`` (same length, one entry per prompt of
the panel, NaN = cell not measured), e.g. per-cell mean Jaccard (unitless, [0, 1]).
Output: :class:`PairResult`. Differences are d = b − a over prompts where both are finite,
rounded to 12 decimals so that float noise cannot turn a tie or a zero into a non-zero.

Conventions:
* p_zsplit: ``scipy.stats.wilcoxon(d, zero_method="zsplit")`` (zeros kept, their ranks split
  between the signs); p_drop: ``zero_method="wilcox"`` (zeros dropped before ranking). scipy's
  default ``method="auto"`` (exact / exact-conditional permutation for len(d) ≤ 13 with
  zeros or ties / normal approximation otherwise) and ``correction=False``.
* All differences zero (including n_common = 1 with a zero difference): both p = 1.0 and
  rank_biserial = NaN (no non-zero difference to rank: the direction is undefined).
* n_common < 2 with a non-zero difference: both p = NaN (no test possible).
* rank_biserial: matched-pairs rank-biserial r = (W+ − W−)/(W+ + W−) over the NON-ZERO
  differences (ranks among the non-zeros, mid-ranks for ties) — the drop-zeros convention, equal
  to pingouin's RBC. Positive r means b tends to exceed a.
* p_floor: the smallest exact two-sided p attainable with n_nonzero differences, 2^(1 − n'):
  with n' ≤ 5 a drop-zeros test can never reach 0.05 ("cannot reject by construction").
* mdd: minimum detectable difference of the mean (same units as the scores): the smallest
  constant shift of the mean difference detectable by a two-sided paired test at level ``alpha``
  with power ``power`` under a normal approximation, mdd = (z_{1−α/2} + z_{power}) · sd(d) / √n
  with sd the sample SD (ddof = 1) of the differences and n = n_common (Miller 2024 MDE,
  rank-statistics.md §2.5). NaN when n_common < 2; 0 when all differences are equal.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from analysis.errors import AnalysisError

__all__ = ["PairResult", "paired_comparison", "rank_biserial"]


@dataclass(frozen=True)
class PairResult:
    """Outcome of :func:`paired_comparison`; see the module docstring for every convention.

    n_common: prompts measured for both; n_nonzero: of those, non-zero differences;
    mean_diff: mean of b − a (score units); p_zsplit / p_drop: two-sided Wilcoxon p-values;
    rank_biserial: drop-zeros matched-pairs r in [−1, 1]; p_floor: 2^(1 − n_nonzero) (1.0 if
    n_nonzero = 0); mdd: minimum detectable difference (score units) at ``alpha``/``power``.
    """

    n_common: int
    n_nonzero: int
    mean_diff: float
    p_zsplit: float
    p_drop: float
    rank_biserial: float
    p_floor: float
    mdd: float
    alpha: float
    power: float


def rank_biserial(d: np.ndarray) -> float:
    """Matched-pairs rank-biserial r over the non-zero entries of ``d``; NaN if none."""
    d = np.asarray(d, dtype=float)
    nz = d[d != 0]
    if nz.size == 0:
        return float("nan")
    from scipy.stats import rankdata  # lazy: scipy.stats costs ~45 MiB RSS (panel path needs none)

    r = rankdata(np.abs(nz))
    w_plus, w_minus = r[nz > 0].sum(), r[nz < 0].sum()
    return float((w_plus - w_minus) / (w_plus + w_minus))


def paired_comparison(a: np.ndarray, b: np.ndarray, *, alpha: float = 0.05,
                      power: float = 0.8) -> PairResult:
    """Compare model b against model a on their common prompts (d = b − a)."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise AnalysisError(f"a and b must be prompt-aligned 1-D arrays; got {a.shape}, {b.shape}")
    common = np.isfinite(a) & np.isfinite(b)
    d = np.round(b[common] - a[common], 12)
    n = int(d.size)
    n_nonzero = int(np.count_nonzero(d))
    mean_diff = float(d.mean()) if n else float("nan")
    if n_nonzero == 0:
        p_z = p_d = 1.0 if n else float("nan")
    elif n < 2:
        p_z = p_d = float("nan")
    else:
        from scipy.stats import wilcoxon  # lazy: scipy.stats costs ~45 MiB RSS

        with warnings.catch_warnings():
            # scipy warns about small samples / exact-with-ties; the conventions are documented
            warnings.simplefilter("ignore")
            p_z = float(wilcoxon(d, zero_method="zsplit").pvalue)
            p_d = float(wilcoxon(d, zero_method="wilcox").pvalue)
    if n >= 2:
        z = float(ndtri(1 - alpha / 2) + ndtri(power))
        mdd = z * float(np.std(d, ddof=1)) / np.sqrt(n)
    else:
        mdd = float("nan")
    return PairResult(
        n_common=n, n_nonzero=n_nonzero, mean_diff=mean_diff, p_zsplit=p_z, p_drop=p_d,
        rank_biserial=rank_biserial(d), p_floor=float(2.0 ** (1 - n_nonzero)) if n_nonzero else 1.0,
        mdd=float(mdd), alpha=alpha, power=power)
