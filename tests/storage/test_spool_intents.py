"""Intents in the spool: a writer SIGKILLed mid-call leaves the record of each call in flight;
recovery publishes exactly those, once, however often and by however many processes it runs."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from storage.outcomes import Outcome
from storage.parquet.spool import RunSpool, SpoolConfig, pending_rows, recover_orphans, spool_dir
from storage.runs import RunStore
from tests.support.run_records import make_record

REPO = Path(__file__).resolve().parents[2]

#: A writer of 10 executions with max_rows=3: it intends all 10, stores records of 0-6 (three
#: segments closed and published on the way, the open intents carried out of each), resolves 9
#: without a record (its execution raised), intends a second attempt of execution 8, then
#: SIGKILLs itself: 7 and 8 are mid-call.
VICTIM = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from storage.outcomes import Outcome
    from storage.records import Attempt
    from storage.runs import RunStore
    from storage.parquet.spool import RunSpool, SpoolConfig
    from tests.support.run_records import make_record

    def died(i, attempts):
        rec = make_record(i, execution_id=f"e{i:02d}", outcome=Outcome.WORKER_DIED)
        tries = [Attempt(attempt=n, outcome=Outcome.WORKER_DIED, started_at=rec.measured_at, latency_ms=0.0)
                 for n in range(1, attempts + 1)]
        return rec.model_copy(update={"attempts": tries})

    store = RunStore(Path(sys.argv[1]))
    spool = RunSpool(store.dataset, config=SpoolConfig(max_rows=3, max_age_s=60, idle_s=60), writer="victim")
    spool.intend([died(i, 1) for i in range(10)])
    for i in range(7):
        spool.append([make_record(i, execution_id=f"e{i:02d}")])
    spool.flush()  # every segment with records is published; only the open intents remain on disk
    spool.resolve(["e09"])
    spool.intend([died(8, 2)])
    print(spool.open_intents, len(os.listdir(spool.dir)), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _kill_a_writer(root: Path) -> str:
    out = subprocess.run([sys.executable, "-c", VICTIM, str(root)], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    return out.stdout.strip()


def _executions(store: RunStore) -> Counter[str]:
    """Rows per execution id over every published file (no deduplication)."""
    seen: Counter[str] = Counter()
    for f in sorted((store.root / "runs").rglob("*.parquet")):
        if not f.name.startswith("."):
            seen.update(pq.read_table(f, columns=["execution_id"]).column("execution_id").to_pylist())
    return seen


def test_a_killed_writer_leaves_exactly_its_calls_in_flight(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    said = _kill_a_writer(tmp_path)
    assert said.split()[0] == "2"  # executions 7 and 8 unresolved at the kill
    assert pending_rows(store.dataset) == 0  # intents are not records waiting for publication
    assert recover_orphans(store.dataset) == 2
    execs = _executions(store)
    assert execs == Counter({f"e{i:02d}": 1 for i in range(9)})
    recs = {r.execution_id: r for r in store.read_records()}  # one execution per run here
    died = {e for e, r in recs.items() if r.outcome is Outcome.WORKER_DIED}
    assert died == {"e07", "e08"}
    assert len(recs["e08"].attempts) == 2  # the latest intent of an execution: every call of it
    assert list(spool_dir(store.dataset).iterdir()) == []


def test_recovery_is_idempotent_even_when_killed_half_way(tmp_path: Path) -> None:
    """A recovery killed after publishing, before deleting the segments (the segments are put
    back), and a second one: nothing is stored twice."""
    store = RunStore(tmp_path)
    _kill_a_writer(tmp_path)
    saved = tmp_path / "saved"
    shutil.copytree(spool_dir(store.dataset), saved)
    assert recover_orphans(store.dataset) == 2
    for f in saved.iterdir():  # as if the recoverer died before unlinking anything
        shutil.copy(f, spool_dir(store.dataset) / f.name)
    assert recover_orphans(store.dataset) == 0
    assert recover_orphans(store.dataset) == 0
    assert _executions(store) == Counter({f"e{i:02d}": 1 for i in range(9)})


def test_concurrent_recoverers_store_each_intent_once(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    _kill_a_writer(tmp_path)
    rows: list[int] = []
    barrier = threading.Barrier(4)

    def recover() -> None:
        barrier.wait()
        rows.append(recover_orphans(RunStore(tmp_path).dataset))

    threads = [threading.Thread(target=recover) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(rows) == 2
    assert _executions(store) == Counter({f"e{i:02d}": 1 for i in range(9)})


def test_a_live_writer_resolves_its_intents_and_leaves_none(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    spool = RunSpool(store.dataset, config=SpoolConfig(max_rows=2, max_age_s=60, idle_s=60), writer="live")
    try:
        for i in range(5):
            spool.intend([make_record(i, execution_id=f"e{i}", outcome=Outcome.WORKER_DIED)])
            spool.append([make_record(i, execution_id=f"e{i}")])
        assert spool.open_intents == 0
        assert recover_orphans(store.dataset) == 0  # its lock is held
    finally:
        spool.close()
    assert recover_orphans(store.dataset) == 0  # closed with no call in flight: nothing died
    assert {r.outcome for r in store.read_records()} == {Outcome.OK}
    assert _executions(store) == Counter({f"e{i}": 1 for i in range(5)})
