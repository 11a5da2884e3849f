"""Correctness of emitted node ids against annotation ground truth (metrics.md, annotated prompts).

Ground truth of a prompt: ``parse_annotations(text).ids`` (distinct declared ids, case kept).
Per run, ids are compared as DISTINCT sets (exact strings):
* recall = |truth ∩ emitted| / |truth|                         (1 when truth is empty);
* explicit precision = |truth ∩ explicit| / |explicit|, explicit = distinct ids of nodes whose
  ``meta.inferred`` is false (JSON false or the string "false", any case)   (0 when there are
  none; such runs are flagged ``no_explicit`` and must be counted in the report);
* all-node precision = |truth ∩ emitted| / |emitted|            (0 when nothing was emitted);
* F1 = harmonic mean of all-node precision and recall           (0 when both are 0).
  F1 penalises the inferred nodes that the instruction asks for: say so next to it.
All scores are fractions in [0, 1]. Per model: run-weighted means (every run counts once, so
cells with more runs weigh more).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from analysis.errors import AnalysisError
from storage.annotations import parse_annotations

__all__ = ["RunScore", "ModelCorrectness", "truth_ids", "emitted_from_json", "score_run",
           "score_runs", "model_means"]


@dataclass(frozen=True)
class RunScore:
    """Correctness of one run (fractions in [0, 1]); no_explicit: the run marked no node
    inferred=false; n_truth / n_emitted / n_explicit: distinct-id counts."""

    recall: float
    explicit_precision: float
    all_precision: float
    f1: float
    no_explicit: bool
    n_truth: int
    n_emitted: int
    n_explicit: int


def truth_ids(prompt_text: str) -> frozenset[str]:
    """Ground-truth ids of a prompt file's text (annotation parser; never raises)."""
    return parse_annotations(prompt_text).ids


def _is_false(value) -> bool:
    return value is False or (isinstance(value, str) and value.strip().lower() == "false")


def emitted_from_json(ir_json: str) -> tuple[frozenset[str], frozenset[str]]:
    """(distinct emitted ids, distinct explicit ids) of one IR JSON text.

    Lenient like the drift parser: a missing ``nodes`` list means no nodes; non-object nodes are
    skipped; nodes without an id are ignored. Raises ValueError when the text is not JSON.
    """
    doc = json.loads(ir_json)
    nodes = doc.get("nodes") if isinstance(doc, Mapping) else None
    emitted, explicit = set(), set()
    for n in nodes if isinstance(nodes, list) else []:
        if not isinstance(n, Mapping) or n.get("id") is None:
            continue
        nid = str(n["id"])
        emitted.add(nid)
        meta = n.get("meta")
        if isinstance(meta, Mapping) and _is_false(meta.get("inferred")):
            explicit.add(nid)
    return frozenset(emitted), frozenset(explicit)


def score_run(truth: Iterable[str], emitted: Iterable[str], explicit: Iterable[str]) -> RunScore:
    """Score one run; inputs may contain duplicates (compared as distinct sets)."""
    t, e, x = frozenset(truth), frozenset(emitted), frozenset(explicit)
    hit = len(t & e)
    recall = hit / len(t) if t else 1.0
    exp_p = len(t & x) / len(x) if x else 0.0
    all_p = hit / len(e) if e else 0.0
    f1 = 2 * all_p * recall / (all_p + recall) if (all_p + recall) > 0 else 0.0
    return RunScore(recall, exp_p, all_p, f1, not x, len(t), len(e), len(x))


def score_runs(truths: Sequence[frozenset], emitted: Sequence[frozenset],
               explicit: Sequence[frozenset]) -> np.ndarray:
    """Score many runs → (runs, 4) float array of [recall, explicit_precision, all_precision,
    f1] (columns in that order) — the input for :func:`model_means`."""
    if not (len(truths) == len(emitted) == len(explicit)):
        raise AnalysisError("truths, emitted and explicit must have one entry per run")
    scores = [score_run(t, e, x) for t, e, x in zip(truths, emitted, explicit)]
    return np.array([[s.recall, s.explicit_precision, s.all_precision, s.f1] for s in scores],
                    dtype=float).reshape(len(scores), 4)


@dataclass(frozen=True, eq=False)
class ModelCorrectness:
    """Run-weighted per-model means. models (K,) sorted model names; runs (K,) run counts;
    recall / explicit_precision / all_precision / f1 (K,) means; no_explicit_runs (K,) counts."""

    models: tuple[str, ...]
    runs: np.ndarray
    recall: np.ndarray
    explicit_precision: np.ndarray
    all_precision: np.ndarray
    f1: np.ndarray
    no_explicit_runs: np.ndarray


def model_means(models: Sequence[str], scores: np.ndarray,
                no_explicit: Sequence[bool] | None = None) -> ModelCorrectness:
    """Run-weighted means per model.

    models: (runs,) model name of each run; scores: (runs, 4) from :func:`score_runs`;
    no_explicit: (runs,) ``RunScore.no_explicit`` flags, counted per model (None → zeros;
    they cannot be derived from the scores because explicit precision 0 is ambiguous).
    """
    names, inv = np.unique(np.asarray(models, dtype=object).astype(str), return_inverse=True)
    s = np.asarray(scores, dtype=float).reshape(len(inv), 4)
    k = names.size
    runs = np.bincount(inv, minlength=k)
    sums = np.stack([np.bincount(inv, weights=s[:, c], minlength=k) for c in range(4)], axis=1)
    means = sums / np.maximum(runs, 1)[:, None]
    flags = np.zeros(len(inv)) if no_explicit is None else np.asarray(no_explicit, dtype=float)
    return ModelCorrectness(
        models=tuple(names.tolist()), runs=runs, recall=means[:, 0],
        explicit_precision=means[:, 1], all_precision=means[:, 2], f1=means[:, 3],
        no_explicit_runs=np.bincount(inv, weights=flags, minlength=k).astype(np.int64))
