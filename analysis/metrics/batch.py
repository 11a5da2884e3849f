"""Node-set and node-count agreement of many cells at once, on integer-coded ids.

The same definitions as :mod:`analysis.metrics.agreement` (``shared/spec/metrics.md``), computed
for every cell in a few numpy passes instead of one Python call per cell.

Inputs: ``run_cell`` (int64, one entry per run, cells numbered 0..C−1 and each cell's runs
contiguous and in run order); for the id metrics, the (run, id code) entries of every run's
*distinct* ids (``entry_run``, ``entry_code``; any order). Pairs are every i<j of a cell's runs in
row-major order, as :func:`analysis.metrics.agreement.pair_counts` lists them, and means are taken
per cell with ``np.mean`` over rows of equal pair count, so values equal the per-cell functions'.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CellPairs", "SetAgreement", "cell_pairs", "count_agreement_many", "distinct_entries", "set_agreement"]


def distinct_entries(entry_run: np.ndarray, code: np.ndarray, n_codes: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (run, code) entries sorted by run then code, and how often each occurred.

    Entries come grouped by run (a flattened list column), so the combined key is nearly
    sorted and a stable (merge) sort is much cheaper than ``np.unique``'s quicksort."""
    width = max(n_codes, 1)
    key = np.sort(entry_run * width + code, kind="stable")
    if len(key) == 0:
        return key, key.copy(), np.zeros(0, np.int64)
    new = np.empty(len(key), bool)
    new[0] = True
    np.not_equal(key[1:], key[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(key)))
    uniq = key[starts]
    return uniq // width, uniq % width, counts


@dataclass(frozen=True, eq=False)
class CellPairs:
    """Every unordered run pair of every cell: global run indices ``a`` < ``b`` (int64), the
    cell of each pair, each cell's first pair (``offset``, C+1 entries) and runs per cell."""

    a: np.ndarray
    b: np.ndarray
    cell: np.ndarray
    offset: np.ndarray
    runs: np.ndarray
    first_run: np.ndarray


def cell_pairs(run_cell: np.ndarray, n_cells: int) -> CellPairs:
    """Pairs of runs within each cell (see :class:`CellPairs`)."""
    runs = np.bincount(run_cell, minlength=n_cells).astype(np.int64)
    first_run = np.zeros(n_cells + 1, np.int64)
    np.cumsum(runs, out=first_run[1:])
    npairs = runs * (runs - 1) // 2
    offset = np.zeros(n_cells + 1, np.int64)
    np.cumsum(npairs, out=offset[1:])
    a_parts, b_parts = [], []
    for r in np.unique(runs[runs >= 2]):  # one triu pattern per distinct run count
        cells = np.flatnonzero(runs == r)
        ia, ib = np.triu_indices(int(r), k=1)
        start = first_run[cells][:, None]
        a_parts.append(((start + ia[None, :]), cells))
        b_parts.append(start + ib[None, :])
    total = int(offset[-1])
    a = np.empty(total, np.int64)
    b = np.empty(total, np.int64)
    cell = np.repeat(np.arange(n_cells, dtype=np.int64), npairs)
    for (pa_, cells), pb in zip(a_parts, b_parts):
        k = pa_.shape[1]
        pos = (offset[cells][:, None] + np.arange(k)[None, :]).ravel()
        a[pos] = pa_.ravel()
        b[pos] = pb.ravel()
    return CellPairs(a=a, b=b, cell=cell, offset=offset, runs=runs, first_run=first_run[:-1])


def _mean_per_cell(values: np.ndarray, pairs: CellPairs) -> np.ndarray:
    """Mean of each cell's pair values (NaN for cells without pairs), one ``np.mean`` per row of
    a (cells, pairs) matrix per distinct pair count."""
    out = np.full(len(pairs.runs), np.nan)
    npairs = np.diff(pairs.offset)
    for k in np.unique(npairs[npairs > 0]):
        cells = np.flatnonzero(npairs == k)
        idx = pairs.offset[cells][:, None] + np.arange(int(k))[None, :]
        out[cells] = values[idx].mean(axis=1)
    return out


@dataclass(frozen=True, eq=False)
class SetAgreement:
    """Per cell: mean pairwise Jaccard (two empty sets score 1), the same with denominator
    max(1, |A∪B|) (two empty sets score 0; the normalised-id form), ID-stability, and whether
    every pair and the whole cell agree exactly (node-set-perfect). NaN/False without pairs."""

    mean_jaccard: np.ndarray
    mean_jaccard_max1: np.ndarray
    id_stability: np.ndarray
    node_set_perfect: np.ndarray


def set_agreement(pairs: CellPairs, entry_run: np.ndarray, entry_code: np.ndarray,
                  n_runs: int) -> SetAgreement:
    """Set metrics of every cell from its runs' distinct (run, id code) entries."""
    n_cells = len(pairs.runs)
    sizes = np.bincount(entry_run, minlength=n_runs).astype(np.int64)
    run_cell = np.repeat(np.arange(n_cells, dtype=np.int64), pairs.runs)
    ecell = run_cell[entry_run]
    order = np.lexsort((entry_run, entry_code, ecell))
    er, ec, ecl = entry_run[order], entry_code[order], ecell[order]
    # groups of entries sharing (cell, id): the runs holding that id
    new = np.ones(len(er), bool)
    new[1:] = (ec[1:] != ec[:-1]) | (ecl[1:] != ecl[:-1])
    gstart = np.flatnonzero(new)
    gsize = np.diff(np.append(gstart, len(er)))
    gcell = ecl[gstart]
    union_all = np.bincount(gcell, minlength=n_cells)
    inter_all = np.bincount(gcell, weights=(gsize == pairs.runs[gcell]), minlength=n_cells)
    stab = np.where(union_all > 0, inter_all / np.maximum(union_all, 1), 1.0)
    # pair intersections: every pair of runs inside one (cell, id) group shares that id
    hits = []
    local = er - pairs.first_run[ecl]
    for g in np.unique(gsize[gsize >= 2]):
        starts = gstart[gsize == g]
        ia, ib = np.triu_indices(int(g), k=1)
        ra = local[starts[:, None] + ia[None, :]]
        rb = local[starts[:, None] + ib[None, :]]
        r = pairs.runs[ecl[starts]][:, None]
        # row-major index of (ra, rb), ra < rb, among an r-run cell's pairs
        pos = pairs.offset[ecl[starts]][:, None] + ra * r - ra * (ra + 1) // 2 + (rb - ra - 1)
        hits.append(pos.ravel())
    total = int(pairs.offset[-1])
    inter = (np.bincount(np.concatenate(hits), minlength=total) if hits
             else np.zeros(total, np.int64))
    union = sizes[pairs.a] + sizes[pairs.b] - inter
    scores = np.ones(len(inter))
    nz = union > 0
    scores[nz] = inter[nz] / union[nz]
    mean = _mean_per_cell(scores, pairs)
    mean_max1 = _mean_per_cell(inter / np.maximum(1, union), pairs)
    pair_equal = np.bincount(pairs.cell, weights=(inter == union), minlength=n_cells)
    perfect = (pair_equal == np.diff(pairs.offset)) & (inter_all == union_all)
    has = pairs.runs >= 2
    return SetAgreement(mean_jaccard=mean, mean_jaccard_max1=mean_max1,
                        id_stability=np.where(pairs.runs >= 1, stab, np.nan),
                        node_set_perfect=perfect & has)


def count_agreement_many(pairs: CellPairs, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per cell: mean over pairs of 1 − |n_i − n_j| / max(1, n_i, n_j), and the share of pairs
    with equal counts (as :func:`analysis.metrics.agreement.count_agreement`)."""
    a, b = counts[pairs.a], counts[pairs.b]
    agreement = 1.0 - np.abs(a - b) / np.maximum(1, np.maximum(a, b))
    return _mean_per_cell(agreement, pairs), _mean_per_cell((a == b).astype(np.float64), pairs)
