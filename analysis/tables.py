"""Cells → the per-model stability table of one panel, and the models it leaves out.

Input: a cell table from :func:`analysis.cells.build_cells` (one panel; one row per prompt
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

from analysis.cells import MIN_RUNS_METADATA_KEY

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
                raise ValueError(
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


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def model_table(cells: pa.Table, min_prompts: int = 3, min_runs: int | None = None) -> ModelTable:
    """Aggregate included cells per model; see the module docstring for columns and order.

    ``min_prompts``: a model needs at least this many distinct prompts (by sha256) among its
    included cells. ``min_runs`` only words the exclusion reason; by default it is read from
    the cell table's metadata (the threshold that decided ``included``).
    """
    if min_prompts < 1:
        raise ValueError(f"min_prompts must be >= 1, got {min_prompts}")
    panels = set(cells.column("panel").to_pylist()) if cells.num_rows else set()
    if len(panels) > 1:
        raise ValueError(
            f"model_table works on one panel at a time; got panels {sorted(panels)} "
            "(filter the cell table by panel first)"
        )
    mr = _min_runs_of(cells, min_runs)
    col = {
        c: cells.column(c).to_pylist()
        for c in (
            "model",
            "prompt_sha256",
            "included",
            "runs_ok",
            "mean_jaccard",
            "id_stability",
            "node_set_perfect",
            "mean_nodes",
        )
    }
    by_model: dict[str, list[int]] = {}
    for i, m in enumerate(col["model"]):
        by_model.setdefault(m, []).append(i)

    inc_rows: list[tuple] = []
    exc_rows: list[tuple] = []
    for model, idx in by_model.items():
        inc = [i for i in idx if col["included"][i]]
        prompts = {col["prompt_sha256"][i] for i in inc}
        runs_ok = sum(col["runs_ok"][i] for i in idx)
        if len(prompts) < min_prompts:
            reason = (
                f"{_plural(len(prompts), 'prompt')} with ≥{mr} successful runs; "
                f"needs ≥{min_prompts}"
            )
            exc_rows.append((model, len(prompts), len(inc), runs_ok, reason))
            continue
        jac = np.array([col["mean_jaccard"][i] for i in inc], dtype=np.float64)
        stab = np.array([col["id_stability"][i] for i in inc], dtype=np.float64)
        nodes = np.array([col["mean_nodes"][i] for i in inc], dtype=np.float64)
        perfect = sum(bool(col["node_set_perfect"][i]) for i in inc)
        inc_rows.append(
            (model, len(prompts), len(inc), float(jac.mean()), float(stab.mean()), perfect,
             float(nodes.mean()))
        )
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
