"""The ``probes/`` dataset: one row per (probe campaign, model, token budget), partitioned by
``probe_date``.

A row summarises the runs of one probe cell (outcome counts, latency, reasoning and answer
sizes) and carries the model's failure attribution (``analysis.tables.probes``) with its evidence.
Rows are derived: the probe's raw runs stay in ``runs/`` (a probe is a campaign whose runs are
ordinary RunRecords with ``budget_max_tokens``), or, for the study's published probe, in
``results/failure_attribution.csv``. Re-summarising a probe replaces its file
(``probe-<source>-<campaign>.parquet``, last writer wins).

Units: ``*_ms`` milliseconds, ``*_s`` seconds, ``*_chars`` characters.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from storage.parquet.dataset import DatasetSpec, ParquetDataset
from storage.schema import RECORD_METADATA_KEY, TIMESTAMP, VERSION_METADATA_KEY

PROBES_DATASET = "probes"
PROBE_SCHEMA_VERSION = 1

PROBE_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field("schema_version", pa.int32(), nullable=False),
        pa.field("probe_key", pa.string(), nullable=False),
        pa.field("probe_date", pa.date32(), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # "probe" (our runs) | "artifact"
        pa.field("campaign", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("budget_max_tokens", pa.int64()),
        pa.field("runs", pa.int64(), nullable=False),
        pa.field("runs_succeeded", pa.int64(), nullable=False),
        pa.field("succeeded_within_reference", pa.int64(), nullable=False),
        pa.field("n_ok", pa.int64(), nullable=False),
        pa.field("n_truncated", pa.int64(), nullable=False),
        pa.field("n_empty", pa.int64(), nullable=False),
        pa.field("n_timeout", pa.int64(), nullable=False),
        pa.field("n_other", pa.int64(), nullable=False),
        pa.field("outcomes", pa.string(), nullable=False),  # "ok=5, truncated=1" (every class)
        pa.field("latency_ms_median", pa.float64()),
        pa.field("latency_ms_max", pa.float64()),
        pa.field("reasoning_chars_median", pa.float64()),
        pa.field("answer_chars_median", pa.float64()),
        pa.field("reference_timeout_s", pa.float64(), nullable=False),
        pa.field("works_min_share", pa.float64(), nullable=False),
        pa.field("cell_verdict", pa.string(), nullable=False),
        pa.field("evidence", pa.string(), nullable=False),
        pa.field("attribution", pa.string(), nullable=False),
        pa.field("attribution_evidence", pa.string(), nullable=False),
        pa.field("computed_at", TIMESTAMP, nullable=False),
    ],
    metadata={
        VERSION_METADATA_KEY: str(PROBE_SCHEMA_VERSION).encode(),
        RECORD_METADATA_KEY: b"ProbeRow",
    },
)

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def probe_spec(name: str = PROBES_DATASET) -> DatasetSpec:
    return DatasetSpec(
        name=name,
        schema=PROBE_SCHEMA,
        key="probe_key",
        partition_col="probe_date",
        order_col="computed_at",
        version_col="schema_version",
    )


def probe_key(source: str, campaign: str, model: str, budget_max_tokens: int | None) -> str:
    """Deterministic key of one probe cell (32 hex chars)."""
    raw = "\x00".join([source, campaign, model, "none" if budget_max_tokens is None else str(budget_max_tokens)])
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:32]


def probe_file_stem(source: str, campaign: str) -> str:
    """File stem of one probe's summary: readable, file-name-safe, unique per (source, campaign)."""
    digest = hashlib.sha256(f"{source}\x00{campaign}".encode()).hexdigest()[:8]
    return f"probe-{_SAFE.sub('_', source)[:20]}-{_SAFE.sub('_', campaign)[:80]}-{digest}"


class ProbeStore:
    """Probe summaries under ``root/probes/``."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.dataset = ParquetDataset(self.root, probe_spec(), fsync=fsync)

    def replace(self, table: pa.Table, *, source: str, campaign: str) -> int:
        """Publish the summary rows of one probe, replacing an earlier summary of it.

        ``table`` must have :data:`PROBE_SCHEMA` columns; returns rows written.
        """
        stem = probe_file_stem(source, campaign)
        return self.dataset.write(table, stem=stem, overwrite=True).rows_written

    def read(
        self,
        *,
        campaigns: Sequence[str] | None = None,
        models: Sequence[str] | None = None,
        date_from: dt.date | None = None,
        date_to: dt.date | None = None,
    ) -> pa.Table:
        """Probe rows (one per probe_key, the latest computation) sorted by key."""
        filters: dict[str, list[str]] = {}
        if campaigns is not None:
            filters["campaign"] = list(campaigns)
        if models is not None:
            filters["model"] = list(models)
        table = self.dataset.read(date_from=date_from, date_to=date_to, filters=filters, dedupe=False)
        if table.num_rows == 0:
            return table
        # the latest computation of a key wins (replace() normally leaves one row per key)
        order = pc.sort_indices(table, [("probe_key", "ascending"), ("computed_at", "descending")])
        table = table.take(order)
        keys = table.column("probe_key").to_pylist()
        keep = [i for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
        return table.take(pa.array(keep, pa.int64()))
