"""Paired comparisons of every model pair over their common prompts, and Holm's step-down
(the pieces of :func:`analysis.stats.ranks.pairwise_rank_set`).

Inputs: a score panel ``s`` (M models × P prompts, unitless scores, NaN where unmeasured) with
its ``observed`` mask; p-values. Outputs: per-pair moments of the score differences, Holm
rejections.
"""

from __future__ import annotations

import numpy as np

__all__ = ["holm", "paired_moments"]


def holm(pvals: np.ndarray, alpha: float) -> np.ndarray:
    """Holm step-down rejections for a 1-D array of p-values at family-wise level alpha."""
    k = pvals.size
    order = np.argsort(pvals, kind="stable")
    thresholds = alpha / (k - np.arange(k))
    below = pvals[order] <= thresholds
    n_reject = k if below.all() else int(np.argmin(below))  # stop at the first acceptance
    rejected = np.zeros(k, dtype=bool)
    rejected[order[:n_reject]] = True
    return rejected


def paired_moments(s: np.ndarray, observed: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pair j < k (``triu_indices`` order): common prompts n, mean and variance (ddof=1)
    of s_j − s_k over them (NaN where n < 1 resp. n < 2). s, observed: (M, P)."""
    a, b = np.triu_indices(s.shape[0], 1)
    n, mean, var = (np.empty(a.size) for _ in range(3))
    # pairs per block: each (block, P) temporary ≤ 4 MB (16 MB blocks made ~80 MB of
    # temporaries at 100 × 10,000); per-row sums, so the blocking changes no value
    step = max(1, 500_000 // max(1, s.shape[1]))
    for lo in range(0, a.size, step):  # blocks of pairs, vectorised inside
        jj, kk = a[lo:lo + step], b[lo:lo + step]
        absent = ~(observed[jj] & observed[kk])
        nb = s.shape[1] - absent.sum(axis=1)
        d = s[jj]
        d -= s[kk]
        np.copyto(d, 0.0, where=absent)
        with np.errstate(invalid="ignore", divide="ignore"):
            mb = d.sum(axis=1) / nb
            d -= mb[:, None]
            np.square(d, out=d)
            np.copyto(d, 0.0, where=absent)
            var[lo:lo + step] = d.sum(axis=1) / (nb - 1)
        n[lo:lo + step], mean[lo:lo + step] = nb, mb
    return n, mean, var
