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

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa

from analysis.errors import AnalysisError
from analysis.metrics.agreement import count_agreement, node_set_agreement
from storage.records import run_succeeded

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

CellKey = tuple[str, str, str, str, int | None]


@dataclass(frozen=True)
class Cell:
    """One cell's row; field order equals :data:`CELL_SCHEMA`.

    ``mean_nodes``/``std_nodes`` are in nodes (std = population SD, ddof=0) over successful
    runs; ``first_date``/``last_date`` span all of the cell's runs, failures included.
    """

    panel: str
    campaign: str
    model: str
    prompt_sha256: str
    prompt_name: str
    budget_max_tokens: int | None
    runs_total: int
    runs_ok: int
    included: bool
    mean_jaccard: float | None
    id_stability: float | None
    node_set_perfect: bool | None
    mean_nodes: float | None
    std_nodes: float | None
    count_agreement: float | None
    count_equal_share: float | None
    first_date: dt.date
    last_date: dt.date


@dataclass(frozen=True)
class _Run:
    run_index: int
    prompt_name: str
    ok: bool
    node_ids: tuple[str, ...]
    node_count: int
    date: dt.date


def _check_columns(runs: pa.Table) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in runs.column_names]
    if missing:
        raise AnalysisError(
            f"run table lacks column(s) {missing}; pass the table returned by "
            "storage.runs.RunStore.read_table"
        )


def _dedupe_last(run_ids: Sequence[str]) -> list[int]:
    """Row indices keeping the last row of each run_id (a redelivered task rewrote it)."""
    last: dict[str, int] = {}
    for i, rid in enumerate(run_ids):
        last[rid] = i
    return sorted(last.values())


def _group(runs: pa.Table) -> dict[CellKey, list[_Run]]:
    cols = {c: runs.column(c).to_pylist() for c in REQUIRED_COLUMNS}
    groups: dict[CellKey, list[_Run]] = {}
    for i in _dedupe_last(cols["run_id"]):
        key: CellKey = (
            cols["panel"][i],
            cols["campaign"][i],
            cols["model"][i],
            cols["prompt_sha256"][i],
            cols["budget_max_tokens"][i],
        )
        ok = run_succeeded(cols["parse_outcome"][i], cols["ir_json"][i])
        groups.setdefault(key, []).append(
            _Run(
                run_index=cols["run_index"][i],
                prompt_name=cols["prompt_name"][i],
                ok=ok,
                node_ids=tuple(cols["node_ids"][i] or ()),
                node_count=int(cols["node_count"][i] or 0),
                date=cols["measurement_date"][i],
            )
        )
    return groups


def _cell(key: CellKey, runs: list[_Run], min_runs: int) -> Cell:
    runs = sorted(runs, key=lambda r: r.run_index)
    ok = [r for r in runs if r.ok]
    # The name is display-only; the sha256 identifies the prompt. Prefer the most common.
    name = Counter(r.prompt_name for r in runs).most_common(1)[0][0]
    dates = [r.date for r in runs]
    metrics: dict[str, float | bool | None] = dict.fromkeys(
        (
            "mean_jaccard",
            "id_stability",
            "node_set_perfect",
            "mean_nodes",
            "std_nodes",
            "count_agreement",
            "count_equal_share",
        )
    )
    if len(ok) >= 2:
        agg = node_set_agreement([frozenset(r.node_ids) for r in ok])
        counts = np.array([r.node_count for r in ok], dtype=np.float64)
        ca, eq = count_agreement([r.node_count for r in ok])
        metrics.update(
            mean_jaccard=agg.mean_jaccard,
            id_stability=agg.id_stability,
            node_set_perfect=agg.node_set_perfect,
            mean_nodes=float(counts.mean()),
            std_nodes=float(counts.std(ddof=0)),
            count_agreement=ca,
            count_equal_share=eq,
        )
    panel, campaign, model, sha, budget = key
    return Cell(
        panel=panel,
        campaign=campaign,
        model=model,
        prompt_sha256=sha,
        prompt_name=name,
        budget_max_tokens=budget,
        runs_total=len(runs),
        runs_ok=len(ok),
        included=len(ok) >= min_runs,
        first_date=min(dates),
        last_date=max(dates),
        **metrics,  # type: ignore[arg-type]
    )


def cells_to_table(cells: Sequence[Cell], min_runs: int) -> pa.Table:
    """Cells → Table with :data:`CELL_SCHEMA`; ``min_runs`` is recorded in schema metadata."""
    names = [f.name for f in fields(Cell)]
    arrays = [
        pa.array([getattr(c, name) for c in cells], type=CELL_SCHEMA.field(name).type)
        for name in names
    ]
    schema = CELL_SCHEMA.with_metadata({MIN_RUNS_METADATA_KEY: str(min_runs).encode()})
    return pa.Table.from_arrays(arrays, schema=schema)


def compute_cells(runs: pa.Table, min_runs: int = 2) -> list[Cell]:
    """Typed form of :func:`build_cells`; cells sorted by panel, campaign, model, name, budget."""
    if min_runs < 2:
        raise AnalysisError(
            f"min_runs must be >= 2 (a stability value needs a pair of runs), got {min_runs}"
        )
    _check_columns(runs)
    cells = [_cell(k, v, min_runs) for k, v in _group(runs).items()]
    cells.sort(
        key=lambda c: (
            c.panel,
            c.campaign,
            c.model,
            c.prompt_name,
            c.prompt_sha256,
            -1 if c.budget_max_tokens is None else c.budget_max_tokens,
        )
    )
    return cells


def build_cells(runs: pa.Table, min_runs: int = 2) -> pa.Table:
    """One row per (panel, campaign, model, prompt_sha256, budget_max_tokens).

    ``included`` = ``runs_ok >= min_runs`` (successful runs). Metrics (Jaccard, ID-stability,
    node-set-perfect, node-count mean/population SD in nodes, count agreement and the share
    of equal-count pairs) are null when ``runs_ok < 2``. Rows sharing a ``run_id`` are
    collapsed to the last one, so a store that was not yet deduplicated cannot double-count.
    """
    return cells_to_table(compute_cells(runs, min_runs), min_runs)
