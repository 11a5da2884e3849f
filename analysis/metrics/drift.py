"""Drift decomposition of run pairs within a cell (metrics.md "Drift decomposition").

Input per run: a :class:`RunIR` (build one with :func:`run_ir_from_json` from the IR JSON text).
Every unordered pair of runs of a cell gets exactly one label, tested in this order:
1. "count"    — node counts differ, or the multisets of node kinds differ;
2. "id_label" — otherwise the id sets differ;
3. "metadata" — otherwise (same ids) some id's nodes differ in source range or in any ``meta``
   field (compared as canonical JSON, so priority 2 vs "2" IS a difference);
4. "agree"    — none of the above.
Label text alone is never drift: ``label_only`` counts the pairs labelled "agree" whose
same-id nodes differ only in their label text.

Duplicate ids within one IR are kept: an id maps to the sorted tuple of all its nodes' entries,
so a duplicated node that drifts is seen. The node count includes duplicates.

Outputs: :class:`CellDrift` per cell (counts and shares among disagreeing pairs, 0 when none
disagree) and :class:`DriftSummary` over cells (three aggregates, all reported because they
differ). Share arrays are ordered as ``CLASSES``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from types import MappingProxyType

import numpy as np

__all__ = [
    "CLASSES",
    "RunIR",
    "CellDrift",
    "DriftSummary",
    "run_ir_from_json",
    "classify_pair",
    "cell_drift",
    "summarise_drift",
]

CLASSES = ("count", "id_label", "metadata")

Range = tuple  # (start_line, start_col, end_line, end_col); None where absent


@dataclass(frozen=True)
class RunIR:
    """The parts of one run's IR that the drift decomposition compares.

    ids: distinct node ids; kinds: sorted tuple of every node's kind (a multiset);
    node_count: number of nodes including duplicates;
    nodes_by_id: id → sorted tuple of (range tuple, canonical meta JSON) of its nodes;
    labels_by_id: id → sorted tuple of its nodes' label texts.
    """

    ids: frozenset
    kinds: tuple
    node_count: int
    nodes_by_id: Mapping = field(hash=False)
    labels_by_id: Mapping = field(hash=False)


def _range(node: Mapping) -> Range:
    r = node.get("range")
    if not isinstance(r, Mapping):
        return (None, None, None, None)
    return tuple(r.get(k) for k in ("start_line", "start_col", "end_line", "end_col"))


def run_ir_from_json(ir_json: str) -> RunIR:
    """Parse one IR document (JSON text, top-level object with a ``nodes`` list).

    Lenient: a missing/non-list ``nodes`` is an IR with no nodes; non-object nodes are skipped;
    a missing id is the empty string; a missing kind is "". Raises ValueError (stdlib
    json.JSONDecodeError) only when the text is not JSON at all — extract it first.
    """
    doc = json.loads(ir_json)
    nodes = doc.get("nodes") if isinstance(doc, Mapping) else None
    if not isinstance(nodes, list):
        nodes = []
    nodes = [n for n in nodes if isinstance(n, Mapping)]
    entries: dict[str, list] = {}
    labels: dict[str, list] = {}
    kinds = []
    for n in nodes:
        nid = str(n.get("id", ""))
        kinds.append(str(n.get("kind", "")))
        meta = json.dumps(n.get("meta"), sort_keys=True, ensure_ascii=True, default=str)
        entries.setdefault(nid, []).append((_range(n), meta))
        labels.setdefault(nid, []).append(str(n.get("label", "")))
    key = repr  # None-safe sort key for range tuples
    return RunIR(
        ids=frozenset(entries),
        kinds=tuple(sorted(kinds)),
        node_count=len(nodes),
        nodes_by_id=MappingProxyType({k: tuple(sorted(v, key=key)) for k, v in entries.items()}),
        labels_by_id=MappingProxyType({k: tuple(sorted(v)) for k, v in labels.items()}),
    )


def classify_pair(a: RunIR, b: RunIR) -> tuple[str, bool]:
    """Label one pair: returns (label in CLASSES + ("agree",), label_only_difference)."""
    if a.node_count != b.node_count or a.kinds != b.kinds:
        return "count", False
    if a.ids != b.ids:
        return "id_label", False
    if any(a.nodes_by_id[i] != b.nodes_by_id[i] for i in a.ids):
        return "metadata", False
    label_only = any(a.labels_by_id[i] != b.labels_by_id[i] for i in a.ids)
    return "agree", label_only


@dataclass(frozen=True, eq=False)
class CellDrift:
    """Drift counts of one cell's R·(R−1)/2 run pairs.

    n_pairs; counts (3,) int pairs per class in CLASSES order; agree; label_only (agreeing pairs
    that differ only in label text); shares (3,) = counts / (n_pairs − agree), zeros when no
    pair disagrees.
    """

    n_pairs: int
    counts: np.ndarray
    agree: int
    label_only: int
    shares: np.ndarray

    @property
    def n_disagreeing(self) -> int:
        return self.n_pairs - self.agree


def cell_drift(runs: Sequence[RunIR]) -> CellDrift:
    """Classify every unordered pair of a cell's runs (in any order; a cell with < 2 runs has
    no pairs and all-zero counts)."""
    counts = np.zeros(len(CLASSES), dtype=np.int64)
    agree = label_only = 0
    for a, b in combinations(runs, 2):
        label, lab = classify_pair(a, b)
        if label == "agree":
            agree += 1
            label_only += int(lab)
        else:
            counts[CLASSES.index(label)] += 1
    disagreeing = int(counts.sum())
    shares = counts / disagreeing if disagreeing else np.zeros(len(CLASSES))
    return CellDrift(n_pairs=disagreeing + agree, counts=counts, agree=agree,
                     label_only=label_only, shares=shares)


@dataclass(frozen=True, eq=False)
class DriftSummary:
    """Aggregates over cells; every array is (3,) in CLASSES order, shares in [0, 1].

    macro_all: mean of cell shares over all cells (agreeing cells contribute zeros);
    pooled: class totals / all disagreeing pairs (zeros if none);
    macro_disagreeing: mean of cell shares over cells with ≥ 1 disagreeing pair (NaN if none).
    n_cells, n_cells_disagreeing, n_pairs, n_disagreeing_pairs, label_only_pairs: counts.
    """

    macro_all: np.ndarray
    pooled: np.ndarray
    macro_disagreeing: np.ndarray
    n_cells: int
    n_cells_disagreeing: int
    n_pairs: int
    n_disagreeing_pairs: int
    label_only_pairs: int


def summarise_drift(cells: Sequence[CellDrift]) -> DriftSummary:
    """Three aggregates of :class:`CellDrift` records (see :class:`DriftSummary`)."""
    k = len(CLASSES)
    if not cells:
        z = np.zeros(k)
        return DriftSummary(z, z, np.full(k, np.nan), 0, 0, 0, 0, 0)
    counts = np.stack([c.counts for c in cells])  # (C, 3)
    shares = np.stack([c.shares for c in cells])
    dis = counts.sum(axis=1)
    total = int(dis.sum())
    has = dis > 0
    return DriftSummary(
        macro_all=shares.mean(axis=0),
        pooled=counts.sum(axis=0) / total if total else np.zeros(k),
        macro_disagreeing=shares[has].mean(axis=0) if has.any() else np.full(k, np.nan),
        n_cells=len(cells),
        n_cells_disagreeing=int(has.sum()),
        n_pairs=int(sum(c.n_pairs for c in cells)),
        n_disagreeing_pairs=total,
        label_only_pairs=int(sum(c.label_only for c in cells)),
    )
