"""Waves in the store: schema-3 columns, old stores read as wave 1, the ``waves/`` dataset and the
reader API (``list_waves``, ``latest_wave``, ``WaveSelection``, ``RunStore.read_table(waves=…)``)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage.runs import RunStore
from storage.schema import RUN_SCHEMA, VERSION_METADATA_KEY
from storage.wave_selection import WaveError, WaveSelection
from storage.waves import WaveInfo, latest_wave, list_waves, record_wave
from tests.support.run_records import DAY1, UTC, make_record

V3_COLUMNS = ["wave", "wave_started_at", "served_model", "system_fingerprint", "served_digest"]


def _write_v2_store(root: Path, n: int) -> None:
    """``n`` runs in a file exactly as schema version 2 wrote it (no v3 columns, version 2 metadata)."""
    table = pa.Table.from_pylist([make_record(i, schema_version=2).model_dump() for i in range(n)], schema=RUN_SCHEMA)
    meta = {**RUN_SCHEMA.metadata, VERSION_METADATA_KEY: b"2"}
    part = root / "runs" / f"measurement_date={DAY1.isoformat()}"
    part.mkdir(parents=True)
    old = table.drop_columns(V3_COLUMNS + ["measurement_date"]).replace_schema_metadata(meta)
    pq.write_table(old, part / "batch-v2.parquet")


def test_a_v2_store_reads_as_wave_1_with_no_served_identity(tmp_path: Path) -> None:
    _write_v2_store(tmp_path, 4)
    store = RunStore(tmp_path)
    table = store.read_table()
    assert table["wave"].to_pylist() == [1, 1, 1, 1]
    assert table["served_model"].null_count == 4
    assert store.read_table(waves=[1]).num_rows == 4  # a filter matches the filled value
    assert store.read_table(waves=[2]).num_rows == 0
    assert [r.wave for r in store.read_records()] == [1, 1, 1, 1]
    assert list_waves(tmp_path, "camp") == [WaveInfo("camp", 1, None, make_record(0).measured_at)]
    assert latest_wave(tmp_path, "camp") == 1


def test_waves_are_recorded_first_writer_wins_and_filter_reads(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    started = dt.datetime(2026, 4, 1, 12, tzinfo=UTC)
    store.write([make_record(i) for i in range(3)])
    store.write([make_record(i, run_id=f"w2-{i}", wave=2, wave_started_at=started,
                             served_model="m-2026", system_fingerprint="fp_b") for i in range(2)])
    assert record_wave(tmp_path, "camp", 2, "after the update", started).label == "after the update"
    record_wave(tmp_path, "camp", 2, "a second start", started + dt.timedelta(hours=1))
    waves = list_waves(tmp_path, "camp")
    assert [(w.wave, w.label, w.started_at) for w in waves] == [
        (1, None, make_record(0).measured_at), (2, "after the update", started)]
    assert latest_wave(tmp_path, "camp") == 2 and latest_wave(tmp_path, "other") == 1
    two = store.read_table(waves=[2], columns=["run_id", "wave", "system_fingerprint", "wave_started_at"])
    assert two["run_id"].to_pylist() == ["w2-0", "w2-1"]
    assert set(two["system_fingerprint"].to_pylist()) == {"fp_b"}
    assert store.read_table(waves=[1]).num_rows == 3 and store.read_table().num_rows == 5


def test_wave_selection_resolves_per_campaign_and_refuses_a_missing_wave(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.write([make_record(0), make_record(1, campaign="b"),
                 make_record(2, run_id="b2", campaign="b", wave=2)])
    record_wave(tmp_path, "b", 2, None, dt.datetime(2026, 4, 1, tzinfo=UTC))
    table = store.read_table()

    def kept(text: str | None) -> list[str]:
        selected = WaveSelection.parse(text).resolve(tmp_path)
        return sorted((selected.keep(table) if selected else table)["run_id"].to_pylist())

    assert kept(None) == ["b2", "run-000000"]  # each campaign's latest wave
    assert kept("latest") == kept(None) and kept("all") == ["b2", "run-000000", "run-000001"]
    assert kept("1") == ["run-000000", "run-000001"] and kept("2") == ["b2"]
    assert WaveSelection.parse("2").resolve(tmp_path).numbers() == [2]  # type: ignore[union-attr]
    with pytest.raises(WaveError, match=r"no wave 5 \(waves: b: 1, 2\)"):
        WaveSelection.parse("5").resolve(tmp_path)
    with pytest.raises(WaveError, match="give a wave number"):
        WaveSelection.parse("first")
