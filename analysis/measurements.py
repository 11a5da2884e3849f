"""Imported cell measurements → cell rows, campaign precedence, and merging one panel's cells.

* :func:`measurement_cells`: rows of the ``cells/`` dataset (``storage.cells``) → a table with
  :data:`analysis.cells.CELL_SCHEMA` columns plus ``source``. ``runs_total = runs_ok =
  successful_runs``; ``included`` = ``successful_runs >= min_runs`` and both metrics finite (a
  NaN metric is never included); ``node_set_perfect`` = Jaccard == 1 and ID-stability == 1 *as
  stored* (published values are rounded to 3 decimals); count agreement is unknown (null).
* :func:`precedence`: campaign → (budget_rank, time_order) for the campaigns of a panel.
* :func:`merge_cells`: one row per (model, prompt_sha256) under a rule, reusing
  :mod:`analysis.merge` (so the semantics are exactly those rules), plus the comparison of the
  two rules (:class:`analysis.merge.MergeComparison`).
"""

from __future__ import annotations

import datetime as dt
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.cells import CELL_SCHEMA, MIN_RUNS_METADATA_KEY
from analysis.merge import (
    CellRow,
    MergeComparison,
    compare_merges,
    merge_earliest_then_top_up,
    merge_highest_budget_first,
)

RULES = ("highest-budget-first", "earliest-then-top-up")
AUDIT_CELL_SCHEMA = CELL_SCHEMA.append(pa.field("source", pa.string(), nullable=False))


def _finite(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def measurement_cells(rows: pa.Table, min_runs: int) -> pa.Table:
    """Imported measurements (``CellStore.read_table``) → :data:`AUDIT_CELL_SCHEMA` rows."""
    out = []
    for r in rows.to_pylist():
        jac, ids = r["mean_jaccard"], r["id_stability"]
        ok = _finite(jac) and _finite(ids)
        end = r.get("window_end") or r["measurement_date"]
        out.append({
            "panel": r["panel"], "campaign": r["campaign"], "model": r["model"],
            "prompt_sha256": r["prompt_sha256"], "prompt_name": r["prompt_name"],
            "budget_max_tokens": None, "runs_total": r["successful_runs"],
            "runs_ok": r["successful_runs"],
            "included": bool(ok and r["successful_runs"] >= min_runs),
            "mean_jaccard": jac if ok else None, "id_stability": ids if ok else None,
            "node_set_perfect": (jac == 1.0 and ids == 1.0) if ok else None,
            "mean_nodes": r["mean_nodes"] if _finite(r["mean_nodes"]) else None,
            "std_nodes": r["std_nodes"] if _finite(r["std_nodes"]) else None,
            "count_agreement": None, "count_equal_share": None,
            "first_date": r["measurement_date"], "last_date": end,
            "source": f"imported:{r['source']}",
        })
    schema = AUDIT_CELL_SCHEMA.with_metadata({MIN_RUNS_METADATA_KEY: str(min_runs).encode()})
    return pa.Table.from_pylist(out, schema=schema)


def run_cells(cells: pa.Table) -> pa.Table:
    """Cells built from raw runs (``build_cells``) with ``source = "runs"``."""
    return cells.append_column("source", pa.array(["runs"] * cells.num_rows, pa.string()))


def load_precedence(path: Path) -> dict[str, tuple[int, int]]:
    """campaign → (budget_rank, time_order) from a TOML in the import-artifact mapping format:
    ``[[campaign]]`` entries (``name``) and tables with a ``campaign`` key (``[irs]``)."""
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read precedence file {path}: {exc}") from exc
    out: dict[str, tuple[int, int]] = {}
    entries = list(raw.get("campaign", [])) + [v for v in raw.values() if isinstance(v, dict)]
    for e in entries:
        name = e.get("name", e.get("campaign"))
        if isinstance(name, str) and "budget_rank" in e and "time_order" in e:
            out[name] = (int(e["budget_rank"]), int(e["time_order"]))
    return out


def precedence(cells: pa.Table, imported: pa.Table | None,
               override: dict[str, tuple[int, int]] | None = None
               ) -> tuple[dict[str, int], dict[str, int]]:
    """(budget_rank, time_order) mappings for every campaign in ``cells``.

    Known precedence: ``override`` first, then the values stored with imported rows. Unknown
    campaigns get budget rank 0 (lowest). Time order: campaigns sorted by (first measurement
    date, known before unknown, known time_order, name) and numbered 0.. in that order.
    """
    known: dict[str, tuple[int | None, int | None]] = {}
    if imported is not None and imported.num_rows:
        for r in imported.select(["campaign", "budget_rank", "time_order"]).to_pylist():
            known.setdefault(r["campaign"], (r["budget_rank"], r["time_order"]))
    known.update(override or {})
    first: dict[str, dt.date] = {}
    for c, d in zip(cells.column("campaign").to_pylist(), cells.column("first_date").to_pylist()):
        first[c] = min(d, first.get(c, d))
    def tkey(c: str):
        k = known.get(c)
        return (first[c], 0 if k and k[1] is not None else 1,
                k[1] if k and k[1] is not None else 0, c)
    time = {c: i for i, c in enumerate(sorted(first, key=tkey))}
    budget = {c: int(known[c][0]) if c in known and known[c][0] is not None else 0
              for c in first}
    return budget, time


@dataclass(frozen=True)
class MergedCells:
    """Per rule: the chosen cell rows (one per model × prompt), and the rule comparison.

    ``tables[rule]`` has :data:`AUDIT_CELL_SCHEMA`; ``comparison`` compares
    highest-budget-first (a) with earliest-then-top-up (b); budget/time are the mappings used.
    """

    tables: dict[str, pa.Table]
    comparison: MergeComparison
    budget_rank: dict[str, int]
    time_order: dict[str, int]


def _one_per_campaign(included: pa.Table) -> pa.Table:
    """Within one campaign keep one cell per (model, prompt): the largest token budget."""
    rows = included.to_pylist()
    best: dict[tuple, int] = {}
    for i, r in enumerate(rows):
        k = (r["campaign"], r["model"], r["prompt_sha256"])
        b = r["budget_max_tokens"] if r["budget_max_tokens"] is not None else -1
        if k not in best or b > (rows[best[k]]["budget_max_tokens"] or -1):
            best[k] = i
    return included.take(pa.array(sorted(best.values()), pa.int64()))


def merge_cells(cells: pa.Table, budget_rank: dict[str, int],
                time_order: dict[str, int]) -> MergedCells:
    """Merge the included cells of one panel under both rules (see module docstring)."""
    inc = _one_per_campaign(cells.filter(pc.equal(cells.column("included"), True)))
    rows = inc.to_pylist()
    nan = float("nan")
    as_cr = [CellRow(r["campaign"], r["prompt_sha256"], r["model"], r["runs_ok"],
                     r["mean_nodes"] if r["mean_nodes"] is not None else nan,
                     r["std_nodes"] if r["std_nodes"] is not None else nan,
                     r["mean_jaccard"], r["id_stability"], nan) for r in rows]
    index = {(r.campaign, r.model, r.prompt): i for i, r in enumerate(as_cr)}
    h = merge_highest_budget_first(as_cr, budget_rank, time_order)
    e = merge_earliest_then_top_up(as_cr, time_order)
    tables = {}
    for merged in (h, e):
        take = [index[(r.campaign, r.model, r.prompt)] for r in merged.rows]
        tables[merged.rule] = inc.take(pa.array(take, pa.int64()))
    return MergedCells(tables, compare_merges(h, e), budget_rank, time_order)


def chosen_flags(cells: pa.Table, merged: MergedCells) -> dict[str, np.ndarray]:
    """Per rule, a bool per row of ``cells``: this row supplies its cell under that rule."""
    keys = list(zip(cells.column("campaign").to_pylist(), cells.column("model").to_pylist(),
                    cells.column("prompt_sha256").to_pylist(),
                    cells.column("budget_max_tokens").to_pylist(),
                    cells.column("source").to_pylist()))
    out = {}
    for rule, t in merged.tables.items():
        chosen = set(zip(t.column("campaign").to_pylist(), t.column("model").to_pylist(),
                         t.column("prompt_sha256").to_pylist(),
                         t.column("budget_max_tokens").to_pylist(),
                         t.column("source").to_pylist()))
        out[rule] = np.array([k in chosen for k in keys], dtype=bool)
    return out


def complete_excluded(table, cells: pa.Table):  # noqa: ANN001, ANN201 - ModelTable in and out
    """Add to ``table.excluded`` every model of ``cells`` with no included cell at all (merging
    keeps included cells only, so such models would otherwise vanish instead of being listed)."""
    from analysis.tables import ModelTable

    listed = set(table.models) | set(table.excluded.column("model").to_pylist())
    runs_ok: dict[str, int] = {}
    for m, r in zip(cells.column("model").to_pylist(), cells.column("runs_ok").to_pylist()):
        runs_ok[m] = runs_ok.get(m, 0) + int(r)
    extra = [{"model": m, "n_prompts": 0, "n_cells": 0, "runs_ok": runs_ok[m],
              "reason": f"0 prompts with ≥{table.min_runs} successful runs; "
                        f"needs ≥{table.min_prompts}"}
             for m in sorted(runs_ok) if m not in listed]
    if not extra:
        return table
    excluded = pa.concat_tables([table.excluded,
                                 pa.Table.from_pylist(extra, schema=table.excluded.schema)])
    return ModelTable(table.included, excluded, table.min_runs, table.min_prompts)
