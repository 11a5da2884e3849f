"""Run records → one row per cell with its stability metrics.

A *cell* is one (panel, campaign, model, prompt_sha256, budget_max_tokens); campaigns are
merged later (``analysis.tables.merge``), so here each campaign's measurement stays separate.
A *successful run* has ``parse_outcome`` in (ok, repaired) and a non-null ``ir_json``
(the same rule as :attr:`storage.records.RunRecord.succeeded`).

Input: a ``pyarrow.Table`` of run records (``storage.runs.RunStore.read_table``).
Output: a ``pyarrow.Table`` with :data:`CELL_SCHEMA`; metric columns are null when the cell
has fewer than 2 successful runs. Typed dataclasses inside, a Table at the boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.errors import AnalysisError
from analysis.metrics.batch import (
    cell_pairs,
    count_agreement_many,
    distinct_entries,
    set_agreement,
)
from storage.outcomes import succeeded_mask

#: Columns build_cells reads; anything else in the input is ignored.
REQUIRED_COLUMNS: tuple[str, ...] = (
    "run_id",
    "campaign",
    "panel",
    "model",
    "prompt_sha256",
    "prompt_name",
    "budget_max_tokens",
    "run_index",
    "outcome",
    "parse_outcome",
    "ir_json",
    "node_ids",
    "node_count",
    "measurement_date",
)

#: Schema-metadata key recording the min_runs threshold the ``included`` column used.
MIN_RUNS_METADATA_KEY = b"irbench.min_runs"

CELL_SCHEMA = pa.schema(
    [
        pa.field("panel", pa.string(), nullable=False),
        pa.field("campaign", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("prompt_sha256", pa.string(), nullable=False),
        pa.field("prompt_name", pa.string(), nullable=False),
        pa.field("budget_max_tokens", pa.int64()),
        pa.field("runs_total", pa.int64(), nullable=False),
        pa.field("runs_ok", pa.int64(), nullable=False),
        pa.field("included", pa.bool_(), nullable=False),
        pa.field("mean_jaccard", pa.float64()),
        pa.field("id_stability", pa.float64()),
        pa.field("node_set_perfect", pa.bool_()),
        pa.field("mean_nodes", pa.float64()),
        pa.field("std_nodes", pa.float64()),
        pa.field("count_agreement", pa.float64()),
        pa.field("count_equal_share", pa.float64()),
        pa.field("first_date", pa.date32(), nullable=False),
        pa.field("last_date", pa.date32(), nullable=False),
    ]
)

def _check_columns(runs: pa.Table) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in runs.column_names]
    if missing:
        raise AnalysisError(
            f"run table lacks column(s) {missing}; pass the table returned by "
            "storage.runs.RunStore.read_table"
        )


def _codes(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, int]:
    """Integer codes of a column's values (nulls get their own code) and how many there are."""
    if isinstance(col, pa.ChunkedArray):  # one chunk: chunked dictionaries with nulls
        col = col.combine_chunks()      # cannot be unified
    enc = pc.dictionary_encode(col, null_encoding="encode")
    return np.asarray(enc.indices.to_numpy(zero_copy_only=False), np.int64), len(enc.dictionary)


def _last_of_each_run_id(run_id: pa.ChunkedArray) -> np.ndarray:
    """Row indices keeping the last row of each run_id (a redelivered task rewrote it)."""
    codes, _ = _codes(run_id)
    _, first_rev = np.unique(codes[::-1], return_index=True)
    return np.sort(len(codes) - 1 - first_rev)


def _rows_mean_std(values: np.ndarray, starts: np.ndarray, sizes: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population SD of each group ``values[starts[k]:starts[k]+sizes[k]]`` (NaN when
    empty), one ``np.mean``/``np.std`` per row of a matrix per distinct group size."""
    mean = np.full(len(sizes), np.nan)
    std = np.full(len(sizes), np.nan)
    for r in np.unique(sizes[sizes > 0]):
        rows = np.flatnonzero(sizes == r)
        m = values[starts[rows][:, None] + np.arange(int(r))[None, :]]
        mean[rows] = m.mean(axis=1)
        std[rows] = m.std(axis=1, ddof=0)
    return mean, std


def build_cells(runs: pa.Table, min_runs: int = 2) -> pa.Table:
    """One row per (panel, campaign, model, prompt_sha256, budget_max_tokens).

    ``included`` = ``runs_ok >= min_runs`` (successful runs). Metrics (Jaccard, ID-stability,
    node-set-perfect, node-count mean/population SD in nodes, count agreement and the share
    of equal-count pairs) are null when ``runs_ok < 2``; they are computed over the successful
    runs in run-index order. ``prompt_name`` is the cell's most common name (first in run
    order on ties; display only, the sha256 identifies the prompt); the dates span all the
    cell's runs, failures included. Rows sharing a ``run_id`` are collapsed to the last one,
    so a store that was not yet deduplicated cannot double-count. Rows are sorted by panel,
    campaign, model, prompt name, sha256, budget (none first). All cells at once on integer
    codes (:mod:`analysis.metrics.batch`).
    """
    if min_runs < 2:
        raise AnalysisError(
            f"min_runs must be >= 2 (a stability value needs a pair of runs), got {min_runs}"
        )
    _check_columns(runs)
    schema = CELL_SCHEMA.with_metadata({MIN_RUNS_METADATA_KEY: str(min_runs).encode()})
    if runs.num_rows == 0:
        return schema.empty_table()
    t = runs.select(list(REQUIRED_COLUMNS))
    if pc.count_distinct(t.column("run_id")).as_py() < t.num_rows:
        t = t.take(pa.array(_last_of_each_run_id(t.column("run_id"))))
    idx = _index_cells(t)
    runs_ok, metrics = _metrics(t, idx)
    first, null = pa.array(idx.first_row), runs_ok < 2
    first_date, last_date = _date_span(t, idx)
    cols = {
        **{c: t.column(c).take(first) for c in ("panel", "campaign", "model", "prompt_sha256")},
        "prompt_name": t.column("prompt_name").take(pa.array(_name_rows(t, idx))),
        "budget_max_tokens": t.column("budget_max_tokens").take(first),
        "runs_total": pa.array(idx.runs_total, pa.int64()),
        "runs_ok": pa.array(runs_ok, pa.int64()),
        "included": pa.array(runs_ok >= min_runs, pa.bool_()),
        **{c: pa.array(v, typ, mask=null) for c, (v, typ) in metrics.items()},
        "first_date": pa.array(first_date.astype(np.int32), pa.int32()).cast(pa.date32()),
        "last_date": pa.array(last_date.astype(np.int32), pa.int32()).cast(pa.date32()),
    }
    cells = pa.table({k: (v.combine_chunks() if isinstance(v, pa.ChunkedArray) else v)
                      for k, v in cols.items()})
    cells = cells.append_column("_budget_key", pc.fill_null(cells.column("budget_max_tokens"), -1))
    cells = cells.append_column("_first", pa.array(np.arange(idx.n_cells)))
    order = pc.sort_indices(cells, sort_keys=[(c, "ascending") for c in (
        "panel", "campaign", "model", "prompt_name", "prompt_sha256", "_budget_key", "_first")])
    cells = cells.take(order).drop_columns(["_budget_key", "_first"])
    return pa.Table.from_arrays(cells.columns, schema=schema)


@dataclass(frozen=True)
class _CellIndex:
    """Rows grouped into cells: ``row_cell`` (cell of each row, numbered by first appearance),
    ``first_row`` (each cell's first row), ``order`` (rows by cell, then run index), ``starts``
    and ``runs_total`` (each cell's slice of ``order``)."""

    row_cell: np.ndarray
    first_row: np.ndarray
    order: np.ndarray
    starts: np.ndarray
    runs_total: np.ndarray

    @property
    def n_cells(self) -> int:
        return len(self.first_row)


def _index_cells(t: pa.Table) -> _CellIndex:
    n = t.num_rows
    key = np.zeros(n, np.int64)
    for name in ("panel", "campaign", "model", "prompt_sha256", "budget_max_tokens"):
        codes, k = _codes(t.column(name))
        key = key * (k + 1) + codes
    _, first_row, row_cell = np.unique(key, return_index=True, return_inverse=True)
    appearance = np.argsort(first_row, kind="stable")
    rank = np.empty_like(appearance)
    rank[appearance] = np.arange(len(appearance))
    row_cell = rank[row_cell.ravel()]
    first_row = first_row[appearance]
    run_index = np.asarray(t.column("run_index").to_numpy(), np.int64)
    order = np.lexsort((np.arange(n), run_index, row_cell))  # by cell, then run order
    runs_total = np.bincount(row_cell, minlength=len(first_row))
    starts = np.zeros(len(first_row), np.int64)
    np.cumsum(runs_total[:-1], out=starts[1:])
    return _CellIndex(row_cell, first_row, order, starts, runs_total)


def _name_rows(t: pa.Table, idx: _CellIndex) -> np.ndarray:
    """One row per cell (cells ascending) holding its most common prompt name, the first in run
    order on ties (``Counter.most_common``)."""
    name_codes, n_names = _codes(t.column("prompt_name"))
    nk = idx.row_cell[idx.order] * n_names + name_codes[idx.order]
    groups, gfirst, gcount = np.unique(nk, return_index=True, return_counts=True)
    gcell = groups // n_names
    best = np.lexsort((gfirst, -gcount, gcell))
    keep = np.ones(len(best), bool)
    keep[1:] = gcell[best][1:] != gcell[best][:-1]
    return idx.order[gfirst[best][keep]]


def _date_span(t: pa.Table, idx: _CellIndex) -> tuple[np.ndarray, np.ndarray]:
    """First and last measurement date of each cell (days since the epoch), failures included."""
    dates = np.asarray(pc.cast(t.column("measurement_date"), pa.int32()).to_numpy(), np.int64)[idx.order]
    return np.minimum.reduceat(dates, idx.starts), np.maximum.reduceat(dates, idx.starts)


def _metrics(t: pa.Table, idx: _CellIndex) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, pa.DataType]]]:
    """Successful runs per cell, and each stability metric over them in run order (with its type)."""
    ok = np.asarray(succeeded_mask(t).to_numpy(), bool)
    ok_rows = idx.order[ok[idx.order]]
    ok_cell = idx.row_cell[ok_rows]
    runs_ok = np.bincount(ok_cell, minlength=idx.n_cells)
    pairs = cell_pairs(ok_cell, idx.n_cells)
    ids = t.column("node_ids").take(pa.array(ok_rows)).combine_chunks()
    entry_run = np.asarray(pc.list_parent_indices(ids).to_numpy(), np.int64)
    id_codes, n_ids = _codes(pc.list_flatten(ids))
    er, ec, _ = distinct_entries(entry_run, id_codes, n_ids)
    agg = set_agreement(pairs, er, ec, len(ok_rows))
    counts = np.asarray(pc.fill_null(t.column("node_count"), 0).to_numpy(), np.int64)[ok_rows]
    ca, eq = count_agreement_many(pairs, counts)
    mean_nodes, std_nodes = _rows_mean_std(counts.astype(np.float64), pairs.first_run, runs_ok)
    f64 = pa.float64()
    return runs_ok, {
        "mean_jaccard": (agg.mean_jaccard, f64), "id_stability": (agg.id_stability, f64),
        "node_set_perfect": (agg.node_set_perfect, pa.bool_()), "mean_nodes": (mean_nodes, f64),
        "std_nodes": (std_nodes, f64), "count_agreement": (ca, f64), "count_equal_share": (eq, f64),
    }
