"""Merge precedence for a (model, prompt) cell measured in several campaigns (metrics.md).

Input: cell rows of several campaigns of one panel (:class:`CellRow`, e.g. read from the
published per-campaign tables with :func:`read_cell_csv`), plus two mappings campaign → int:
* ``budget_rank``: the campaign's declared wall-clock/tier rank (larger = bigger budget);
* ``time_order``: the campaign's chronological position (larger = later).
Rules, both always computed:
* "highest-budget-first": per cell keep the row of the campaign with the largest budget rank;
  ties → the later campaign (larger time order).
* "earliest-then-top-up": per cell keep the earliest campaign's row; later campaigns only fill
  cells (model, prompt) not yet covered — equivalently, the smallest time order wins.
Output: :class:`Merged` (chosen rows sorted by (model, prompt), each row carrying its campaign
as provenance) and :class:`MergeComparison` (cells whose source or values change between the
rules, and the headline shift = change in the share of node-set-perfect cells, in fraction
points). Node-set-perfect = mean Jaccard == 1 and ID-stability == 1 as stored (the published
tables round both to 3 decimals, so 0.9996 would count as 1 there — a caveat of the CSVs).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from analysis.errors import AnalysisError

__all__ = ["CellRow", "Merged", "CellChange", "MergeComparison", "read_cell_csv",
           "merge_highest_budget_first", "merge_earliest_then_top_up", "compare_merges"]


@dataclass(frozen=True)
class CellRow:
    """One campaign's measurement of one cell. mean_nodes / std_nodes in nodes (std = population
    SD over runs); mean_jaccard, id_stability, mean_confidence unitless in [0, 1]."""

    campaign: str
    prompt: str
    model: str
    successful_runs: int
    mean_nodes: float
    std_nodes: float
    mean_jaccard: float
    id_stability: float
    mean_confidence: float

    @property
    def key(self) -> tuple[str, str]:
        return (self.model, self.prompt)

    @property
    def node_set_perfect(self) -> bool:
        return self.mean_jaccard == 1.0 and self.id_stability == 1.0


def read_cell_csv(path: str | Path, campaign: str | None = None) -> tuple[CellRow, ...]:
    """Read a per-campaign cell table (columns prompt, model, successful_runs, mean_nodes,
    std_nodes, mean_jaccard, id_stability, mean_confidence; CRLF or LF). campaign defaults to
    the file name. A header-only file gives no rows."""
    p = Path(path)
    name = campaign if campaign is not None else p.name
    rows = []
    with p.open(newline="", encoding="utf-8") as fh:
        for i, rec in enumerate(csv.DictReader(fh), start=2):
            try:
                rows.append(CellRow(
                    campaign=name, prompt=rec["prompt"], model=rec["model"],
                    successful_runs=int(rec["successful_runs"]),
                    mean_nodes=float(rec["mean_nodes"]), std_nodes=float(rec["std_nodes"]),
                    mean_jaccard=float(rec["mean_jaccard"]),
                    id_stability=float(rec["id_stability"]),
                    mean_confidence=float(rec["mean_confidence"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise AnalysisError(f"{p}:{i}: malformed cell row ({exc}); expected the columns "
                                 "prompt, model, successful_runs, mean_nodes, std_nodes, "
                                 "mean_jaccard, id_stability, mean_confidence") from exc
    return tuple(rows)


@dataclass(frozen=True)
class Merged:
    """Chosen rows (one per cell, sorted by (model, prompt)); rule: the rule's name.
    ``provenance`` gives (model, prompt, campaign) per row in the same order."""

    rule: str
    rows: tuple[CellRow, ...]

    @property
    def provenance(self) -> tuple[tuple[str, str, str], ...]:
        return tuple((r.model, r.prompt, r.campaign) for r in self.rows)

    @property
    def share_node_set_perfect(self) -> float:
        return sum(r.node_set_perfect for r in self.rows) / len(self.rows) if self.rows else 0.0

    def by_campaign(self, model: str | None = None) -> tuple[tuple[str, int], ...]:
        """(campaign, number of chosen cells) sorted by campaign, optionally for one model."""
        counts: dict[str, int] = {}
        for r in self.rows:
            if model is None or r.model == model:
                counts[r.campaign] = counts.get(r.campaign, 0) + 1
        return tuple(sorted(counts.items()))


def _check(rows: Sequence[CellRow], *mappings: Mapping[str, int]) -> None:
    seen = set()
    for r in rows:
        for m in mappings:
            if r.campaign not in m:
                raise AnalysisError(f"campaign {r.campaign!r} has no entry in the precedence "
                                 f"mapping; add it (known: {sorted(m)})")
        k = (r.campaign, r.model, r.prompt)
        if k in seen:
            raise AnalysisError(f"cell {r.model} × {r.prompt} appears twice in campaign "
                             f"{r.campaign!r}; deduplicate the campaign's table first")
        seen.add(k)


def _pick(rows: Iterable[CellRow], key) -> tuple[CellRow, ...]:
    best: dict[tuple[str, str], CellRow] = {}
    for r in rows:
        cur = best.get(r.key)
        if cur is None or key(r) > key(cur):
            best[r.key] = r
    return tuple(best[k] for k in sorted(best))


def merge_highest_budget_first(rows: Sequence[CellRow], budget_rank: Mapping[str, int],
                               time_order: Mapping[str, int]) -> Merged:
    """Per cell: largest budget rank wins; ties → later campaign."""
    _check(rows, budget_rank, time_order)
    chosen = _pick(rows, lambda r: (budget_rank[r.campaign], time_order[r.campaign]))
    return Merged("highest-budget-first", chosen)


def merge_earliest_then_top_up(rows: Sequence[CellRow], time_order: Mapping[str, int]) -> Merged:
    """Per cell: the earliest campaign that measured it wins."""
    _check(rows, time_order)
    chosen = _pick(rows, lambda r: -time_order[r.campaign])
    return Merged("earliest-then-top-up", chosen)


@dataclass(frozen=True)
class CellChange:
    """A cell whose chosen campaign differs between rules a and b (row_a/row_b None when the
    cell exists under one rule only); perfect_changed: its node-set-perfect status differs."""

    model: str
    prompt: str
    row_a: CellRow | None
    row_b: CellRow | None

    @property
    def perfect_changed(self) -> bool:
        pa = self.row_a.node_set_perfect if self.row_a else None
        pb = self.row_b.node_set_perfect if self.row_b else None
        return pa != pb


@dataclass(frozen=True)
class MergeComparison:
    """changes: cells supplied by different campaigns under the two rules;
    share_perfect_a/b: share of node-set-perfect cells under each rule (fraction);
    shift = share_perfect_b − share_perfect_a (fraction points); n_cells_a/b."""

    rule_a: str
    rule_b: str
    changes: tuple[CellChange, ...]
    share_perfect_a: float
    share_perfect_b: float
    shift: float
    n_cells_a: int
    n_cells_b: int


def compare_merges(a: Merged, b: Merged) -> MergeComparison:
    """Which cells change source between two merges, and how far the headline moves."""
    ra = {r.key: r for r in a.rows}
    rb = {r.key: r for r in b.rows}
    changes = tuple(
        CellChange(k[0], k[1], ra.get(k), rb.get(k))
        for k in sorted(set(ra) | set(rb))
        if (ra[k].campaign if k in ra else None) != (rb[k].campaign if k in rb else None))
    sa, sb = a.share_node_set_perfect, b.share_node_set_perfect
    return MergeComparison(a.rule, b.rule, changes, sa, sb, sb - sa, len(a.rows), len(b.rows))
