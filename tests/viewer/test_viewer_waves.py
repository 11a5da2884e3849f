"""The viewer indexes the runs of one wave selection: each campaign's latest by default."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from storage.runs import RunStore
from storage.wave_selection import WaveSelection
from storage.waves import record_wave
from tests.support.run_records import UTC, make_record
from viewer.index import RunIndex


def test_the_index_holds_the_selected_waves_runs(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.write([make_record(i) for i in range(3)])
    store.write([make_record(i, run_id=f"w2-{i}", wave=2) for i in range(2)])
    record_wave(tmp_path, "camp", 2, None, dt.datetime(2026, 4, 1, tzinfo=UTC))
    counts = {}
    for text in ("latest", "1", "2", "all"):
        index = RunIndex.load(tmp_path, waves=WaveSelection.parse(text))
        try:
            counts[text] = index.n_runs
        finally:
            index.close()
    assert counts == {"latest": 2, "1": 3, "2": 2, "all": 5}


def test_the_other_waves_runs_are_held_for_cells_and_comparisons(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.write([make_record(i) for i in range(3)])
    store.write([make_record(i, run_id=f"w2-{i}", wave=2) for i in range(2)])
    record_wave(tmp_path, "camp", 2, "again", dt.datetime(2026, 4, 1, tzinfo=UTC))
    index = RunIndex.load(tmp_path)  # the latest wave only, on the pages
    try:
        assert index.n_runs == 2 and index.run("run-000000") is not None  # a wave-1 run is still found
        assert index.runs_per_wave("camp") == {1: 3, 2: 2}
        assert [(w.wave, w.label) for w in index.waves["camp"]] == [(1, None), (2, "again")]
        table = index.wave_table("camp", [1, 2], ["run_id", "wave", "no_such_column"])
        assert table.column_names == ["run_id", "wave"]
        assert table["run_id"].to_pylist() == sorted(table["run_id"].to_pylist())
        assert table.num_rows == 5
    finally:
        index.close()
