"""Storage compaction: merged files keep every run once, a crash before the deletes recovers,
the partition lock is exclusive, and readers see a consistent dataset meanwhile."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow.compute as pc

from storage.parquet.compaction import (
    CompactionConfig,
    CompactionManifest,
    compact,
    partition_lock,
    write_outputs,
)
from storage.records import RunRecord
from storage.runs import RunStore
from tests.support.run_records import DAY1, DAY2, make_record


def _populate(store: RunStore) -> list[RunRecord]:
    recs = [make_record(i, day=[DAY1, DAY2][i % 2]) for i in range(80)]
    for r in recs[:20]:
        store.write([r])
    for j in range(20, 80, 10):
        store.write(recs[j : j + 10])
    store.write(recs[5:15])  # duplicates of single-written runs
    return sorted(recs, key=lambda r: r.run_id)


def test_compaction_merges_and_keeps_every_run_once(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    recs = _populate(store)
    before = store.read_table()
    n_files = len(store.dataset.data_files())
    report = store.compact()
    assert report.files_before == n_files
    assert report.files_after == 2  # one per partition
    assert report.rows_before == 90 and report.rows_after == 80
    assert all(f.name.startswith("part-") for f in store.dataset.data_files())
    assert store.dataset.read(dedupe=False).num_rows == 80
    assert store.read_table().equals(before)
    assert store.read_records() == recs
    # nothing hidden is left but locks; a second run has nothing to merge
    assert not list((tmp_path / "runs").glob(".compact-*"))
    assert not list((tmp_path / "runs" / "_compaction").glob("*.json"))
    again = store.compact(DAY1)
    assert again.partitions[0].skipped and again.files_after == 1
    # new writes after compaction are merged in by the next run
    store.write([make_record(500, day=DAY1)])
    assert store.compact(DAY1).rows_after == 41


def test_compaction_recovers_after_crash_before_deletes(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    recs = _populate(store)
    inputs = store.dataset.partition_files(DAY1)
    with partition_lock(store.dataset, DAY1) as held:
        assert held
        manifest = write_outputs(store.dataset, DAY1, CompactionConfig())  # then "crash"
    assert manifest is not None and manifest.path.is_file()
    assert CompactionManifest.load(manifest.path).inputs == tuple(p.name for p in inputs)
    on_disk = store.dataset.partition_files(DAY1)
    assert len(on_disk) == len(inputs) + 1  # outputs beside the inputs
    assert store.read_records() == recs  # readers dedupe meanwhile
    report = store.compact(DAY1)
    assert report.partitions[0].recovered
    assert [p.name for p in store.dataset.partition_files(DAY1)] == list(manifest.outputs)
    assert not manifest.path.exists()
    assert store.dataset.read(dedupe=False, date_to=DAY1).num_rows == 40
    assert store.read_records() == recs


def test_manifest_with_missing_outputs_keeps_inputs(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    recs = _populate(store)
    with partition_lock(store.dataset, DAY2):
        manifest = write_outputs(store.dataset, DAY2, CompactionConfig())
    assert manifest is not None
    for name in manifest.outputs:  # e.g. removed by hand
        (store.dataset.partition_dir(DAY2) / name).unlink()
    store.compact(DAY2)
    assert store.read_records() == recs


def test_compaction_lock_is_exclusive(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    _populate(store)
    with partition_lock(store.dataset, DAY1) as held:
        assert held
        report = compact(store.dataset, DAY1)
    assert report.partitions[0].skipped == "another compactor holds the lock"
    assert report.files_after == report.files_before > 1


def test_reads_during_concurrent_writes_and_compaction(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    reader = RunStore(tmp_path)  # a separate handle, as another process would have
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            i = 0
            while not stop.is_set():
                store.write([make_record(i + k, day=DAY1) for k in range(5)])
                store.write([make_record(i + 5, day=DAY1)])
                i += 6
                if i % 60 == 0:  # compact often (real life: hourly)
                    store.compact(DAY1)
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        seen = 0
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            ids = reader.completed_run_ids()
            table = reader.read_table(columns=["run_id"])
            assert table.num_rows >= seen  # runs never disappear
            assert table.num_rows == pc.count_distinct(table["run_id"]).as_py()
            assert len(ids) >= seen
            seen = table.num_rows
    finally:
        stop.set()
        worker.join()
    assert not errors, errors
    assert seen > 0
