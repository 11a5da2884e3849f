"""Benjamini–Hochberg adjusted p-values (q-values) for a family of tests."""

from __future__ import annotations

import numpy as np

from analysis.errors import AnalysisError

__all__ = ["bh_qvalues"]


def bh_qvalues(p_values: np.ndarray) -> np.ndarray:
    """BH q-values of ``p_values`` (1-D, each in [0, 1]), in input order.

    q_(i) = min over j ≥ i of m·p_(j)/j, capped at 1 (the step-up procedure: rejecting every test
    with q ≤ alpha controls the false discovery rate at alpha for independent or positively
    dependent tests). Equals ``scipy.stats.false_discovery_control(p, method="bh")``.
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1:
        raise AnalysisError(f"p-values must be 1-D, got shape {p.shape}")
    if p.size == 0:
        return p.copy()
    if not np.all((p >= 0) & (p <= 1)):
        raise AnalysisError("p-values must lie in [0, 1]")
    m = p.size
    order = np.argsort(p, kind="stable")
    scaled = p[order] * m / np.arange(1, m + 1)
    q_sorted = np.minimum.accumulate(scaled[::-1])[::-1]
    q = np.empty(m)
    q[order] = np.minimum(q_sorted, 1.0)
    return q
