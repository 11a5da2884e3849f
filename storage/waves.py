"""The ``waves/`` dataset: the measurement waves of each campaign, partitioned by ``started_date``.

A wave is a re-measurement of every planned run of a campaign (``irbench run --new-wave``). Its row
(campaign, wave, label, started_at) is written when the wave starts, first writer wins: a second
start of the same wave number keeps the first row. Wave 1 needs no row: a campaign with runs but
none has the implicit wave 1 (every campaign measured before waves existed).

Reader API: :func:`list_waves` and :func:`latest_wave`; :class:`WaveSelection` is what the readers
of runs take (``analyze``/``report``/``view`` ``--wave``), resolved per campaign by
:meth:`WaveSelection.resolve`. The runs of one wave: ``RunStore.read_table(waves=[k])``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

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


class WaveError(StorageError, ValueError):
    """A wave asked for that the store does not hold (a user error: the message says what exists)."""


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
    return next(w for w in list_waves(root, campaign) if w.wave == wave)


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


def list_waves(root: Path, campaign: str) -> list[WaveInfo]:
    """The waves of ``campaign``, oldest first; ``[]`` when it has neither runs nor a wave row."""
    return waves_of(root, [campaign]).get(campaign, [])


def latest_wave(root: Path, campaign: str) -> int:
    """The latest wave number of ``campaign`` (1 when it declared none, or has no run yet)."""
    declared = _declared(root, [campaign])
    return int(pc.max(declared["wave"]).as_py()) if declared.num_rows else 1


class WaveSelection(BaseModel):
    """Which waves a reader of runs takes: ``wave`` (one number), ``every`` wave, or, when neither
    is set, each campaign's latest wave. Parsed from ``--wave`` by :meth:`parse`."""

    model_config = ConfigDict(frozen=True)

    wave: int | None = Field(default=None, ge=1)
    every: bool = False

    @classmethod
    def parse(cls, text: str | None) -> WaveSelection:
        """``None``/``latest`` -> the latest wave, ``all`` -> every wave, ``N`` -> wave N. Raises
        WaveError for anything else."""
        value = (text or "latest").strip().lower()
        if value == "latest":
            return cls()
        if value == "all":
            return cls(every=True)
        if value.isdigit() and int(value) >= 1:
            return cls(wave=int(value))
        raise WaveError(f"--wave {text!r}: give a wave number (1, 2, …), 'latest' or 'all'")

    def describe(self) -> str:
        return "every wave" if self.every else f"wave {self.wave}" if self.wave else "the latest wave"

    def resolve(self, root: Path, campaigns: Sequence[str] | None = None) -> dict[str, list[int]] | None:
        """campaign -> the wave numbers selected, over ``campaigns`` (None: every campaign in the
        store); None for ``every`` (no filter). A number no selected campaign holds is a WaveError
        naming the waves there are."""
        if self.every:
            return None
        waves = waves_of(root, campaigns)
        if self.wave is None:
            return {c: [ws[-1].wave] for c, ws in waves.items() if ws}
        held = {c: [w.wave for w in ws] for c, ws in waves.items()}
        chosen = {c: [self.wave] for c, ws in held.items() if self.wave in ws}
        if held and not chosen:
            there = "; ".join(f"{c}: {', '.join(map(str, ws))}" for c, ws in sorted(held.items()))
            raise WaveError(f"--wave {self.wave}: the store holds no wave {self.wave} (waves: {there}); "
                            "pass one of those, 'latest' or 'all'")
        return chosen


def wave_filter(selected: dict[str, list[int]] | None) -> list[int] | None:
    """The wave numbers to push into a read (a superset when campaigns differ; None = every wave)."""
    if selected is None:
        return None
    return sorted({w for ws in selected.values() for w in ws})


def keep_selected(table: pa.Table, selected: dict[str, list[int]] | None) -> pa.Table:
    """The rows of ``table`` (``campaign`` and ``wave`` columns) in their campaign's selected waves;
    campaigns not in ``selected`` (e.g. imported cells' own) are dropped only when ``selected`` is set."""
    if selected is None or table.num_rows == 0:
        return table
    if len({tuple(ws) for ws in selected.values()}) <= 1 and set(selected) >= set(
            pc.unique(table["campaign"]).to_pylist()):
        waves = next(iter(selected.values()), [])
        return table.filter(pc.is_in(table["wave"], pa.array(waves, table.schema.field("wave").type)))
    mask = None
    for campaign, waves in selected.items():
        term = pc.and_(pc.equal(table["campaign"], campaign),
                       pc.is_in(table["wave"], pa.array(waves, table.schema.field("wave").type)))
        mask = term if mask is None else pc.or_(mask, term)
    return table.filter(mask) if mask is not None else table.slice(0, 0)
