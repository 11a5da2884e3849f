"""Measurement waves with known truth, in process: the node sets a simulated model gives a panel
of prompts, and the revision of a model that lowers its expected Jaccard by a chosen amount.

What the wave comparison (``analysis.waves``) is validated against: the same ``SimModel``
re-seeded between waves is an unchanged model; a ``SimModel`` with a higher ``drop_prob`` is a
revision whose effect on the mean node-set Jaccard comes from
:func:`simulator.model.expected_node_set_jaccard`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simulator.config import SimModel
from simulator.model import expected_node_set_jaccard, inferred_pool, simulate_ir
from storage.annotations import Annotation, AnnotationSet

__all__ = ["panel_truths", "simulate_node_sets", "mean_expected_jaccard", "revision_for_drop"]


def panel_truths(prompts: int, sizes: Sequence[int] = (8, 10, 12, 14, 16)) -> list[AnnotationSet]:
    """``prompts`` ground truths; prompt p has ``sizes[p % len(sizes)]`` distinct rule ids."""
    out = []
    for p in range(prompts):
        n = sizes[p % len(sizes)]
        anns = tuple(Annotation(tag="rule", kind="Rule", id=f"RULE:p{p}_r{k}", line=k + 1)
                     for k in range(n))
        out.append(AnnotationSet(annotations=anns, warnings=()))
    return out


def simulate_node_sets(truths: Sequence[AnnotationSet], params: SimModel, runs: int,
                       rng: np.random.Generator) -> list[list[frozenset[str]]]:
    """Per prompt, the node-id sets of ``runs`` simulated runs (``simulate_ir``)."""
    out = []
    for p, truth in enumerate(truths):
        uri = f"sim://prompt/{p}"
        pool = inferred_pool(truth, uri, params)
        out.append([frozenset(n["id"] for n in simulate_ir(truth, uri, params, rng, pool=pool)["nodes"])
                    for _ in range(runs)])
    return out


def mean_expected_jaccard(params: SimModel, truths: Sequence[AnnotationSet], runs: int,
                          n_sims: int, seed: int) -> float:
    """Expected mean node-set Jaccard of a panel: the mean over its distinct truth sizes of
    :func:`expected_node_set_jaccard` (Monte Carlo with ``n_sims`` cells each; the same
    ``seed`` everywhere, so nearby parameters share their random numbers)."""
    by_size: dict[int, AnnotationSet] = {}
    for t in truths:
        by_size.setdefault(len(t.ids), t)
    weights = np.array([sum(len(t.ids) == s for t in truths) for s in by_size], float)
    values = np.array([expected_node_set_jaccard(params, t, runs, n_sims, seed)[0]
                       for t in by_size.values()])
    return float(np.dot(weights, values) / weights.sum())


def revision_for_drop(base: SimModel, truths: Sequence[AnnotationSet], effect: float, runs: int,
                      n_sims: int = 400, seed: int = 0) -> SimModel:
    """``base`` with a higher ``drop_prob`` whose expected panel Jaccard is ``effect`` lower
    (unitless, > 0), found by bisection on ``drop_prob`` (12 halvings: within 0.0003)."""
    target = mean_expected_jaccard(base, truths, runs, n_sims, seed) - effect
    lo, hi = base.drop_prob, 0.95
    for _ in range(12):
        mid = (lo + hi) / 2
        if mean_expected_jaccard(base.model_copy(update={"drop_prob": mid}), truths, runs,
                                 n_sims, seed) > target:
            lo = mid
        else:
            hi = mid
    return base.model_copy(update={"drop_prob": (lo + hi) / 2})
