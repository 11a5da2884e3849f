"""The explicit, versioned Arrow schema of :class:`storage.records.RunRecord`.

Written by hand, never inferred from data: an inferred schema silently drops columns that a
later file adds and changes type with the first file it sees (research notes, section 4.1).
Evolution rule: only additive, nullable changes; bump ``storage.records.SCHEMA_VERSION`` and
the reader refuses files from a *newer* version instead of misreading them.

Conversions:
  * enums are stored as their string values; lists of strings as ``list<string>``;
  * timestamps as ``timestamp[us, tz=UTC]`` (naive datetimes are rejected: they are ambiguous);
  * ``measurement_date`` as ``date32``;
  * ``attempts`` as ``list<struct<...>>`` with one struct field per :class:`Attempt` field.
"""

from __future__ import annotations

import datetime as dt
import itertools
import operator
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pydantic import ValidationError

from storage.errors import StorageError
from storage.records import SCHEMA_VERSION, RunRecord

#: Arrow schema-metadata key holding the schema version (bytes of the decimal integer).
VERSION_METADATA_KEY = b"irbench.schema_version"
#: Arrow schema-metadata key naming the record type, so a file is self-describing.
RECORD_METADATA_KEY = b"irbench.record"

TIMESTAMP = pa.timestamp("us", tz="UTC")

ATTEMPT_STRUCT = pa.struct(
    [
        pa.field("attempt", pa.int64(), nullable=False),
        pa.field("outcome", pa.string(), nullable=False),
        pa.field("started_at", TIMESTAMP, nullable=False),
        pa.field("latency_ms", pa.float64(), nullable=False),
        pa.field("status_code", pa.int64()),
        pa.field("bytes_received", pa.int64(), nullable=False),
        pa.field("retry_after_s", pa.float64()),
        pa.field("error", pa.string()),
    ]
)


def _f(name: str, type_: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable)


RUN_FIELDS: list[pa.Field] = [
    _f("schema_version", pa.int32(), False),
    _f("run_id", pa.string(), False),
    _f("campaign", pa.string(), False),
    _f("panel", pa.string(), False),
    _f("prompt_sha256", pa.string(), False),
    _f("prompt_name", pa.string(), False),
    _f("prompt_license", pa.string()),
    _f("prompt_source", pa.string()),
    _f("model", pa.string(), False),
    _f("endpoint", pa.string(), False),
    _f("wire_format", pa.string(), False),
    _f("budget_max_tokens", pa.int64()),
    _f("run_index", pa.int64(), False),
    _f("max_tokens", pa.int64()),
    _f("temperature", pa.float64()),
    _f("reasoning_enabled", pa.bool_()),
    _f("structured_output", pa.bool_(), False),
    _f("stream", pa.bool_()),
    _f("connect_timeout_s", pa.float64()),
    _f("read_timeout_s", pa.float64()),
    _f("total_timeout_s", pa.float64()),
    _f("instruction_version", pa.string(), False),
    _f("instruction_sha256", pa.string(), False),
    _f("measured_at", TIMESTAMP, False),
    _f("measurement_date", pa.date32(), False),
    _f("date_is_window", pa.bool_(), False),
    _f("outcome", pa.string(), False),
    _f("cancel_reason", pa.string()),
    _f("attempts", pa.list_(pa.field("item", ATTEMPT_STRUCT, nullable=False)), False),
    _f("latency_ms", pa.float64()),
    _f("total_latency_ms", pa.float64()),  # added in version 2; null in older files
    _f("status_code", pa.int64()),
    _f("finish_reason", pa.string()),
    _f("retired_on", pa.string()),
    _f("response_text", pa.string()),
    _f("reasoning_text", pa.string()),
    _f("answer_chars", pa.int64(), False),
    _f("reasoning_chars", pa.int64(), False),
    _f("prompt_tokens", pa.int64()),
    _f("completion_tokens", pa.int64()),
    _f("reasoning_tokens", pa.int64()),
    _f("first_token_ms", pa.float64()),
    _f("stream_duration_ms", pa.float64()),
    _f("parse_outcome", pa.string(), False),
    _f("parse_repairs", pa.list_(pa.field("item", pa.string(), nullable=False)), False),
    _f("ir_json", pa.string()),
    _f("node_ids", pa.list_(pa.field("item", pa.string(), nullable=False)), False),
    _f("node_count", pa.int64(), False),
    _f("duplicate_id_count", pa.int64(), False),
    _f("irbench_version", pa.string(), False),
    # schema version 2 (nullable: version 1 files lack them)
    _f("execution_id", pa.string()),
    _f("finished_at", TIMESTAMP),
    # schema version 3 (nullable: older files lack them; ``wave`` reads as 1 there, see NULL_DEFAULTS)
    _f("wave", pa.int32()),
    _f("wave_started_at", TIMESTAMP),
    _f("served_model", pa.string()),
    _f("system_fingerprint", pa.string()),
    _f("served_digest", pa.string()),
]

#: Columns whose null (a row of an older schema version) reads as a value: readers fill it, and a
#: filter on the column matches such rows as if they held it.
NULL_DEFAULTS: tuple[tuple[str, object], ...] = (("wave", 1),)

RUN_SCHEMA: pa.Schema = pa.schema(
    RUN_FIELDS,
    metadata={
        VERSION_METADATA_KEY: str(SCHEMA_VERSION).encode(),
        RECORD_METADATA_KEY: b"RunRecord",
    },
)

_DATETIME_FIELDS = ("measured_at",)
_ATTEMPTS_TYPE = RUN_SCHEMA.field("attempts").type
_TZINFO = operator.attrgetter("tzinfo")


def schema_version_of(schema: pa.Schema) -> int | None:
    """The version stored in ``schema``'s metadata, or ``None`` if it carries none."""
    meta = schema.metadata or {}
    raw = meta.get(VERSION_METADATA_KEY)
    return int(raw) if raw is not None else None


def _check_aware(record: RunRecord) -> None:
    stamps: list[tuple[str, dt.datetime]] = [(f, getattr(record, f)) for f in _DATETIME_FIELDS]
    for name in ("finished_at", "wave_started_at"):
        stamp = getattr(record, name)
        if stamp is not None:
            stamps.append((name, stamp))
    stamps += [(f"attempts[{a.attempt}].started_at", a.started_at) for a in record.attempts]
    for name, value in stamps:
        if value.tzinfo is None or value.utcoffset() is None:
            raise StorageError(
                f"run {record.run_id!r}: {name}={value.isoformat()} has no timezone; "
                "store UTC instants, e.g. datetime.now(timezone.utc)"
            )


def _check(records: Sequence[RunRecord], columns: dict[str, list[Any]], attempts: list[Any]) -> None:
    """Every record of this schema version, every timestamp timezone-aware; the first record
    that is not is named (a check per column: the records are walked only to name it)."""
    if any(version != SCHEMA_VERSION for version in columns["schema_version"]):
        record = next(r for r in records if r.schema_version != SCHEMA_VERSION)
        raise StorageError(
            f"run {record.run_id!r} has schema_version={record.schema_version}, but this "
            f"writer produces version {SCHEMA_VERSION}; rebuild the record with the current "
            "storage.records.RunRecord"
        )
    finished = [stamp for stamp in [*columns["finished_at"], *columns["wave_started_at"]] if stamp is not None]
    zones = {*map(_TZINFO, columns["measured_at"]), *map(_TZINFO, finished), *(a.started_at.tzinfo for a in attempts)}
    if not all(isinstance(zone, dt.timezone) for zone in zones):  # a fixed offset is never naive
        for record in records:
            _check_aware(record)


def _columns(models: Sequence[Any], schema: pa.Schema | pa.StructType) -> dict[str, list[Any]]:
    """One list per field of ``schema``: each model's field values (pydantic keeps them in its
    ``__dict__``) taken with one ``itemgetter`` call and transposed by ``zip``, both in C."""
    names = [field.name for field in schema]
    rows = list(map(operator.itemgetter(*names), map(vars, models)))
    return {name: list(column) for name, column in zip(names, zip(*rows))} if rows else {n: [] for n in names}


def _attempts_array(per_record: list[list[Any]], attempts: list[Any]) -> pa.Array:
    offsets = [0, *itertools.accumulate(map(len, per_record))]
    columns = _columns(attempts, ATTEMPT_STRUCT)
    fields = [pa.array(columns[f.name], type=f.type) for f in ATTEMPT_STRUCT]
    structs = pa.StructArray.from_arrays(fields, fields=list(ATTEMPT_STRUCT))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), structs, type=_ATTEMPTS_TYPE)


def records_to_table(records: Sequence[RunRecord]) -> pa.Table:
    """Convert records to a table with exactly :data:`RUN_SCHEMA` (row order preserved).

    Built a column at a time (one list and one ``pa.array`` per field): ~5 us per record less
    than dumping every record to a dict and converting the rows (bench/writer_cpu.py measures this).
    Raises StorageError for naive datetimes or records from another schema version.
    """
    columns = _columns(records, RUN_SCHEMA)
    attempts = [a for per_record in columns["attempts"] for a in per_record]
    _check(records, columns, attempts)
    try:
        arrays = [
            _attempts_array(columns["attempts"], attempts) if field.name == "attempts"
            else pa.array(columns[field.name], type=field.type)
            for field in RUN_SCHEMA
        ]
        return pa.Table.from_arrays(arrays, schema=RUN_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:  # a value the schema does not describe
        raise StorageError(
            f"cannot convert RunRecord to the Arrow schema (version {SCHEMA_VERSION}): {exc}; "
            "update storage/schema.py to match storage/records.py"
        ) from exc


def table_to_records(table: pa.Table) -> list[RunRecord]:
    """Convert a table with :data:`RUN_SCHEMA` columns back to records (exact inverse).

    Extra columns (e.g. partition fields) are ignored. Raises StorageError naming the run if a
    row does not validate, or if a row was written by a newer schema version.
    """
    names = [f.name for f in RUN_SCHEMA if f.name in table.column_names]
    missing = set(RUN_SCHEMA.names) - set(names)
    if missing:
        raise StorageError(
            f"table lacks RunRecord columns {sorted(missing)}; read it without a column projection"
        )
    out: list[RunRecord] = []
    for row in table.select(names).to_pylist():
        version = row.get("schema_version")
        if version is not None and version > SCHEMA_VERSION:
            raise StorageError(
                f"run {row.get('run_id')!r} was written with schema version {version}; this "
                f"irbench reads versions <= {SCHEMA_VERSION}: upgrade irbench"
            )
        for name, value in NULL_DEFAULTS:
            if row.get(name) is None:
                row[name] = value
        try:
            out.append(RunRecord.model_validate(row))
        except ValidationError as exc:
            raise StorageError(f"stored run {row.get('run_id')!r} does not validate: {exc}") from exc
    return out
