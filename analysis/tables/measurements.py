"""Imported cell measurements → cell rows, campaign precedence, and merging one panel's cells.

* :func:`measurement_cells`: rows of the ``cells/`` dataset (``storage.cells``) → a table with
  :data:`analysis.tables.cells.CELL_SCHEMA` columns plus ``source``. ``runs_total = runs_ok =
  successful_runs``; ``included`` = ``successful_runs >= min_runs`` and both metrics finite (a
  NaN metric is never included); ``node_set_perfect`` = Jaccard == 1 and ID-stability == 1 *as
  stored* (published values are rounded to 3 decimals); count agreement is unknown (null).
* :func:`precedence`: campaign → (budget_rank, time_order) for the campaigns of a panel.
* :func:`merge_cells`: one row per (model, prompt_sha256) under a rule, with exactly the
  semantics of :mod:`analysis.tables.merge` (ties → the first row), plus the comparison of the two
  rules (:class:`analysis.tables.merge.MergeComparison`); computed with sorts over integer codes.
All functions work column-wise (pyarrow compute / numpy): no Python loop over rows.
"""

from __future__ import annotations

import datetime as dt
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.errors import AnalysisError
from analysis.tables.cells import CELL_SCHEMA, MIN_RUNS_METADATA_KEY
from analysis.tables.merge import CellChange, CellRow, MergeComparison

RULES = ("highest-budget-first", "earliest-then-top-up")
AUDIT_CELL_SCHEMA = CELL_SCHEMA.append(pa.field("source", pa.string(), nullable=False))


def compact_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every string column as ``dictionary<int32, string>``: what the
    pipeline holds 700k cells in (codes instead of strings); :func:`plain` undoes it."""
    fields = [pa.field(f.name, pa.dictionary(pa.int32(), f.type), f.nullable, f.metadata)
              if pa.types.is_string(f.type) else f for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


COMPACT_AUDIT_CELL_SCHEMA = compact_schema(AUDIT_CELL_SCHEMA)


def plain(table: pa.Table) -> pa.Table:
    """Dictionary columns of ``table`` back as their value type (what is written/returned)."""
    fields = [pa.field(f.name, f.type.value_type, f.nullable, f.metadata)
              if pa.types.is_dictionary(f.type) else f for f in table.schema]
    if all(not pa.types.is_dictionary(f.type) for f in table.schema):
        return table
    return table.cast(pa.schema(fields, metadata=table.schema.metadata))


def _finite_mask(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """Valid and not NaN (±inf counts as a value, as before)."""
    return pc.and_(pc.is_valid(col), pc.invert(pc.fill_null(pc.is_nan(col), True)))


def _null_unless(mask, col: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.if_else(mask, col, pa.scalar(None, col.type))


def measurement_cells(rows: pa.Table, min_runs: int) -> pa.Table:
    """Imported measurements (``CellStore.read_table``) → :data:`AUDIT_CELL_SCHEMA` rows.

    Column-wise (pyarrow compute, no Python loop over rows)."""
    n = rows.num_rows
    jac = rows.column("mean_jaccard").cast(pa.float64())
    ids = rows.column("id_stability").cast(pa.float64())
    ok = pc.and_(_finite_mask(jac), _finite_mask(ids))
    runs = rows.column("successful_runs").cast(pa.int64())
    date = rows.column("measurement_date")
    end = (pc.coalesce(rows.column("window_end"), date)
           if "window_end" in rows.column_names else date)
    perfect = pc.and_(pc.equal(jac, 1.0), pc.equal(ids, 1.0))
    nodes = {c: rows.column(c).cast(pa.float64()) for c in ("mean_nodes", "std_nodes")}
    cols = {
        "panel": rows.column("panel"), "campaign": rows.column("campaign"),
        "model": rows.column("model"), "prompt_sha256": rows.column("prompt_sha256"),
        "prompt_name": rows.column("prompt_name"),
        "budget_max_tokens": pa.nulls(n, pa.int64()), "runs_total": runs, "runs_ok": runs,
        "included": pc.and_(ok, pc.greater_equal(runs, min_runs)),
        "mean_jaccard": _null_unless(ok, jac), "id_stability": _null_unless(ok, ids),
        "node_set_perfect": _null_unless(ok, perfect),
        "mean_nodes": _null_unless(_finite_mask(nodes["mean_nodes"]), nodes["mean_nodes"]),
        "std_nodes": _null_unless(_finite_mask(nodes["std_nodes"]), nodes["std_nodes"]),
        "count_agreement": pa.nulls(n, pa.float64()),
        "count_equal_share": pa.nulls(n, pa.float64()),
        "first_date": date, "last_date": end,
        "source": pc.binary_join_element_wise(
            "imported", pc.fill_null(_plain_column(rows.column("source")), "None"), ":"),
    }
    if pa.types.is_dictionary(rows.schema.field("model").type):
        cols["source"] = pc.dictionary_encode(cols["source"])
    compact = any(pa.types.is_dictionary(f.type) for f in rows.schema)
    schema = (COMPACT_AUDIT_CELL_SCHEMA if compact else AUDIT_CELL_SCHEMA).with_metadata(
        {MIN_RUNS_METADATA_KEY: str(min_runs).encode()})
    arrays = [_chunked(cols[f.name]).cast(f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _plain_column(col: pa.ChunkedArray) -> pa.ChunkedArray:
    return col.cast(col.type.value_type) if pa.types.is_dictionary(col.type) else col


def _chunked(x) -> pa.ChunkedArray:
    return x if isinstance(x, pa.ChunkedArray) else pa.chunked_array([x])


def run_cells(cells: pa.Table) -> pa.Table:
    """Cells built from raw runs (``build_cells``) with ``source = "runs"``."""
    return cells.append_column("source", pa.array(["runs"] * cells.num_rows, pa.string()))


def load_precedence(path: Path) -> dict[str, tuple[int, int]]:
    """campaign → (budget_rank, time_order) from a TOML in the import-artifact mapping format:
    ``[[campaign]]`` entries (``name``) and tables with a ``campaign`` key (``[irs]``)."""
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise AnalysisError(f"cannot read precedence file {path}: {exc}") from exc
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
        # the first row of each campaign supplies its stored precedence
        sel = imported.select(["campaign", "budget_rank", "time_order"])
        _, first_row = np.unique(_plain_column(sel.column("campaign")).to_numpy(
                                     zero_copy_only=False),
                                 return_index=True)
        for r in sel.take(pa.array(np.sort(first_row))).to_pylist():
            known.setdefault(r["campaign"], (r["budget_rank"], r["time_order"]))
    known.update(override or {})
    first: dict[str, dt.date] = {}
    if cells.num_rows:
        g = cells.select(["campaign", "first_date"]).group_by(
            "campaign", use_threads=False).aggregate(
            [("first_date", "min")])
        first = dict(zip(g.column("campaign").to_pylist(),
                         g.column("first_date_min").to_pylist()))
    def tkey(c: str):
        k = known.get(c)
        return (first[c], 0 if k and k[1] is not None else 1,
                k[1] if k and k[1] is not None else 0, c)
    time = {c: i for i, c in enumerate(sorted(first, key=tkey))}
    budget = {c: int(rank) if (rank := known.get(c, (None, None))[0]) is not None else 0
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
    # per rule, the row of the input ``cells`` table each chosen row came from (aligned with
    # ``tables[rule]``); what :func:`chosen_flags` marks
    source_rows: dict[str, np.ndarray] | None = None


def _codes(col: pa.ChunkedArray) -> tuple[np.ndarray, list]:
    """Integer codes of a string column whose order is the values' sort order, and the values."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    enc = pc.dictionary_encode(arr)  # hashing; only the distinct values are sorted in Python
    idx = enc.indices.to_numpy(zero_copy_only=False)
    all_values = enc.dictionary.to_pylist()
    # a dictionary column may hold values absent here (other panels): rank the present ones
    present = np.unique(idx) if pa.types.is_dictionary(arr.type) else np.arange(len(all_values))
    values = [all_values[i] for i in present]
    order = sorted(range(len(values)), key=values.__getitem__)
    rank = np.zeros(len(all_values), dtype=np.int64)
    rank[present[order]] = np.arange(len(values))
    return rank[idx], [values[i] for i in order]


def _first_per_group(keys: list[np.ndarray], tie_keys: list[np.ndarray]) -> np.ndarray:
    """Row index of the best row per group of equal ``keys``; best = smallest ``tie_keys``
    (lexicographic), then smallest row index. Returned in the groups' sort order."""
    n = keys[0].size
    idx = np.arange(n)
    order = np.lexsort([idx, *reversed(tie_keys), *reversed(keys)])
    ks = np.stack([k[order] for k in keys])
    start = np.ones(n, dtype=bool)
    start[1:] = np.any(ks[:, 1:] != ks[:, :-1], axis=0)
    return order[start]


def _one_per_campaign(included: pa.Table) -> tuple[pa.Table, np.ndarray | None]:
    """Within one campaign keep one cell per (model, prompt): the largest token budget
    (a null budget counts as −1; ties → the first row). Also the kept rows of ``included``
    (None: all of them, in order)."""
    if included.num_rows == 0:
        return included, None
    budget = pc.fill_null(included.column("budget_max_tokens"), -1).to_numpy()
    keys = [_codes(included.column(c))[0] for c in ("campaign", "model", "prompt_sha256")]
    keep = np.sort(_first_per_group(keys, [-budget.astype(np.int64)]))
    if keep.size == included.num_rows:  # nothing to drop: skip copying the table
        return included, None
    return included.take(pa.array(keep, pa.int64())), keep


def _take_if_needed(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """``table.take(rows)``, or ``table`` itself when ``rows`` is 0..n−1 (no copy)."""
    if rows.size == table.num_rows and np.array_equal(rows, np.arange(rows.size)):
        return table
    return table.take(pa.array(rows, pa.int64()))


def _cell_row(r: dict) -> CellRow:
    nan = float("nan")
    return CellRow(r["campaign"], r["prompt_sha256"], r["model"], r["runs_ok"],
                   r["mean_nodes"] if r["mean_nodes"] is not None else nan,
                   r["std_nodes"] if r["std_nodes"] is not None else nan,
                   r["mean_jaccard"], r["id_stability"], nan)


# what merging, the model tables and the intervals read of a cell table
MERGE_COLUMNS = ("panel", "campaign", "model", "prompt_sha256", "budget_max_tokens", "included",
                 "runs_ok", "mean_jaccard", "id_stability", "node_set_perfect", "mean_nodes",
                 "std_nodes")


def merge_view(cells: pa.Table) -> pa.Table:
    """``cells`` reduced to :data:`MERGE_COLUMNS` (schema metadata kept), so the merged copies
    :func:`merge_cells` makes hold only what their readers need; string columns become
    dictionary columns (int32 codes): a merged copy of 700k cells then takes codes instead of
    the 64-character prompt hashes (97 → 36 MB per copy). Values read back are the same."""
    view = cells.select([c for c in MERGE_COLUMNS if c in cells.column_names])
    for i, f in enumerate(view.schema):
        if pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
            view = view.set_column(i, pa.field(f.name, pa.dictionary(pa.int32(), f.type),
                                               f.nullable), pc.dictionary_encode(view.column(i)))
    return view


def merge_cells(cells: pa.Table, budget_rank: dict[str, int],
                time_order: dict[str, int]) -> MergedCells:
    """Merge the included cells of one panel under both rules (see module docstring).

    Same semantics as :func:`analysis.tables.merge.merge_highest_budget_first` /
    :func:`~analysis.tables.merge.merge_earliest_then_top_up` / :func:`~analysis.tables.merge.compare_merges`
    on the rows as :class:`CellRow` (ties → the first row), computed with sorts over integer
    codes instead of Python loops over rows; chosen rows are sorted by (model, prompt_sha256).
    """
    included = pc.fill_null(cells.column("included"), False)
    # copies of a 10⁶-row table are the memory peak: filter/take only when rows really change
    everything = pc.all(included).as_py() is not False
    base = (np.arange(cells.num_rows) if everything
            else np.flatnonzero(included.to_numpy(zero_copy_only=False)))
    inc, kept = _one_per_campaign(cells if everything else cells.filter(included))
    if kept is not None:
        base = base[kept]
    camp, names = _codes(inc.column("campaign"))
    for mapping in (budget_rank, time_order):
        missing = [c for c in names if c not in mapping]
        if missing:
            raise AnalysisError(f"campaign {missing[0]!r} has no entry in the precedence "
                             f"mapping; add it (known: {sorted(mapping)})")
    br = np.array([budget_rank[c] for c in names], dtype=np.int64)[camp]
    to = np.array([time_order[c] for c in names], dtype=np.int64)[camp]
    keys = [_codes(inc.column(c))[0] for c in ("model", "prompt_sha256")]
    if inc.num_rows:
        pick_h = _first_per_group(keys, [-br, -to])
        pick_e = _first_per_group(keys, [to])
    else:
        pick_h = pick_e = np.zeros(0, dtype=np.int64)
    chosen_h = _take_if_needed(inc, pick_h)
    chosen_e = chosen_h if np.array_equal(pick_h, pick_e) else _take_if_needed(inc, pick_e)
    tables = {"highest-budget-first": chosen_h, "earliest-then-top-up": chosen_e}
    shares = []
    for t in tables.values():
        perfect = pc.and_(pc.equal(t.column("mean_jaccard"), 1.0),
                          pc.equal(t.column("id_stability"), 1.0))
        n_perfect = int(pc.sum(pc.fill_null(perfect, False).cast(pa.int64())).as_py() or 0)
        shares.append(n_perfect / t.num_rows if t.num_rows else 0.0)
    # both rules choose one row per (model, prompt) group, in the same group order
    differ = np.flatnonzero(pick_h != pick_e)
    rows_h = inc.take(pa.array(pick_h[differ], pa.int64())).to_pylist()
    rows_e = inc.take(pa.array(pick_e[differ], pa.int64())).to_pylist()
    changes = tuple(CellChange(a["model"], a["prompt_sha256"], _cell_row(a), _cell_row(b))
                    for a, b in zip(rows_h, rows_e))
    comparison = MergeComparison(RULES[0], RULES[1], changes, shares[0], shares[1],
                                 shares[1] - shares[0], len(pick_h), len(pick_e))
    return MergedCells(tables, comparison, budget_rank, time_order,
                       {RULES[0]: base[pick_h], RULES[1]: base[pick_e]})


_KEY_COLUMNS = ("campaign", "model", "prompt_sha256", "budget_max_tokens", "source")


def chosen_flags(cells: pa.Table, merged: MergedCells) -> dict[str, np.ndarray]:
    """Per rule, a bool per row of ``cells``: this row supplies its cell under that rule
    (its (campaign, model, prompt, budget, source) key is among the rule's chosen rows).
    When ``merged`` came from ``merge_cells(cells, ...)`` its source rows are marked directly."""
    if merged.source_rows is not None and not _has_duplicate_keys(cells):
        out = {}
        for rule, rows in merged.source_rows.items():
            flags = np.zeros(cells.num_rows, dtype=bool)
            flags[rows] = True
            out[rule] = flags
        return out
    tables = list(merged.tables.items())
    sizes = [cells.num_rows] + [t.num_rows for _, t in tables]
    key = np.zeros(sum(sizes), dtype=np.int64)
    for c in _KEY_COLUMNS:  # one integer per distinct key tuple, shared by all tables
        col = pa.chunked_array([cells.column(c).cast(pa.string())]
                               + [t.column(c).cast(pa.string()) for _, t in tables])
        codes = pc.dictionary_encode(col.combine_chunks(), null_encoding="encode")
        values = codes.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        width = len(codes.dictionary)
        if key.size and key.max() > (2**62) // max(1, width):  # radix would overflow: re-code
            key = np.unique(key, return_inverse=True)[1].astype(np.int64)
        key = key * max(1, width) + values
    bounds = np.cumsum(sizes)
    return {rule: _member(key[:bounds[0]], key[bounds[i]:bounds[i + 1]])
            for i, (rule, _) in enumerate(tables)}


def _has_duplicate_keys(cells: pa.Table) -> bool:
    """Do two rows of ``cells`` share a chosen-flag key (then both are flagged by key)?"""
    # integer key per row by radix over dictionary codes, then one sort (a hash group-by on
    # the five columns cost ~1.7x the table's size in temporaries at 700k rows)
    key = np.zeros(cells.num_rows, dtype=np.int64)
    for c in _KEY_COLUMNS:
        col = cells.column(c)
        codes = pc.dictionary_encode(col.combine_chunks() if isinstance(col, pa.ChunkedArray)
                                     else col, null_encoding="encode")
        values = codes.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        width = max(1, len(codes.dictionary))
        if key.size and key.max() > (2**62) // width:  # radix would overflow: re-code
            key = np.unique(key, return_inverse=True)[1].astype(np.int64)
        key = key * width + values
    key.sort()
    return bool(key.size > 1 and np.any(key[1:] == key[:-1]))


def _member(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.isin(a, b)`` by sort + binary search: O((|a|+|b|) log |b|) time and O(|b|) memory
    (``np.isin`` may pick a lookup table as large as the keys' value range)."""
    if b.size == 0:
        return np.zeros(a.size, dtype=bool)
    s = np.sort(b)
    i = np.minimum(np.searchsorted(s, a), s.size - 1)
    return s[i] == a


def complete_excluded(table, cells: pa.Table):
    """Add to ``table.excluded`` every model of ``cells`` with no included cell at all (merging
    keeps included cells only, so such models would otherwise vanish instead of being listed)."""
    from analysis.tables.models import ModelTable

    listed = set(table.models) | set(table.excluded.column("model").to_pylist())
    runs_ok: dict[str, int] = {}
    if cells.num_rows:
        g = cells.select(["model", "runs_ok"]).group_by("model").aggregate([("runs_ok", "sum")])
        runs_ok = dict(zip(g.column("model").to_pylist(),
                           (int(r) for r in g.column("runs_ok_sum").to_pylist())))
    extra = [{"model": m, "n_prompts": 0, "n_cells": 0, "runs_ok": runs_ok[m],
              "reason": f"0 prompts with ≥{table.min_runs} successful runs; "
                        f"needs ≥{table.min_prompts}"}
             for m in sorted(runs_ok) if m not in listed]
    if not extra:
        return table
    excluded = pa.concat_tables([table.excluded,
                                 pa.Table.from_pylist(extra, schema=table.excluded.schema)])
    return ModelTable(table.included, excluded, table.min_runs, table.min_prompts)
