"""The group-commit spool: durable appends, few files, orphan recovery after SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from storage.runs import RunStore
from storage.parquet.spool import RunSpool, SpoolConfig, pending_rows, recover_orphans, spool_dir
from tests.support.run_records import make_record

REPO = Path(__file__).resolve().parents[2]


def test_concurrent_appends_share_files_and_every_record_is_published(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    spool = RunSpool(store.dataset, config=SpoolConfig(max_rows=100, max_age_s=60, idle_s=60), writer="w1")
    n_threads, per_thread = 8, 50

    def work(t: int) -> None:
        for i in range(per_thread):
            spool.append([make_record(t * 1000 + i)])

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spool.flush()
    files = store.dataset.data_files()
    assert len(files) == 4  # 400 records, 100 per segment
    assert len(store.completed_run_ids()) == n_threads * per_thread
    assert store.dataset.read(dedupe=False).num_rows == n_threads * per_thread
    assert not [p for p in spool_dir(store.dataset).iterdir() if p.suffix == ".jsonl"]
    spool.close()
    assert list(spool_dir(store.dataset).iterdir()) == []


def test_idle_segment_is_published_promptly(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    spool = RunSpool(store.dataset, config=SpoolConfig(max_rows=1000, max_age_s=60, idle_s=0.2))
    try:
        spool.append([make_record(1), make_record(2)])
        assert pending_rows(store.dataset) == 2
        deadline = time.monotonic() + 10
        # Publishing writes the Parquet file first and unlinks the segment after it (a crash
        # in between leaves a duplicate that reads dedupe, never a loss): wait for both.
        while len(store.completed_run_ids()) < 2 or pending_rows(store.dataset):
            assert time.monotonic() < deadline, "idle segment never published"
            time.sleep(0.05)
        assert len(store.dataset.data_files()) == 1
    finally:
        spool.close()


def test_live_writer_is_not_recovered(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    spool = RunSpool(store.dataset, config=SpoolConfig(max_rows=1000, max_age_s=60, idle_s=60))
    try:
        spool.append([make_record(1)])
        assert recover_orphans(store.dataset) == 0  # its lock is held
        assert store.completed_run_ids() == set()
    finally:
        spool.close()
    assert store.completed_run_ids() == {"run-000001"}  # close published it


WRITER = textwrap.dedent(
    """
    import sys, threading
    from pathlib import Path
    from storage.runs import RunStore
    from storage.parquet.spool import RunSpool, SpoolConfig
    from tests.support.run_records import make_record
    store = RunStore(Path(sys.argv[1]))
    spool = RunSpool(store.dataset, config=SpoolConfig(max_rows=40, max_age_s=60, idle_s=60), writer="victim")
    lock = threading.Lock()
    def work(t):
        for i in range(100000):
            rec = make_record(t * 1000000 + i)
            spool.append([rec])
            with lock:
                print(rec.run_id, flush=True)  # acknowledged: durable from here on
    for t in range(4):
        threading.Thread(target=work, args=(t,), daemon=True).start()
    threading.Event().wait()
    """
)


def test_sigkilled_writer_loses_no_acknowledged_record(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    out = tmp_path / "acked.txt"
    with open(out, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], cwd=REPO, stdout=fh,
                                start_new_session=True)
        try:
            # Wait for 300 acknowledgement *lines*: a byte count would undercount them, since run
            # ids differ in length ("run-000001\n" is 11 bytes, "run-1000000\n" 12).
            deadline = time.monotonic() + 20
            while out.read_bytes().count(b"\n") < 300:
                assert proc.poll() is None, "the writer died before being killed"
                assert time.monotonic() < deadline, "the writer acknowledged < 300 records in 20 s"
                time.sleep(0.05)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    # Only newline-terminated lines are acknowledgements (a line cut by the kill is not one).
    text = out.read_text()
    acked = set(text[: text.rfind("\n") + 1].split())
    assert len(acked) >= 300
    recovered = recover_orphans(store.dataset)
    assert recovered > 0  # the victim's open segment held acknowledged records
    stored = store.completed_run_ids()
    assert acked <= stored, f"{len(acked - stored)} acknowledged records lost"
    rows = store.dataset.read(dedupe=False, columns=["run_id"]).num_rows
    assert rows == len(stored)  # nothing published twice
    assert recover_orphans(store.dataset) == 0  # idempotent
    # files: 40 records each, plus the recovered tail segments
    assert len(store.dataset.data_files()) <= len(stored) / 40 + 2


@pytest.mark.parametrize("compact_first", [False, True])
def test_compaction_runs_next_to_a_live_spool(tmp_path: Path, compact_first: bool) -> None:
    store = RunStore(tmp_path)
    spool = RunSpool(store.dataset, config=SpoolConfig(max_rows=20, max_age_s=60, idle_s=0.05))
    stop = threading.Event()
    written: list[str] = []

    def work() -> None:
        i = 0
        while not stop.is_set():
            rec = make_record(i)
            spool.append([rec])
            written.append(rec.run_id)
            i += 1

    t = threading.Thread(target=work)
    t.start()
    try:
        for _ in range(5):
            if compact_first:
                store.compact()
            time.sleep(0.1)
            store.compact()
    finally:
        stop.set()
        t.join()
        spool.close()
    store.compact()
    assert store.completed_run_ids() == set(written)
    assert store.dataset.read(dedupe=False).num_rows == len(written)
