"""How the model table moves under the analysis choices (``sensitivity.parquet``).

Variants (a grid; the baseline is the options' own choice):
* merge rule: highest-budget-first and earliest-then-top-up;
* cell inclusion: ``min_runs`` in {2, 3, baseline};
* model inclusion: ``min_prompts`` in {1, 3, 5, baseline}.
For each variant and each model: included or not, rank, n_prompts, mean Jaccard, ID-stability,
node-set-perfect cells, whether its rank or inclusion differs from the baseline, and the
headline (share of node-set-perfect cells among the variant's merged cells, fraction) with its
shift from the baseline (fraction points).
Stabilisation rows (``axis = "tolerance"``, absolute and relative): per model, cells that
stabilise before the endpoint, censored cells and the median r* (runs) among the former.
Point estimates only (no bootstrap), so the grid is cheap.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.memory import release_freed_memory
from analysis.tables.measurements import RULES, MergedCells, merge_cells, merge_view
from analysis.tables.models import model_tables

SENSITIVITY_SCHEMA = pa.schema([
    ("variant", pa.string()), ("axis", pa.string()), ("merge_rule", pa.string()),
    ("min_runs", pa.int64()), ("min_prompts", pa.int64()), ("tolerance", pa.string()),
    ("model", pa.string()), ("included", pa.bool_()), ("rank", pa.int64()),
    ("baseline_rank", pa.int64()), ("changed", pa.bool_()), ("n_prompts", pa.int64()),
    ("mean_jaccard", pa.float64()), ("id_stability", pa.float64()), ("perfect", pa.int64()),
    ("headline_share_perfect", pa.float64()), ("headline_shift", pa.float64()),
    ("stabilising_cells", pa.int64()), ("censored_cells", pa.int64()),
    ("median_r_star", pa.float64()),
])


def _reinclude(cells: pa.Table, min_runs: int) -> pa.Table:
    ok = pc.and_(pc.greater_equal(cells.column("runs_ok"), min_runs),
                 pc.and_(pc.is_valid(cells.column("mean_jaccard")),
                         pc.is_valid(cells.column("id_stability"))))
    idx = cells.column_names.index("included")
    return cells.set_column(idx, "included", pc.fill_null(ok, False))


def _share_perfect(merged: pa.Table) -> float:
    """Share of rows whose ``node_set_perfect`` is true (null counts as false)."""
    if merged.num_rows == 0:
        return 0.0
    perfect = pc.fill_null(merged.column("node_set_perfect"), False)
    return int(pc.sum(perfect.cast(pa.int64())).as_py() or 0) / merged.num_rows



Grid = tuple[str, int, int]  # (merge rule, min_runs, min_prompts)


def _variant_tables(cells: pa.Table, budget: dict[str, int], time: dict[str, int], grid: list[Grid],
                    min_runs: int, baseline: MergedCells | None) -> tuple[dict[Grid, Any], dict[tuple[str, int], float], Any]:
    """Each variant's model tables (grid order), each (rule, min_runs) headline share, and the
    rule comparison at the baseline ``min_runs``. One min_runs value is merged at a time."""
    slim = merge_view(cells)
    shares: dict[tuple[str, int], float] = {}
    comparison = None
    tables: dict[Grid, Any] = {}
    for mr in sorted({2, 3, min_runs}):
        merged = (baseline if baseline is not None and mr == min_runs
                  else merge_cells(_reinclude(slim, mr), budget, time))
        if mr == min_runs:
            comparison = merged.comparison
        for rule in RULES:
            shares[(rule, mr)] = _share_perfect(merged.tables[rule])
            keys = [g for g in grid if g[:2] == (rule, mr)]  # one aggregation per merged table for all its thresholds
            tables.update(zip(keys, model_tables(merged.tables[rule], [g[2] for g in keys], min_runs=mr)))
        del merged
        release_freed_memory()  # this merge's copy, before the next one is made
    assert comparison is not None, "the loop always merges the baseline min_runs"
    return {g: tables[g] for g in grid}, shares, comparison


def _grid_rows(tables: dict[Grid, Any], shares: dict[tuple[str, int], float], base_key: Grid) -> list[dict[str, Any]]:
    """One row per variant and model: rank (or excluded) against the baseline's."""
    base = tables[base_key]
    base_rank = dict(zip(base.models, base.included.column("rank").to_pylist()))
    base_share = shares[base_key[:2]]
    rows = []
    for g, t in tables.items():
        rule, mr, mp = g
        share = shares[(rule, mr)]
        common = {"variant": f"{rule}|min_runs={mr}|min_prompts={mp}", "axis": "baseline" if g == base_key else "grid",
                  "merge_rule": rule, "min_runs": mr, "min_prompts": mp,
                  "headline_share_perfect": share, "headline_shift": share - base_share}
        for r in t.included.to_pylist():
            br = base_rank.get(r["model"])
            rows.append({**common, "model": r["model"], "included": True, "rank": r["rank"],
                         "baseline_rank": br, "changed": br != r["rank"],
                         "n_prompts": r["n_prompts"], "mean_jaccard": r["mean_jaccard"],
                         "id_stability": r["id_stability"], "perfect": r["perfect"]})
        for r in t.excluded.to_pylist():
            br = base_rank.get(r["model"])
            rows.append({**common, "model": r["model"], "included": False, "rank": None,
                         "baseline_rank": br, "changed": br is not None, "n_prompts": r["n_prompts"]})
    return rows


def _tolerance_rows(stabilisation: pa.Table | None) -> list[dict[str, Any]]:
    """Per model and tolerance kind: stabilising and censored cells, median r* (runs)."""
    rows: list[dict[str, Any]] = []
    if stabilisation is None or not stabilisation.num_rows:
        return rows
    for kind, col in (("absolute", "r_star_absolute"), ("relative", "r_star_relative")):
        by_model: dict[str, list] = {}
        for m, r in zip(stabilisation.column("model").to_pylist(), stabilisation.column(col).to_pylist()):
            by_model.setdefault(m, []).append(r)
        for m, rs in sorted(by_model.items()):
            ok = [r for r in rs if r is not None]
            rows.append({"variant": f"tolerance={kind}", "axis": "tolerance", "tolerance": kind, "model": m,
                         "stabilising_cells": len(ok), "censored_cells": len(rs) - len(ok),
                         "median_r_star": float(np.median(ok)) if ok else None})
    return rows


def sensitivity_table(cells: pa.Table, budget: dict[str, int], time: dict[str, int], *,
                      base: Grid, stabilisation: pa.Table | None = None,
                      baseline: MergedCells | None = None) -> tuple[pa.Table, dict[str, Any]]:
    """Grid of variants (module docstring) → (table, summary of the rule comparison).

    ``base``: the analysis's own (merge rule, min_runs, min_prompts), the variant the others
    are compared with.
    ``baseline``: ``merge_cells(cells, budget, time)`` when already computed (the variant
    ``min_runs`` is then not merged again). One min_runs value is merged at a time, and only
    its model tables are kept, so memory stays at about one merged copy of the cells."""
    merge_rule, min_runs, min_prompts = base
    grid = [(rule, mr, mp) for rule in RULES for mr in sorted({2, 3, min_runs})
            for mp in sorted({1, 3, 5, min_prompts})]
    tables, shares, cmp = _variant_tables(cells, budget, time, grid, min_runs, baseline)
    rows = _grid_rows(tables, shares, base) + _tolerance_rows(stabilisation)
    other = RULES[1] if merge_rule == RULES[0] else RULES[0]
    summary = {
        "rule": merge_rule, "other_rule": other,
        "share_perfect": {cmp.rule_a: cmp.share_perfect_a, cmp.rule_b: cmp.share_perfect_b},
        "shift_b_minus_a": cmp.shift, "cells_changing_source": len(cmp.changes),
        "cells_changing_perfect": sum(c.perfect_changed for c in cmp.changes),
        "cells": {cmp.rule_a: cmp.n_cells_a, cmp.rule_b: cmp.n_cells_b},
        "models_changing_rank_under_other_rule": sorted(
            r["model"] for r in rows if r.get("merge_rule") == other
            and r["min_runs"] == min_runs and r["min_prompts"] == min_prompts and r["changed"]),
    }
    return pa.Table.from_pylist(rows, schema=SENSITIVITY_SCHEMA), summary
