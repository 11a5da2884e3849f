"""The ``availability/`` dataset: one row per (check, model), partitioned by ``check_date``.

A row records what one availability check (``orchestrator.jobs.availability``) found for one model:
``available``, ``retired`` (with the retirement date and reference id from the 410 body),
``not_listed``, ``not_found``, ``unknown_model``, ``auth_error``, ``timeout`` or ``error``
(``../shared/spec/failures.md``). Rows are appended, never rewritten, so the dataset is the
model's history; imports of published audits carry ``source = "artifact"``.

:func:`timelines` reduces the rows to one timeline per model (first seen, last available,
first missing, retirement date) — what ``irbench availability history`` prints and what a
dispatcher or report asks ("can this model still be re-measured, and since when not?").
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from storage.parquet.dataset import DatasetSpec, ParquetDataset
from storage.errors import StorageError
from storage.schema import RECORD_METADATA_KEY, TIMESTAMP, VERSION_METADATA_KEY

AVAILABILITY_DATASET = "availability"
AVAILABILITY_SCHEMA_VERSION = 1
MESSAGE_MAX_CHARS = 1000


class Availability(StrEnum):
    AVAILABLE = "available"
    RETIRED = "retired"
    NOT_LISTED = "not_listed"
    NOT_FOUND = "not_found"
    UNKNOWN_MODEL = "unknown_model"  # a gateway's 400/404 saying it routes no such model
    AUTH_ERROR = "auth_error"
    TIMEOUT = "timeout"
    ERROR = "error"


#: statuses meaning the model itself is gone (not a problem of our key, network or the moment)
MISSING = frozenset(
    {Availability.RETIRED, Availability.NOT_LISTED, Availability.NOT_FOUND, Availability.UNKNOWN_MODEL}
)


class AvailabilityRecord(BaseModel):
    """What one check found for one model. ``checked_at`` is a UTC instant."""

    model_config = ConfigDict(frozen=True)

    schema_version: int = AVAILABILITY_SCHEMA_VERSION
    checked_at: dt.datetime
    source: str = Field(default="check", description="check | artifact | campaign")
    endpoint: str
    base_url: str | None = None
    model: str
    status: Availability
    listed: bool | None = Field(default=None, description="in the endpoint's model listing; None = unknown")
    http_status: int | None = None
    latency_ms: float | None = None
    retired_on: str | None = Field(default=None, description="ISO date from the 410 body")
    reference: str | None = None
    message: str | None = Field(default=None, max_length=MESSAGE_MAX_CHARS)
    study_role: str | None = None

    @classmethod
    def from_campaign_410(
        cls, *, campaign: str, endpoint: str, model: str, measured_at: dt.datetime,
        status_code: int | None, retired_on: str | None,
    ) -> AvailabilityRecord:
        """The event a 410 met during a campaign leaves in the availability dataset (both executors)."""
        return cls(
            checked_at=measured_at, source="campaign", endpoint=endpoint, model=model,
            status=Availability.RETIRED, http_status=status_code, retired_on=retired_on,
            message=f"410 during campaign {campaign}",
        )

    @property
    def check_date(self) -> dt.date:
        return self.checked_at.astimezone(dt.timezone.utc).date()

    @property
    def check_id(self) -> str:
        raw = "\x00".join([self.checked_at.isoformat(), self.source, self.endpoint, self.model])
        return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:32]


AVAILABILITY_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field("schema_version", pa.int32(), nullable=False),
        pa.field("check_id", pa.string(), nullable=False),
        pa.field("check_date", pa.date32(), nullable=False),
        pa.field("checked_at", TIMESTAMP, nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("endpoint", pa.string(), nullable=False),
        pa.field("base_url", pa.string()),
        pa.field("model", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("listed", pa.bool_()),
        pa.field("http_status", pa.int64()),
        pa.field("latency_ms", pa.float64()),
        pa.field("retired_on", pa.string()),
        pa.field("reference", pa.string()),
        pa.field("message", pa.string()),
        pa.field("study_role", pa.string()),
    ],
    metadata={
        VERSION_METADATA_KEY: str(AVAILABILITY_SCHEMA_VERSION).encode(),
        RECORD_METADATA_KEY: b"AvailabilityRecord",
    },
)


def availability_spec(name: str = AVAILABILITY_DATASET) -> DatasetSpec:
    return DatasetSpec(
        name=name, schema=AVAILABILITY_SCHEMA, key="check_id", partition_col="check_date",
        order_col="checked_at", version_col="schema_version",
    )


def records_to_table(records: Sequence[AvailabilityRecord]) -> pa.Table:
    rows = []
    for r in records:
        if r.checked_at.tzinfo is None:
            raise StorageError(f"availability of {r.model!r}: checked_at has no timezone; store UTC instants")
        row = r.model_dump(mode="python")
        row["status"] = r.status.value
        row["check_id"] = r.check_id
        row["check_date"] = r.check_date
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=AVAILABILITY_SCHEMA)


class AvailabilityStore:
    """Availability rows under ``root/availability/``."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.dataset = ParquetDataset(self.root, availability_spec(), fsync=fsync)

    def write(self, records: Sequence[AvailabilityRecord], *, stem: str | None = None) -> int:
        """Append ``records``; returns rows published.

        ``stem`` names the file (first writer wins): a scheduled check passes one per interval
        so a duplicated run of the same interval publishes nothing.
        """
        if not records:
            return 0
        return self.dataset.write(records_to_table(records), stem=stem).rows_written

    def read(
        self,
        *,
        models: Sequence[str] | None = None,
        sources: Sequence[str] | None = None,
        date_from: dt.date | None = None,
        date_to: dt.date | None = None,
    ) -> pa.Table:
        """Rows sorted by (model, checked_at)."""
        filters: dict[str, list[str]] = {}
        if models is not None:
            filters["model"] = list(models)
        if sources is not None:
            filters["source"] = list(sources)
        table = self.dataset.read(date_from=date_from, date_to=date_to, filters=filters)
        return table.sort_by([("model", "ascending"), ("checked_at", "ascending"), ("check_id", "ascending")])

    def timelines(self, models: Sequence[str] | None = None) -> list[ModelTimeline]:
        return timelines(self.read(models=models))

    def unavailable_models(self) -> dict[str, ModelTimeline]:
        """Models whose latest check found them gone (retired / not listed / not found): a
        dispatcher skips them; a report counts the rows resting on them since ``first_missing``."""
        return {t.model: t for t in self.timelines() if t.latest_status in MISSING}


@dataclass(frozen=True)
class ModelTimeline:
    """One model's availability history; dates are UTC check dates."""

    model: str
    checks: int
    first_checked: dt.date
    first_seen: dt.date | None  # first check that found it available (or listed)
    last_available: dt.date | None
    first_missing: dt.date | None  # first check after last_available that found it gone
    retired_on: str | None  # from the latest 410 body
    reference: str | None
    latest_status: Availability
    latest_check: dt.date


def timelines(table: pa.Table) -> list[ModelTimeline]:
    """One :class:`ModelTimeline` per model from availability rows, sorted by model."""
    by_model: dict[str, list[dict]] = {}
    for row in table.sort_by([("checked_at", "ascending"), ("check_id", "ascending")]).to_pylist():
        by_model.setdefault(row["model"], []).append(row)
    out = []
    for model in sorted(by_model):
        rows = by_model[model]
        status = [Availability(r["status"]) for r in rows]
        dates = [r["check_date"] for r in rows]
        seen = [d for r, s, d in zip(rows, status, dates) if s is Availability.AVAILABLE or r["listed"]]
        avail = [i for i, s in enumerate(status) if s is Availability.AVAILABLE]
        after = avail[-1] + 1 if avail else 0
        missing = [dates[i] for i in range(after, len(rows)) if status[i] in MISSING]
        retired = [r for r, s in zip(rows, status) if s is Availability.RETIRED]
        out.append(
            ModelTimeline(
                model=model,
                checks=len(rows),
                first_checked=dates[0],
                first_seen=seen[0] if seen else None,
                last_available=dates[avail[-1]] if avail else None,
                first_missing=missing[0] if missing else None,
                retired_on=retired[-1]["retired_on"] if retired else None,
                reference=retired[-1]["reference"] if retired else None,
                latest_status=status[-1],
                latest_check=dates[-1],
            )
        )
    return out
