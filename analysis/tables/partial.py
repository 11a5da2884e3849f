"""The per-cell reduction split into parts (partitions or file groups) and combined again:
what distributed analysis runs on workers (:mod:`orchestrator.jobs.analysis`).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from analysis.errors import AnalysisError
from analysis.tables.cells import MIN_RUNS_METADATA_KEY, REQUIRED_COLUMNS, build_cells

# A cell's runs can sit in several partitions (a campaign crossing midnight UTC, a resume on a
# later day) or file groups, and its metrics need every pair of its runs, so a partial cell
# aggregate cannot be merged. Each part therefore returns (a) ``build_cells`` of its own runs and
# (b) its run-level features (the columns ``build_cells`` reads, ``ir_json`` shrunk to a
# presence marker). The reduce keeps (a) for cells seen in one part only — most cells, so most
# of the work stays on the workers — and rebuilds the others from (b) across parts.

PART_COLUMN = "__part"


def partial_cells(runs: pa.Table, min_runs: int) -> tuple[pa.Table, pa.Table]:
    """One part's (cells, run-level features) — see the section comment above."""
    marker = pc.if_else(pc.is_valid(runs.column("ir_json")), pa.scalar(""), pa.scalar(None, pa.string()))
    feats = runs.select([*REQUIRED_COLUMNS, "measured_at", "execution_id", "finished_at"])
    feats = feats.set_column(feats.schema.get_field_index("ir_json"), "ir_json", marker)
    return build_cells(runs, min_runs=min_runs), feats


def _cell_key(table: pa.Table) -> pa.Table:
    """The cell key columns, the budget's nulls as -1 (joins never match nulls)."""
    budget = pc.fill_null(table.column("budget_max_tokens"), -1)
    return pa.table({"panel": table.column("panel"), "campaign": table.column("campaign"),
                     "model": table.column("model"), "prompt_sha256": table.column("prompt_sha256"),
                     "__budget": budget})


def _in_keys(table: pa.Table, keys: pa.Table) -> pa.Array:
    """Per row of ``table``: is its cell key among ``keys`` (a :func:`_cell_key` table)?"""
    names = keys.column_names
    rows = _cell_key(table).append_column("__row", pa.array(range(table.num_rows), pa.int64()))
    joined = rows.join(keys.append_column("__hit", pa.array([True] * keys.num_rows)), names,
                       join_type="left outer").sort_by("__row")
    return pc.fill_null(joined.column("__hit"), False).combine_chunks()


def combine_partial_cells(parts: list[tuple[pa.Table, pa.Table]], min_runs: int) -> pa.Table:
    """The ``build_cells`` table of the union of the parts' runs (same rows, same order).

    ``parts``: each part's :func:`partial_cells` output, at least one."""
    from storage.runs import latest_executions

    if not parts:
        raise AnalysisError("combine_partial_cells needs at least one part")
    feats = pa.concat_tables([f for _, f in parts])
    part_ids = pa.array([i for i, (_, f) in enumerate(parts) for _ in range(f.num_rows)], pa.int64())
    keyed = _cell_key(feats).append_column(PART_COLUMN, part_ids)
    key = keyed.column_names[:-1]
    spans = keyed.group_by(key).aggregate([(PART_COLUMN, "count_distinct")])
    split = spans.filter(pc.greater(spans.column(f"{PART_COLUMN}_count_distinct"), 1)).select(key)
    whole = pa.concat_tables([c for c, _ in parts])
    kept = whole
    if split.num_rows:
        kept = whole.filter(pc.invert(_in_keys(whole, split)))
        runs = latest_executions(feats.filter(_in_keys(feats, split)))
        kept = pa.concat_tables([kept, build_cells(runs, min_runs=min_runs)])
    order = pc.sort_indices(
        kept.append_column("__budget", pc.fill_null(kept.column("budget_max_tokens"), -1)),
        sort_keys=[("panel", "ascending"), ("campaign", "ascending"), ("model", "ascending"),
                   ("prompt_name", "ascending"), ("prompt_sha256", "ascending"), ("__budget", "ascending")])
    out = kept.take(order)
    return out.replace_schema_metadata({**(out.schema.metadata or {}),
                                        MIN_RUNS_METADATA_KEY: str(min_runs).encode()})
