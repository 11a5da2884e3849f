"""``StoreCursor`` against a real Parquet store: each look reads only new files, and ``latest``
is one row per run by the execution rule whether or not a run has several executions."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from orchestrator.distributed.store_cursor import StoreCursor
from storage.runs import RunStore, latest_executions
from tests.storage.test_storage import make_record


def rows(table) -> set[tuple]:
    return set(zip(*(table.column(c).to_pylist() for c in ("run_id", "model", "outcome", "execution_id"))))


def test_latest_is_one_row_per_run_with_and_without_repeated_executions(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "data")
    cursor = StoreCursor(store, "camp")
    store.write([make_record(i) for i in range(6)])
    store.write([make_record(i) for i in range(6, 9)])
    assert cursor.refresh() and cursor.files_read == 2 and not cursor.refresh()
    single = cursor.latest()
    assert single.num_rows == 9 and rows(single) == rows(latest_executions(store.read_executions(campaigns=["camp"])))
    # run-000003 again, finished later, with another outcome: the newer execution is the one
    later = dt.datetime(2026, 3, 1, 1, tzinfo=dt.timezone.utc)
    store.write([make_record(3, second=3600, execution_id="e-again", finished_at=later, outcome="timeout_read")])
    cursor.refresh()
    again = cursor.latest()
    assert again.num_rows == 9
    assert rows(again) == rows(latest_executions(store.read_executions(campaigns=["camp"])))
    assert ("run-000003", "model-0", "timeout_read", "e-again") in rows(again)
