"""The ``waves/`` dataset: the measurement waves of each campaign, partitioned by ``started_date``.

A wave is a re-measurement of every planned run of a campaign (``irbench run --new-wave``). Its row
(campaign, wave, label, started_at) is written when the wave starts, first writer wins: a second
start of the same wave number keeps the first row. Wave 1 needs no row: a campaign with runs but
none has the implicit wave 1 (every campaign measured before waves existed).

Reader API: :func:`list_waves` (every wave, implicit wave 1 included), :func:`declared_waves` and
:func:`latest_wave`; ``storage.wave_selection.WaveSelection`` is what the readers of runs take
(``analyze``/``report``/``view`` ``--wave``). The runs of one wave: ``RunStore.read_table(waves=[k])``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from storage.errors import StorageError
from storage.parquet.dataset import DatasetSpec, ParquetDataset
from storage.records import SERVED_IDENTITY_MAX_CHARS
from storage.schema import RECORD_METADATA_KEY, TIMESTAMP, VERSION_METADATA_KEY

WAVES_DATASET = "waves"
WAVE_SCHEMA_VERSION = 1
#: Longest ``--wave-label`` kept (a label is a note, not a document).
WAVE_LABEL_MAX_CHARS = SERVED_IDENTITY_MAX_CHARS

WAVE_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field("schema_version", pa.int32(), nullable=False),
        pa.field("wave_key", pa.string(), nullable=False),
        pa.field("started_date", pa.date32(), nullable=False),
        pa.field("campaign", pa.string(), nullable=False),
        pa.field("wave", pa.int32(), nullable=False),
        pa.field("label", pa.string()),
        pa.field("started_at", TIMESTAMP, nullable=False),
    ],
    metadata={VERSION_METADATA_KEY: str(WAVE_SCHEMA_VERSION).encode(), RECORD_METADATA_KEY: b"WaveRow"},
)

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")



@dataclass(frozen=True)
class WaveInfo:
    """One wave of one campaign. ``started_at``: UTC; for an implicit wave 1, its first run's
    ``measured_at`` (None when the campaign has no run yet). ``label``: ``--wave-label`` or None."""

    campaign: str
    wave: int
    label: str | None
    started_at: dt.datetime | None


def wave_spec(name: str = WAVES_DATASET) -> DatasetSpec:
    """The dataset description of wave rows (key: campaign and wave; the first start wins)."""
    return DatasetSpec(name=name, schema=WAVE_SCHEMA, key="wave_key", partition_col="started_date",
                       order_col="started_at", version_col="schema_version")


def wave_key(campaign: str, wave: int) -> str:
    """Deterministic key of one (campaign, wave): 32 hex chars."""
    return hashlib.sha256(f"{campaign}\x00{wave}".encode()).hexdigest()[:32]


def _stem(campaign: str, wave: int) -> str:
    return f"wave-{_SAFE.sub('_', campaign)[:80]}-{wave}-{wave_key(campaign, wave)[:8]}"


def record_wave(root: Path, campaign: str, wave: int, label: str | None, started_at: dt.datetime) -> WaveInfo:
    """Store the start of ``wave`` of ``campaign`` (first writer wins) and return the stored wave.
    ``started_at`` must be timezone-aware; ``label`` is cut to :data:`WAVE_LABEL_MAX_CHARS`."""
    if started_at.utcoffset() is None:
        raise StorageError(f"wave {wave} of {campaign!r}: started_at has no timezone; store a UTC instant")
    if wave < 1:
        raise StorageError(f"wave {wave} of {campaign!r}: waves count from 1")
    label = label[:WAVE_LABEL_MAX_CHARS] if label else None
    row = {"schema_version": WAVE_SCHEMA_VERSION, "wave_key": wave_key(campaign, wave),
           "started_date": started_at.astimezone(dt.UTC).date(), "campaign": campaign, "wave": wave,
           "label": label, "started_at": started_at}
    table = pa.Table.from_pylist([row], schema=WAVE_SCHEMA)
    ParquetDataset(Path(root), wave_spec()).write(table, stem=_stem(campaign, wave))
    return next(w for w in declared_waves(root, campaign) if w.wave == wave)


def declared_rows(root: Path, campaigns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The ``waves/`` rows (campaign, wave, label, started_at) of ``campaigns`` (None = all)."""
    return _declared(root, campaigns).to_pylist()


def _declared(root: Path, campaigns: Sequence[str] | None) -> pa.Table:
    dataset = ParquetDataset(Path(root), wave_spec(), fsync=False)
    filters = {"campaign": list(campaigns)} if campaigns is not None else None
    return dataset.read(filters=filters, columns=["campaign", "wave", "label", "started_at"])


def _first_runs(root: Path, campaigns: Sequence[str] | None) -> dict[str, dt.datetime]:
    """campaign -> first ``measured_at`` of its wave-1 runs (campaigns with runs only)."""
    from storage.runs import RunStore

    table = RunStore(Path(root), fsync=False).read_table(campaigns=campaigns, waves=[1],
                                                         columns=["campaign", "measured_at"])
    if table.num_rows == 0:
        return {}
    grouped = table.group_by("campaign").aggregate([("measured_at", "min")])
    return dict(zip(grouped["campaign"].to_pylist(), grouped["measured_at_min"].to_pylist()))


def waves_of(root: Path, campaigns: Sequence[str] | None = None) -> dict[str, list[WaveInfo]]:
    """Every campaign's waves (of ``campaigns``, or all with runs or declared waves), oldest first."""
    declared = _declared(root, campaigns)
    out: dict[str, list[WaveInfo]] = {}
    for row in declared.to_pylist():
        out.setdefault(row["campaign"], []).append(
            WaveInfo(row["campaign"], row["wave"], row["label"], row["started_at"]))
    first = _first_runs(root, campaigns)
    for campaign in set(first) | set(out):
        waves = out.setdefault(campaign, [])
        if not any(w.wave == 1 for w in waves):
            waves.append(WaveInfo(campaign, 1, None, first.get(campaign)))
        waves.sort(key=lambda w: w.wave)
    return out


def declared_waves(root: Path, campaign: str) -> list[WaveInfo]:
    """The waves of ``campaign`` with a ``waves/`` row (started by ``--new-wave``), oldest first."""
    rows = _declared(root, [campaign]).to_pylist()
    return sorted((WaveInfo(r["campaign"], r["wave"], r["label"], r["started_at"]) for r in rows),
                  key=lambda w: w.wave)


def list_waves(root: Path, campaign: str) -> list[WaveInfo]:
    """The waves of ``campaign``, oldest first; ``[]`` when it has neither runs nor a wave row."""
    return waves_of(root, [campaign]).get(campaign, [])


def latest_wave(root: Path, campaign: str) -> int:
    """The latest wave number of ``campaign`` (1 when it declared none, or has no run yet)."""
    declared = _declared(root, [campaign])
    return int(pc.max(declared["wave"]).as_py()) if declared.num_rows else 1
