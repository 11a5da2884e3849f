"""Cells → the per-model stability table of one panel, and the models it leaves out.

Input: a cell table from :func:`analysis.tables.cells.build_cells` (one panel; one row per prompt
once campaigns are merged). Output: :class:`ModelTable` with

* ``included``: ``rank, model, n_prompts, n_cells, mean_jaccard, id_stability, perfect,
  mean_nodes`` — means over the model's included cells (unweighted: one vote per cell),
  ``perfect`` = number of node-set-perfect cells, sorted by mean Jaccard descending, ties by
  mean ID-stability descending, then model name; ``rank`` 1..n in that order;
* ``excluded``: ``model, n_prompts, n_cells, runs_ok, reason`` for every model with fewer
  than ``min_prompts`` distinct prompts among its included cells — listed, never dropped.

Later modules add columns (intervals, rank retention) by name with :meth:`ModelTable.with_columns`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.errors import AnalysisError
from analysis.tables.cells import MIN_RUNS_METADATA_KEY

INCLUDED_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int64(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("n_prompts", pa.int64(), nullable=False),
        pa.field("n_cells", pa.int64(), nullable=False),
        pa.field("mean_jaccard", pa.float64(), nullable=False),
        pa.field("id_stability", pa.float64(), nullable=False),
        pa.field("perfect", pa.int64(), nullable=False),
        pa.field("mean_nodes", pa.float64(), nullable=False),
    ]
)

EXCLUDED_SCHEMA = pa.schema(
    [
        pa.field("model", pa.string(), nullable=False),
        pa.field("n_prompts", pa.int64(), nullable=False),
        pa.field("n_cells", pa.int64(), nullable=False),
        pa.field("runs_ok", pa.int64(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
    ]
)


@dataclass(frozen=True)
class ModelTable:
    """The point-estimate table (``included``) and the models below threshold (``excluded``)."""

    included: pa.Table
    excluded: pa.Table
    min_runs: int
    min_prompts: int

    @property
    def models(self) -> list[str]:
        """Included models in rank order."""
        return self.included.column("model").to_pylist()

    def with_columns(self, **columns: pa.Array | list | np.ndarray) -> ModelTable:
        """A copy with columns added to (or replaced in) ``included``, aligned by row order."""
        table = self.included
        for name, values in columns.items():
            arr = values if isinstance(values, pa.Array | pa.ChunkedArray) else pa.array(values)
            if len(arr) != table.num_rows:
                raise AnalysisError(
                    f"column {name!r} has {len(arr)} values; the table has {table.num_rows} models"
                )
            if name in table.column_names:
                table = table.set_column(table.column_names.index(name), name, arr)
            else:
                table = table.append_column(name, arr)
        return ModelTable(table, self.excluded, self.min_runs, self.min_prompts)


def _min_runs_of(cells: pa.Table, min_runs: int | None) -> int:
    if min_runs is not None:
        return min_runs
    meta = cells.schema.metadata or {}
    raw = meta.get(MIN_RUNS_METADATA_KEY)
    return int(raw) if raw is not None else 2


def _encode(col: pa.ChunkedArray) -> tuple[np.ndarray, list]:
    """(int64 codes, distinct values in order of first appearance) of a string column."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    enc = pc.dictionary_encode(arr)  # a dictionary column comes back as it is
    codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    values = enc.dictionary
    if pa.types.is_dictionary(arr.type):
        # its dictionary may hold values absent here, in another order: renumber the codes
        # by first appearance, as encoding the plain strings would
        present, first = np.unique(codes, return_index=True)
        present = present[np.argsort(first, kind="stable")]
        remap = np.empty(len(values), dtype=np.int64)
        remap[present] = np.arange(present.size)
        return remap[codes], values.take(pa.array(present)).to_pylist()
    return codes, values.to_pylist()


def distinct_values(*cols: pa.ChunkedArray | pa.Array) -> set:
    """The set of values (None for nulls) occurring in any of ``cols``, as
    ``set(col.to_pylist())`` would give, without converting every row to Python (that takes 8 s
    per 700k-row column set on the 100 × 10,000 panel): ``pc.unique`` per chunk, and on a
    dictionary column only the dictionary entries its indices use."""
    out: set = set()
    for col in cols:
        chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
        for chunk in chunks:
            if pa.types.is_dictionary(chunk.type):
                if chunk.null_count:
                    out.add(None)
                used = pc.unique(chunk.indices).drop_null()
                out.update(chunk.dictionary.take(used).to_pylist())
            else:
                out.update(pc.unique(chunk).to_pylist())
    return out


def _distinct_per_model(model: np.ndarray, prompt: np.ndarray, n_models: int,
                        n_prompts: int, max_bitmap: int = 50_000_000) -> np.ndarray:
    """Number of distinct prompt codes per model code (bitmap when small, else unique)."""
    if n_models * n_prompts <= max_bitmap:
        seen = np.zeros(n_models * n_prompts, dtype=bool)
        seen[model * n_prompts + prompt] = True
        return seen.reshape(n_models, n_prompts).sum(axis=1)
    pairs = np.unique(model * n_prompts + prompt)
    return np.bincount(pairs // n_prompts, minlength=n_models)


def _floats(col: pa.ChunkedArray) -> np.ndarray:
    """A numeric column as float64 with null → NaN."""
    return np.asarray(col.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def model_table(cells: pa.Table, min_prompts: int = 3, min_runs: int | None = None) -> ModelTable:
    """Aggregate included cells per model; see the module docstring for columns and order.

    ``min_prompts``: a model needs at least this many distinct prompts (by sha256) among its
    included cells. ``min_runs`` only words the exclusion reason; by default it is read from
    the cell table's metadata (the threshold that decided ``included``).
    """
    return model_tables(cells, [min_prompts], min_runs)[0]


def model_tables(cells: pa.Table, min_prompts: list[int], min_runs: int | None = None
                 ) -> list[ModelTable]:
    """:func:`model_table` of ``cells`` for each threshold in ``min_prompts`` (same order),
    aggregating the cells once (the sensitivity grid asks for three thresholds per merge)."""
    if any(mp < 1 for mp in min_prompts):
        raise AnalysisError(f"min_prompts must be >= 1, got {min(min_prompts)}")
    panels = set(pc.unique(cells.column("panel")).to_pylist()) if cells.num_rows else set()
    if len(panels) > 1:
        raise AnalysisError(
            f"model_table works on one panel at a time; got panels {sorted(panels)} "
            "(filter the cell table by panel first)"
        )
    mr = _min_runs_of(cells, min_runs)
    # Column-wise: integer codes per model (in order of first appearance) and prompt, then
    # per-model counts with bincount; means stay np.mean over each model's included cells in
    # row order (the same summation as a per-model loop, so every figure is the same).
    model_codes, model_names = _encode(cells.column("model"))
    prompt_codes, prompt_names = _encode(cells.column("prompt_sha256"))
    n_models = len(model_names)
    included = pc.fill_null(cells.column("included"), False).to_numpy(zero_copy_only=False)
    runs_ok = np.bincount(model_codes, weights=_floats(cells.column("runs_ok")),
                          minlength=n_models)
    inc_idx = np.flatnonzero(included)
    inc_model = model_codes[inc_idx]
    n_cells = np.bincount(inc_model, minlength=n_models)
    n_prompts = _distinct_per_model(inc_model, prompt_codes[inc_idx], n_models,
                                    len(prompt_names))
    order = inc_idx[np.argsort(inc_model, kind="stable")]  # included rows grouped by model
    bounds = np.concatenate([[0], np.cumsum(n_cells)])
    jac_all = _floats(cells.column("mean_jaccard"))
    stab_all = _floats(cells.column("id_stability"))
    nodes_all = _floats(cells.column("mean_nodes"))
    perfect_all = pc.fill_null(cells.column("node_set_perfect"), False).to_numpy(
        zero_copy_only=False)
    lowest = min(min_prompts, default=1)
    stats: dict[int, tuple] = {}
    for code, model in enumerate(model_names):  # loop over models, vectorised over cells
        if int(n_prompts[code]) >= lowest:
            rows = order[bounds[code]:bounds[code + 1]]
            stats[code] = (model, int(n_prompts[code]), int(n_cells[code]),
                           float(jac_all[rows].mean()), float(stab_all[rows].mean()),
                           int(perfect_all[rows].sum()), float(nodes_all[rows].mean()))
    return [_table(model_names, n_prompts, n_cells, runs_ok, stats, mp, mr) for mp in min_prompts]


def _table(model_names: list, n_prompts: np.ndarray, n_cells: np.ndarray, runs_ok: np.ndarray,
           stats: dict[int, tuple], min_prompts: int, mr: int) -> ModelTable:
    inc_rows: list[tuple] = []
    exc_rows: list[tuple] = []
    for code, model in enumerate(model_names):  # loop over models
        np_ = int(n_prompts[code])
        if np_ < min_prompts:
            reason = (
                f"{_plural(np_, 'prompt')} with ≥{mr} successful runs; "
                f"needs ≥{min_prompts}"
            )
            exc_rows.append((model, np_, int(n_cells[code]), int(runs_ok[code]), reason))
            continue
        inc_rows.append(stats[code])
    inc_rows.sort(key=lambda r: (-r[3], -r[4], r[0]))
    exc_rows.sort(key=lambda r: (-r[1], r[0]))

    names = INCLUDED_SCHEMA.names
    if inc_rows:
        inc_cols = [list(range(1, len(inc_rows) + 1)), *(list(c) for c in zip(*inc_rows))]
    else:
        inc_cols = [[] for _ in names]
    included = pa.Table.from_arrays(
        [pa.array(v, type=INCLUDED_SCHEMA.field(n).type) for n, v in zip(names, inc_cols)],
        schema=INCLUDED_SCHEMA,
    )
    exc_cols = [list(c) for c in zip(*exc_rows)] if exc_rows else [[] for _ in EXCLUDED_SCHEMA]
    excluded = pa.Table.from_arrays(
        [pa.array(v, type=f.type) for f, v in zip(EXCLUDED_SCHEMA, exc_cols)],
        schema=EXCLUDED_SCHEMA,
    )
    return ModelTable(included=included, excluded=excluded, min_runs=mr, min_prompts=min_prompts)


def filter_panel(cells: pa.Table, panel: str) -> pa.Table:
    """Rows of one panel (schema metadata kept)."""
    return cells.filter(pc.equal(cells.column("panel"), panel))
