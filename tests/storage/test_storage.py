"""Storage layer: schema round trip, atomic partitioned writes, dedupe, filters, unreadable files."""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from storage.parquet.dataset import ParquetDataset
from storage.errors import StorageError
from storage.records import SCHEMA_VERSION, Attempt, Outcome, RunRecord
from storage.runs import RunStore, file_stem_for, run_spec
from storage.schema import (
    ATTEMPT_STRUCT,
    RUN_SCHEMA,
    records_to_table,
    schema_version_of,
    table_to_records,
)
from tests.support.run_records import DAY1, DAY2, DAY3, UTC, full_record, make_record


# ---------------------------------------------------------------------------- schema


def test_schema_fields_equal_model_fields() -> None:
    assert RUN_SCHEMA.names == list(RunRecord.model_fields)
    assert [f.name for f in ATTEMPT_STRUCT] == list(Attempt.model_fields)
    assert schema_version_of(RUN_SCHEMA) == SCHEMA_VERSION
    assert RUN_SCHEMA.field("measured_at").type == pa.timestamp("us", tz="UTC")
    assert RUN_SCHEMA.field("measurement_date").type == pa.date32()


def test_round_trip_is_exact() -> None:
    records = [full_record(), make_record(2), make_record(3, attempts=[])]
    table = records_to_table(records)
    assert table.schema.equals(RUN_SCHEMA, check_metadata=True)
    back = table_to_records(table)
    assert back == records
    # the non-UTC offset is normalised to the same instant in UTC
    assert back[0].measured_at.utcoffset() == dt.timedelta(0)
    assert back[0].attempts[0].error == "slow down ünïcode"


def test_naive_datetime_is_rejected() -> None:
    rec = make_record(1, measured_at=dt.datetime(2026, 3, 1, 12))
    with pytest.raises(StorageError, match="no timezone"):
        records_to_table([rec])


def test_column_wise_conversion_is_the_row_wise_one() -> None:
    """``records_to_table`` builds columns; the table is the one each record's dict gives."""
    at = dt.datetime(2026, 3, 1, 1, tzinfo=UTC)
    many = [Attempt(attempt=n, outcome=Outcome.SERVER_ERROR, started_at=at, latency_ms=n, error="é" * n)
            for n in range(1, 4)]
    records = [
        full_record(), make_record(2, attempts=[]), make_record(3, attempts=many, latency_ms=0, finished_at=at),
        make_record(4, day=DAY2, response_text="ünï\x00code", ir_json='{"nodes":[]}', node_ids=["a", "b"],
                    parse_repairs=["stripped_fence"], temperature=1, execution_id=None),
        make_record(5, outcome=Outcome.CANCELLED, attempts=[], cancel_reason="model disabled"),
    ]
    for batch in (records, records[1:2], []):
        rows = pa.Table.from_pylist([r.model_dump(mode="python") for r in batch], schema=RUN_SCHEMA)
        assert records_to_table(batch).equals(rows, check_metadata=True)


@pytest.mark.parametrize("naive", ["finished_at", "attempt"])
def test_a_naive_datetime_anywhere_is_rejected_naming_its_run(naive: str) -> None:
    stamp = dt.datetime(2026, 3, 1, 12)
    bad = (make_record(2, finished_at=stamp) if naive == "finished_at" else
           make_record(2, attempts=[Attempt(attempt=1, outcome=Outcome.OK, started_at=stamp, latency_ms=1)]))
    with pytest.raises(StorageError, match="run 'run-000002'.*no timezone"):
        records_to_table([make_record(1), bad, make_record(3)])


def test_a_record_of_another_version_is_rejected_naming_its_run() -> None:
    with pytest.raises(StorageError, match="run 'run-000002' has schema_version=1"):
        records_to_table([make_record(1), make_record(2, schema_version=1)])


# ---------------------------------------------------------------------------- writes


def test_partition_path_and_hive_layout(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    rec = full_record()
    assert store.write([rec]) == 1
    files = store.dataset.data_files()
    assert [f.relative_to(tmp_path).as_posix() for f in files] == [
        f"runs/measurement_date=2026-03-02/{rec.run_id}.{rec.execution_id}.parquet"
    ]
    # the partition column lives in the directory name only, so a plain hive reader works
    assert "measurement_date" not in pq.read_schema(files[0]).names
    plain = ds.dataset(tmp_path / "runs", format="parquet", partitioning="hive").to_table()
    assert plain["run_id"].to_pylist() == [rec.run_id]
    assert str(plain["measurement_date"][0]) == "2026-03-02"
    # nothing but the published file is left behind
    assert [p.name for p in files[0].parent.iterdir()] == [files[0].name]


def test_batch_writes_one_file_per_date(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    recs = [make_record(i, day=[DAY1, DAY2, DAY3][i % 3]) for i in range(30)]
    assert store.write(recs) == 30
    files = store.dataset.data_files()
    assert len(files) == 3 and all(f.name.startswith("batch-") for f in files)
    assert sorted(store.read_records(), key=lambda r: r.run_id) == sorted(recs, key=lambda r: r.run_id)


def test_filters_and_projection(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    recs = [make_record(i, day=[DAY1, DAY2, DAY3][i % 3], campaign=f"c{i % 2}") for i in range(60)]
    store.write(recs[:30])
    for r in recs[30:]:
        store.write([r])

    def expect(pred) -> list[str]:
        return sorted(r.run_id for r in recs if pred(r))

    got = store.read_table(date_from=DAY2, date_to=DAY3)["run_id"].to_pylist()
    assert got == expect(lambda r: r.measurement_date >= DAY2)
    got = store.read_table(date_to=DAY1, campaigns=["c1"])["run_id"].to_pylist()
    assert got == expect(lambda r: r.measurement_date == DAY1 and r.campaign == "c1")
    got = store.read_table(models=["model-0", "model-2"], campaigns=["c0"])["run_id"].to_pylist()
    assert got == expect(lambda r: r.model in ("model-0", "model-2") and r.campaign == "c0")
    assert store.read_table(campaigns=[]).num_rows == 0
    proj = store.read_table(columns=["model", "measurement_date"])
    assert proj.column_names == ["model", "measurement_date"] and proj.num_rows == 60
    assert store.completed_run_ids("c0") == set(expect(lambda r: r.campaign == "c0"))
    assert store.date_window() == (DAY1, DAY3)
    assert store.date_window(campaign="nope") is None
    by_day = store.dataset.read(filters={"measurement_date": DAY2}, columns=["run_id"])
    assert by_day["run_id"].to_pylist() == expect(lambda r: r.measurement_date == DAY2)


def test_every_execution_kept_latest_one_read(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    first = make_record(1, second=10, finished_at=dt.datetime(2026, 3, 1, 0, 0, 11, tzinfo=UTC))
    assert store.write([first]) == 1
    assert store.write([first]) == 0  # the same execution again: loses the link race
    # a second execution of run 1 (redelivery), finished later: kept, and the one read
    later = make_record(1, second=20, outcome=Outcome.TIMEOUT_READ,
                        finished_at=dt.datetime(2026, 3, 1, 0, 0, 30, tzinfo=UTC))
    assert later.execution_id != first.execution_id
    assert store.write([later, make_record(2)]) == 2
    assert store.write([later, make_record(3)]) == 2  # a copy of `later` in another file
    assert len(store.dataset.data_files()) == 3
    assert store.dataset.read(dedupe=False).num_rows == 5
    recs = store.read_records()
    assert [r.run_id for r in recs] == ["run-000001", "run-000002", "run-000003"]
    assert recs[0] == later  # the latest execution
    assert store.count_by_outcome("camp") == {"ok": 2, "timeout_read": 1}
    execs = store.read_executions(columns=["run_id", "execution_id"])
    assert execs["run_id"].to_pylist() == ["run-000001", "run-000001", "run-000002", "run-000003"]
    assert set(execs["execution_id"].to_pylist()[:2]) == {first.execution_id, later.execution_id}
    # compaction keeps every execution and drops only the copy
    store.compact()
    assert store.dataset.read(dedupe=False).num_rows == 4
    assert store.read_records()[0] == later


def test_latest_by_finish_time_falls_back_to_start(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    # schema-1 style rows (no finished_at): the later start is the latest execution
    a = make_record(1, second=10, response_text="a")
    b = make_record(1, second=20, response_text="b")
    store.write([b])
    store.write([a])
    assert store.read_records()[0].response_text == "b"
    # a finish time wins over a later start without one
    c = make_record(1, second=5, response_text="c", finished_at=dt.datetime(2026, 3, 1, 0, 1, tzinfo=UTC))
    store.write([c])
    assert store.read_records()[0].response_text == "c"


def test_equal_finish_times_tie_on_execution_id(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    end = dt.datetime(2026, 3, 1, 0, 1, tzinfo=UTC)
    x = make_record(1, response_text="x", execution_id="f" * 32, finished_at=end)
    y = make_record(1, response_text="y", execution_id="0" * 32, finished_at=end)
    store.write([x])
    store.write([y])
    assert store.read_records()[0].response_text == "y"  # smallest execution_id


def test_schema_version_1_files_stay_readable(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    v1_fields = [f for f in RUN_SCHEMA if f.name not in ("execution_id", "finished_at")]
    v1_schema = pa.schema(v1_fields, metadata={b"irbench.schema_version": b"1", b"irbench.record": b"RunRecord"})
    rows = records_to_table([make_record(1, second=1), make_record(2)]).to_pylist()
    for r in rows:
        r["schema_version"] = 1
    table = pa.Table.from_pylist(rows, schema=v1_schema)
    pdir = store.dataset.partition_dir(DAY1)
    pdir.mkdir(parents=True)
    pq.write_table(table.drop_columns(["measurement_date"]), pdir / "old.parquet")
    new = make_record(1, second=50, response_text="new", finished_at=dt.datetime(2026, 3, 1, 1, tzinfo=UTC))
    store.write([new])
    recs = store.read_records()
    assert [r.run_id for r in recs] == ["run-000001", "run-000002"]
    assert recs[0] == new and recs[1].execution_id is None and recs[1].schema_version == 1
    assert store.read_executions().num_rows == 3


def test_dedupe_ties_break_by_file_name(tmp_path: Path) -> None:
    ds_ = ParquetDataset(tmp_path, run_spec())
    a = make_record(1, response_text="from-a")
    b = make_record(1, response_text="from-b", execution_id=a.execution_id)  # a copy: the tie goes to file "a"
    ds_.write(records_to_table([b]), stem="b")
    ds_.write(records_to_table([a]), stem="a")
    assert ds_.read()["response_text"].to_pylist() == ["from-a"]


def test_link_race_two_threads_one_file(tmp_path: Path) -> None:
    for rnd in range(5):
        store = RunStore(tmp_path / str(rnd))
        rec = make_record(rnd)
        barrier = threading.Barrier(4)
        results: list[int] = []

        def go(barrier: threading.Barrier, store: RunStore, rec: object, results: list[int]) -> None:
            barrier.wait()
            results.append(store.write([rec]))

        threads = [threading.Thread(target=go, args=(barrier, store, rec, results)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [0, 0, 0, 1]
        pdir = store.dataset.partition_dir(DAY1)
        assert [p.name for p in pdir.iterdir()] == [f"{rec.run_id}.{rec.execution_id}.parquet"]


def test_unsafe_run_id_gets_hashed_stem(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    rec = make_record(1, run_id="../evil/id")
    assert store.write([rec]) == 1 and store.write([rec]) == 0
    (f,) = store.dataset.data_files()
    assert f.name == f"{file_stem_for('../evil/id')}.{rec.execution_id}.parquet" and f.name.startswith("run-")
    assert store.read_records() == [rec]


# ---------------------------------------------------------------------------- robustness


def test_tmp_files_and_hidden_dirs_are_ignored(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    rec = make_record(1)
    store.write([rec])
    pdir = store.dataset.partition_dir(DAY1)
    name = f"run-000001.{rec.execution_id}.parquet"
    good = (pdir / name).read_bytes()
    (pdir / ".run-000002.abc.tmp").write_bytes(good[: len(good) // 2])  # a killed writer
    (tmp_path / "runs" / "_compaction").mkdir()
    (tmp_path / "runs" / "_compaction" / "junk.parquet").write_bytes(b"junk")
    assert store.completed_run_ids() == {"run-000001"}
    assert store.dataset.remove_stale_tmp(older_than_s=3600) == 0  # too young
    assert store.dataset.remove_stale_tmp(older_than_s=0, now_s=time.time() + 1) == 1
    assert [p.name for p in pdir.iterdir()] == [name]


def test_stale_manifest_tmp_of_a_killed_compactor_is_removed(tmp_path: Path) -> None:
    # a compactor SIGKILLed while writing its manifest leaves one behind
    store = RunStore(tmp_path)
    store.write([make_record(1)])
    mdir = tmp_path / "runs" / "_compaction"
    mdir.mkdir()
    (mdir / ".2026-03-01-abc.json.tmp").write_text("{")
    (mdir / "2026-03-01-def.json").write_text("{}")  # a real manifest is not a temp file
    assert store.dataset.remove_stale_tmp(older_than_s=0, now_s=time.time() + 1) == 1
    assert [p.name for p in mdir.iterdir()] == ["2026-03-01-def.json"]


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.write([make_record(1)])
    bad = store.dataset.partition_dir(DAY1) / "torn.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(StorageError, match="torn.parquet") as info:
        store.read_table()
    assert "move them out" in str(info.value)


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    table = records_to_table([make_record(1)])
    idx = table.schema.get_field_index("schema_version")
    table = table.set_column(idx, RUN_SCHEMA.field(idx), pa.array([SCHEMA_VERSION + 1], pa.int32()))
    store.dataset.write(table, stem="future")
    with pytest.raises(StorageError, match=f"version {SCHEMA_VERSION + 1}"):
        store.read_table()


def test_foreign_file_missing_required_columns_is_named(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.write([make_record(1)])
    pdir = store.dataset.partition_dir(DAY1)
    pq.write_table(pa.table({"run_id": ["x"], "schema_version": pa.array([1], pa.int32())}), pdir / "odd.parquet")
    with pytest.raises(StorageError, match="odd.parquet") as info:
        store.read_table()
    assert "required column" in str(info.value)


def test_incompatible_column_type_names_file(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.write([make_record(1)])
    pdir = store.dataset.partition_dir(DAY1)
    odd = pa.table({"run_id": pa.array([[1, 2]], pa.list_(pa.int64()))})
    pq.write_table(odd, pdir / "odd.parquet")
    with pytest.raises(StorageError, match="odd.parquet") as info:
        store.read_table()
    assert "expected string" in str(info.value)


# ---------------------------------------------------------------------------- performance


def test_batched_writes_read_back_every_run(tmp_path: Path) -> None:
    """The local executor's batch size (50 runs) over two dates: every run comes back once.
    Throughput is measured in bench/local_throughput.py, not asserted here."""
    store = RunStore(tmp_path)
    recs = [make_record(i, day=[DAY1, DAY2][i % 2], response_text="x" * 1500) for i in range(3000)]
    for j in range(0, len(recs), 50):
        store.write(recs[j : j + 50])
    table = store.read_table()
    assert table.num_rows == 3000
    assert pc.count_distinct(table["run_id"]).as_py() == 3000


def test_dedupe_without_key_sort():
    """``sort_by_key=False``: unique keys come back as they are (no copy); with a repeated key
    the rule and the result are the default ones."""
    import pyarrow as pa

    from storage.parquet.dedupe import dedupe_table

    t = pa.table({"k": ["b", "a", "c"], "o": [1, 2, 3], "v": [10, 20, 30]})
    same = dedupe_table(t, "k", "o", sort_by_key=False)
    assert same.column("k").to_pylist() == ["b", "a", "c"] and same.column("v").to_pylist() == [10, 20, 30]
    assert dedupe_table(t, "k", "o").column("k").to_pylist() == ["a", "b", "c"]
    dup = pa.table({"k": ["b", "a", "b"], "o": [5, 2, 1], "v": [10, 20, 30]})
    for sort in (True, False):
        out = dedupe_table(dup, "k", "o", sort_by_key=sort)
        assert sorted(zip(out.column("k").to_pylist(), out.column("v").to_pylist())) == [
            ("a", 20), ("b", 30)]


def test_dictionary_columns_read_equal_strings_and_file_names_come_back(tmp_path: Path) -> None:
    """``read(dictionary_columns=…)`` gives the same values as the plain read, as dictionary
    columns; ``read_files(with_filename=True)`` still names each row's file (read internally
    as an ordinal among the sorted paths)."""
    ds_ = ParquetDataset(tmp_path, run_spec())
    recs = [make_record(i) for i in range(6)]
    ds_.write(records_to_table(recs[:3]), stem="b")
    ds_.write(records_to_table(recs[3:]), stem="a")
    cols = ["run_id", "model", "campaign"]
    plain = ds_.read(columns=cols)
    packed = ds_.read(columns=cols, dictionary_columns=["model"])
    assert pa.types.is_dictionary(packed.schema.field("model").type)
    assert packed["model"].to_pylist() == plain["model"].to_pylist()
    assert packed["run_id"].to_pylist() == plain["run_id"].to_pylist()
    files = ds_.data_files()
    raw = ds_.read_files(files, dedupe=False, with_filename=True, columns=["run_id"])
    by_file = dict(zip(raw["run_id"].to_pylist(), raw["__filename"].to_pylist()))
    assert {Path(by_file[r.run_id]).stem for r in recs[:3]} == {"b"}
    assert {Path(by_file[r.run_id]).stem for r in recs[3:]} == {"a"}
    with pytest.raises(StorageError):
        ds_.read(columns=cols, dictionary_columns=["run_index"])
