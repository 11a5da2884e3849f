"""Yardsticks printed beside the analysis benchmarks (the machine is shared and noisy).

:func:`plain_numpy_ci_s`: wall seconds of the textbook numpy way to get only the per-model 95%
percentile bootstrap intervals of a panel — per model, ``rng.integers(0, n, (B, n))`` indices,
gather, row means, two quantiles (replicates in blocks of 16 MB) — timed on up to ``max_models``
models and scaled linearly to all of them. The analyze figures are printed as ratios to it.
"""

from __future__ import annotations

import os
import time

import numpy as np


def load_average() -> str:
    """The 1/5/15-minute load averages, as printed beside every figure."""
    a, b, c = os.getloadavg()
    return f"load average {a:.1f}/{b:.1f}/{c:.1f} on {os.cpu_count()} cores"


def plain_numpy_ci_s(sizes: list[int], *, replicates: int, seed: int = 0,
                     max_models: int = 10) -> float:
    """Seconds (extrapolated to ``len(sizes)`` models) of the textbook per-model bootstrap of
    models with ``sizes`` cells each."""
    rng = np.random.default_rng(seed)
    picked = sizes[:max_models]
    t0 = time.perf_counter()
    for n in picked:  # one model at a time: the plain way
        x = rng.random(n)
        means = np.empty(replicates)
        rows = max(1, 2_000_000 // n)
        for start in range(0, replicates, rows):
            idx = rng.integers(0, n, (min(rows, replicates - start), n))
            means[start:start + idx.shape[0]] = x[idx].mean(axis=1)
        np.quantile(means, [0.025, 0.975])
    return (time.perf_counter() - t0) * len(sizes) / max(1, len(picked))
