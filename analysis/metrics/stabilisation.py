"""Stabilisation index r*: how many reruns until the rolling mean node count settles.

Signal: a cell's IR node counts of runs r = 1..R in run-index order (nodes, integers or floats).
Rolling mean m_r = mean of the first r counts; long-run mean M = m_R.
r* = smallest r in 1..R with |m_s − M| ≤ tol for every s ≥ r (metrics.md "Stabilisation").
Since |m_R − M| = 0, r* ≤ R always; r* = R is RIGHT-CENSORED ("not demonstrated to stabilise
before the endpoint") and is never counted as stabilising.

Two tolerance readings, both always computed:
* absolute: tol = ``tol_abs_nodes`` nodes (default 0.05 nodes);
* relative: tol = max(``tol_rel`` · |M|, ``rel_floor_nodes``) (default 0.05 × M, floor 0 nodes).
Comparisons allow 1e-12 nodes of float slack so that an exact hit is not lost to rounding.

Vectorised: a (cells, R) matrix of equal-length sequences is handled in one pass
(cumsum / suffix-all via a reversed cumulative product). :func:`stabilisation_ragged` groups
sequences of different lengths by R.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analysis.errors import AnalysisError

__all__ = ["Stabilisation", "StabilisationSummary", "stabilisation_index",
           "stabilisation_ragged", "summarise_stabilisation"]

_SLACK = 1e-12


@dataclass(frozen=True, eq=False)
class Stabilisation:
    """Per-cell result, arrays of shape (cells,).

    runs: R per cell; r_star_abs / r_star_rel: r* (1-based run count) under each tolerance;
    censored_abs / censored_rel: True where r* = R; long_run_mean_nodes: M;
    tol_abs_nodes, tol_rel, rel_floor_nodes: the tolerance settings used.
    """

    runs: np.ndarray
    r_star_abs: np.ndarray
    r_star_rel: np.ndarray
    censored_abs: np.ndarray
    censored_rel: np.ndarray
    long_run_mean_nodes: np.ndarray
    tol_abs_nodes: float
    tol_rel: float
    rel_floor_nodes: float

    def r_star_or_none(self, kind: str = "abs") -> tuple[int | None, ...]:
        """r* per cell with None for right-censored cells; kind "abs" or "rel"."""
        r = self.r_star_abs if kind == "abs" else self.r_star_rel
        c = self.censored_abs if kind == "abs" else self.censored_rel
        return tuple(None if cc else int(rr) for rr, cc in zip(r, c))


def _r_star(counts: np.ndarray, tol: np.ndarray) -> np.ndarray:
    """r* for a (C, R) matrix and a (C,) tolerance."""
    c, r = counts.shape
    rolling = np.cumsum(counts, axis=1) / np.arange(1, r + 1)
    within = np.abs(rolling - rolling[:, -1:]) <= tol[:, None] + _SLACK
    # suffix_ok[:, s] = all(within[:, s:]) ; r* = first s (1-based) where it holds
    suffix_ok = np.cumprod(within[:, ::-1], axis=1)[:, ::-1].astype(bool)
    return np.argmax(suffix_ok, axis=1) + 1  # suffix_ok[:, -1] is always True


def stabilisation_index(counts: np.ndarray, *, tol_abs_nodes: float = 0.05,
                        tol_rel: float = 0.05, rel_floor_nodes: float = 0.0) -> Stabilisation:
    """r* under both tolerance readings for equal-length sequences.

    counts: (R,) for one cell or (cells, R) node counts in run-index order (R ≥ 1, finite).
    """
    x = np.asarray(counts, dtype=float)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] < 1:
        raise AnalysisError(f"counts must be (R,) or (cells, R) with R >= 1; got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise AnalysisError("node counts must be finite: drop failed runs before computing r*")
    c, r = x.shape
    mean_all = x.mean(axis=1)
    r_abs = _r_star(x, np.full(c, float(tol_abs_nodes)))
    r_rel = _r_star(x, np.maximum(tol_rel * np.abs(mean_all), rel_floor_nodes))
    return Stabilisation(
        runs=np.full(c, r), r_star_abs=r_abs, r_star_rel=r_rel,
        censored_abs=r_abs == r, censored_rel=r_rel == r, long_run_mean_nodes=mean_all,
        tol_abs_nodes=float(tol_abs_nodes), tol_rel=float(tol_rel),
        rel_floor_nodes=float(rel_floor_nodes))


def stabilisation_ragged(sequences: Sequence[Sequence[float]], **tolerances) -> Stabilisation:
    """Like :func:`stabilisation_index` for cells with different R; output in input order."""
    seqs = [np.asarray(s, dtype=float) for s in sequences]
    n = len(seqs)
    runs = np.array([s.size for s in seqs], dtype=np.int64)
    out = {k: np.zeros(n, dtype=np.int64) for k in ("ra", "rr")}
    cens = {k: np.zeros(n, dtype=bool) for k in ("ca", "cr")}
    mean = np.zeros(n)
    settings = stabilisation_index(np.zeros((1, 1)), **tolerances)
    for r in np.unique(runs):
        idx = np.flatnonzero(runs == r)
        res = stabilisation_index(np.stack([seqs[i] for i in idx]), **tolerances)
        out["ra"][idx], out["rr"][idx] = res.r_star_abs, res.r_star_rel
        cens["ca"][idx], cens["cr"][idx] = res.censored_abs, res.censored_rel
        mean[idx] = res.long_run_mean_nodes
    return Stabilisation(runs, out["ra"], out["rr"], cens["ca"], cens["cr"], mean,
                         settings.tol_abs_nodes, settings.tol_rel, settings.rel_floor_nodes)


@dataclass(frozen=True)
class StabilisationSummary:
    """Counts over cells for one tolerance reading ("abs" or "rel").

    n_cells; n_stabilising (r* < R); n_censored (r* = R); median_r_star among stabilising cells
    (NaN if none), in runs.
    """

    kind: str
    n_cells: int
    n_stabilising: int
    n_censored: int
    median_r_star: float


def summarise_stabilisation(res: Stabilisation) -> tuple[StabilisationSummary, ...]:
    """(absolute summary, relative summary)."""
    out = []
    for kind, r, c in (("abs", res.r_star_abs, res.censored_abs),
                       ("rel", res.r_star_rel, res.censored_rel)):
        ok = ~c
        out.append(StabilisationSummary(
            kind=kind, n_cells=int(r.size), n_stabilising=int(ok.sum()),
            n_censored=int(c.sum()),
            median_r_star=float(np.median(r[ok])) if ok.any() else float("nan")))
    return tuple(out)
