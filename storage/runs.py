"""The ``runs/`` dataset: every execution of every run, partitioned by ``measurement_date``.

**Execution model.** A run (``run_id``) can be executed more than once: a redelivered task
under at-least-once delivery, a worker stopped past its claim, a retry of a failed run. Each
execution is one row with its own ``execution_id`` and is never overwritten or dropped, so the
dataset read file by file without dedupe holds every execution and every attempt an endpoint
answered. :data:`EXECUTION_RULE` picks the one execution per run_id that analysis, status and
resume use. Copies of one execution (a crash mid-compaction) collapse on read and compaction.

**Waves.** A wave is a re-measurement of every planned run of a campaign; wave ``k >= 2`` plans
its runs under their own run ids (the wave is part of the id, ``orchestrator.campaign.plan``), so
"the latest execution per run and wave" is exactly :data:`EXECUTION_RULE` on ``run_id``. Every
row carries its ``wave`` (rows of schema versions 1-2 read as wave 1); :meth:`RunStore.read_table`
takes a ``wave`` filter, and ``storage.waves`` lists a campaign's waves.

A single-record write is published as ``<run_id>.<execution_id>.parquet`` with
first-writer-wins (re-publishing the same execution is a no-op); batches are
``batch-<uuid>.parquet``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from storage.parquet.compaction import CompactionConfig, CompactionReport, compact
from storage.parquet.dataset import DatasetSpec, ParquetDataset
from storage.parquet.dedupe import pick_latest
from storage.records import RunRecord
from storage.parquet.spool import recover_orphans
from storage.schema import NULL_DEFAULTS, RUN_SCHEMA, records_to_table, table_to_records

RUNS_DATASET = "runs"
#: The rule readers use to pick one execution per run_id (``DatasetSpec``'s execution rule).
EXECUTION_RULE = (
    "latest execution: largest finished_at (measured_at for rows without one, e.g. schema "
    "version 1), ties broken by the smallest execution_id, then file name, then row position"
)
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,150}$")


def run_spec(name: str = RUNS_DATASET) -> DatasetSpec:
    """The dataset description of run records."""
    return DatasetSpec(
        name=name,
        schema=RUN_SCHEMA,
        key="run_id",
        partition_col="measurement_date",
        order_col="measured_at",
        version_col="schema_version",
        execution_col="execution_id",
        finish_col="finished_at",
        null_defaults=NULL_DEFAULTS,
    )


def latest_executions(table: pa.Table) -> pa.Table:
    """One row per run_id of ``table`` by :data:`EXECUTION_RULE` (needs ``run_id``,
    ``measured_at``; uses ``execution_id``/``finished_at`` when present), sorted by run_id."""
    return pick_latest(table, run_spec())


def file_stem_for(run_id: str) -> str:
    """A file-name-safe, deterministic stem for one run (hashed if the id is not safe)."""
    if _SAFE_ID.match(run_id) and not run_id.startswith("batch-") and not run_id.startswith("part-"):
        return run_id
    return "run-" + hashlib.sha256(run_id.encode()).hexdigest()[:40]


class RunStore:
    """Run records under ``root/runs/``.

    ``fsync``: durable writes (default on); ``compaction``: settings for :meth:`compact`.
    """

    def __init__(
        self,
        root: Path,
        *,
        fsync: bool = True,
        compression: str = "snappy",
        compaction: CompactionConfig = CompactionConfig(),
    ) -> None:
        self.root = Path(root)
        self.dataset = ParquetDataset(self.root, run_spec(), fsync=fsync, compression=compression)
        self.compaction = compaction

    def write(self, records: Sequence[RunRecord]) -> int:
        """Persist ``records`` atomically; returns rows published.

        One record: ``<run_id>.<execution_id>.parquet``, 0 if that file already exists (the
        same execution published twice). More: one ``batch-<uuid>.parquet`` per measurement
        date. Every execution is kept; readers pick one per run_id (:data:`EXECUTION_RULE`).
        """
        if not records:
            return 0
        table = records_to_table(records)
        stem = None
        if len(records) == 1:
            stem = file_stem_for(records[0].run_id)
            if records[0].execution_id:
                stem = f"{stem}.{records[0].execution_id}"
        return self.dataset.write(table, stem=stem).rows_written

    @staticmethod
    def _filters(
        campaigns: Sequence[str] | None, models: Sequence[str] | None, waves: Sequence[int] | None = None
    ) -> dict[str, list[Any]]:
        filters: dict[str, list[Any]] = {}
        if campaigns is not None:
            filters["campaign"] = list(campaigns)
        if models is not None:
            filters["model"] = list(models)
        if waves is not None:
            filters["wave"] = list(waves)
        return filters

    def completed_run_ids(self, campaign: str | None = None) -> set[str]:
        """run_ids stored (any outcome, failures included), optionally for one campaign."""
        filters = {"campaign": campaign} if campaign is not None else None
        return self.dataset.keys(filters=filters)

    def read_table(
        self,
        date_from: dt.date | None = None,
        date_to: dt.date | None = None,
        campaigns: Sequence[str] | None = None,
        models: Sequence[str] | None = None,
        columns: Sequence[str] | None = None,
        waves: Sequence[int] | None = None,
    ) -> pa.Table:
        """Runs in the inclusive date range, one row per run_id (:data:`EXECUTION_RULE`),
        sorted by run_id. ``waves``: only rows of these wave numbers (None = every wave); the
        ``wave`` column of rows stored before waves existed reads as 1. The served identity is in
        the ``served_model``, ``system_fingerprint`` and ``served_digest`` columns."""
        return self.dataset.read(
            date_from=date_from,
            date_to=date_to,
            filters=self._filters(campaigns, models, waves),
            columns=columns,
        )

    def read_records(
        self,
        date_from: dt.date | None = None,
        date_to: dt.date | None = None,
        campaigns: Sequence[str] | None = None,
        models: Sequence[str] | None = None,
        waves: Sequence[int] | None = None,
    ) -> list[RunRecord]:
        """Like :meth:`read_table`, as validated RunRecords."""
        return table_to_records(self.read_table(date_from, date_to, campaigns, models, waves=waves))

    def read_executions(
        self,
        campaigns: Sequence[str] | None = None,
        models: Sequence[str] | None = None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Every stored execution once (copies of one collapsed), sorted by run_id."""
        return self.dataset.read(
            filters=self._filters(campaigns, models), columns=columns, dedupe="executions"
        )

    def count_by_outcome(self, campaign: str | None = None) -> dict[str, int]:
        """Deduplicated run counts per final outcome value (e.g. ``{"ok": 95, "timeout_read": 5}``)."""
        table = self.read_table(
            campaigns=[campaign] if campaign is not None else None, columns=["outcome"]
        )
        if table.num_rows == 0:
            return {}
        counts = pc.value_counts(table["outcome"]).to_pylist()
        return {c["values"]: c["counts"] for c in sorted(counts, key=lambda c: c["values"])}

    def date_window(
        self, campaign: str | None = None, models: Sequence[str] | None = None
    ) -> tuple[dt.date, dt.date] | None:
        """First and last ``measurement_date`` with data (None if there is none)."""
        if campaign is None and models is None:
            days = [d for d in self.dataset.partitions() if self.dataset.partition_files(d)]
            return (days[0], days[-1]) if days else None
        table = self.dataset.read(
            filters=self._filters([campaign] if campaign is not None else None, models),
            columns=["measurement_date"],
        )
        if table.num_rows == 0:
            return None
        mm = pc.min_max(table["measurement_date"]).as_py()
        return mm["min"], mm["max"]

    def compact(self, date: dt.date | None = None) -> CompactionReport:
        """Publish the spools of dead writers, then merge small files of one partition (or
        all); see :mod:`storage.parquet.compaction` and :mod:`storage.parquet.spool`."""
        recover_orphans(self.dataset)
        return compact(self.dataset, date, self.compaction)
