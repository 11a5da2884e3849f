"""The ``cells/`` dataset: imported cell-level measurements (one row per campaign × model × prompt).

Some data arrive only as per-cell summaries (e.g. a published study's per-campaign stability
CSVs, whose raw runs were never persisted). They are stored here, beside the run records, so the
analysis can merge them with cells recomputed from raw runs under a merge precedence rule.

Each row carries its campaign of origin, its panel, and the campaign's precedence (``budget_rank``:
larger = bigger declared budget; ``time_order``: larger = later campaign), so the analysis needs no
side file. Partitioned by ``measurement_date``; ``date_is_window`` says the date is the start of a
measurement window (``window_end`` its end), not a stamp. Deduplicated by ``measurement_id``
(deterministic, see :func:`measurement_id`), so re-importing the same file is a no-op.

Units: ``mean_nodes``/``std_nodes`` in nodes (std = population SD over runs); ``mean_jaccard``,
``id_stability``, ``mean_confidence`` unitless in [0, 1] (as published, e.g. 3 decimals).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import pyarrow as pa

from storage.parquet.dataset import DatasetSpec, ParquetDataset, WriteResult
from storage.schema import RECORD_METADATA_KEY, VERSION_METADATA_KEY

CELLS_DATASET = "cells"
CELL_MEASUREMENT_VERSION = 1

CELL_MEASUREMENT_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int32(), nullable=False),
        pa.field("measurement_id", pa.string(), nullable=False),
        pa.field("panel", pa.string(), nullable=False),
        pa.field("campaign", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("prompt_name", pa.string(), nullable=False),
        pa.field("prompt_sha256", pa.string(), nullable=False),
        pa.field("successful_runs", pa.int64(), nullable=False),
        pa.field("mean_nodes", pa.float64()),
        pa.field("std_nodes", pa.float64()),
        pa.field("mean_jaccard", pa.float64()),
        pa.field("id_stability", pa.float64()),
        pa.field("mean_confidence", pa.float64()),
        pa.field("budget_rank", pa.int64()),
        pa.field("time_order", pa.int64()),
        pa.field("declared_budget", pa.string()),
        pa.field("source", pa.string(), nullable=False),
        pa.field("measurement_date", pa.date32(), nullable=False),
        pa.field("date_is_window", pa.bool_(), nullable=False),
        pa.field("window_end", pa.date32()),
    ],
    metadata={
        VERSION_METADATA_KEY: str(CELL_MEASUREMENT_VERSION).encode(),
        RECORD_METADATA_KEY: b"CellMeasurement",
    },
)


@dataclass(frozen=True)
class CellMeasurement:
    """One imported cell measurement; fields as :data:`CELL_MEASUREMENT_SCHEMA` (see module doc).

    ``prompt_sha256`` is the sha256 of the prompt file's bytes, or ``"name:<prompt_name>"`` when
    the file is not available (the import reports such cells). ``source``: file it came from.
    """

    measurement_id: str
    panel: str
    campaign: str
    model: str
    prompt_name: str
    prompt_sha256: str
    successful_runs: int
    mean_nodes: float | None
    std_nodes: float | None
    mean_jaccard: float | None
    id_stability: float | None
    mean_confidence: float | None
    budget_rank: int | None
    time_order: int | None
    declared_budget: str | None
    source: str
    measurement_date: dt.date
    date_is_window: bool
    window_end: dt.date | None = None
    schema_version: int = CELL_MEASUREMENT_VERSION


def measurement_id(panel: str, campaign: str, model: str, prompt_name: str) -> str:
    """Deterministic id of one campaign's measurement of one cell (idempotent re-imports)."""
    raw = "\x1f".join((panel, campaign, model, prompt_name)).encode()
    return "cm-" + hashlib.sha256(raw).hexdigest()[:40]


def cells_spec(name: str = CELLS_DATASET) -> DatasetSpec:
    """The dataset description of imported cell measurements."""
    return DatasetSpec(
        name=name,
        schema=CELL_MEASUREMENT_SCHEMA,
        key="measurement_id",
        partition_col="measurement_date",
        order_col=None,
        version_col="schema_version",
    )


class CellStore:
    """Imported cell measurements under ``root/cells/`` (same atomic, partitioned layout as runs)."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.dataset = ParquetDataset(self.root, cells_spec(), fsync=fsync)

    def write(self, rows: Sequence[CellMeasurement], *, stem: str | None = None) -> WriteResult:
        """Publish ``rows`` atomically. With a ``stem`` an existing file of that name wins
        (a repeated import of the same source is a no-op on disk)."""
        if not rows:
            return WriteResult(0)
        # column-wise: dataclasses.asdict per row is ~10x slower at 10^5 rows
        names = [f.name for f in fields(CellMeasurement)]
        table = pa.table({n: [getattr(r, n) for r in rows] for n in names}).select(
            CELL_MEASUREMENT_SCHEMA.names).cast(CELL_MEASUREMENT_SCHEMA)
        return self.dataset.write(table, stem=stem)

    def read_table(
        self,
        date_from: dt.date | None = None,
        date_to: dt.date | None = None,
        campaigns: Sequence[str] | None = None,
        models: Sequence[str] | None = None,
    ) -> pa.Table:
        """Measurements in the inclusive date range, one row per measurement_id."""
        filters: dict[str, list[str]] = {}
        if campaigns is not None:
            filters["campaign"] = list(campaigns)
        if models is not None:
            filters["model"] = list(models)
        return self.dataset.read(date_from=date_from, date_to=date_to, filters=filters)
