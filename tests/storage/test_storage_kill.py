"""SIGKILL a writer process at random moments: nothing it reported is lost or duplicated.

The writer (run as ``python -c``) loops over single writes, redelivered single writes,
multi-date batch writes and occasional compactions, printing ``ok <run_id>...`` after each
write returns. It is killed several times; afterwards every reported run must be readable
exactly once, every visible file must be a complete Parquet file, and leftover temp files
must be invisible.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from storage.runs import RunStore

REPO = Path(__file__).resolve().parents[2]

WRITER = r"""
import datetime as dt, random, sys
from pathlib import Path
from storage.runs import RunStore
from tests.support.run_records import make_record

root, prefix, seed = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
store = RunStore(root)
days = [dt.date(2026, 3, 1), dt.date(2026, 3, 2), dt.date(2026, 3, 3)]
singles, i, n = [], 0, 0
def rec(i):
    return make_record(i, day=rng.choice(days), run_id=f"{prefix}-{i:05d}", response_text="y" * rng.randint(0, 3000))
while True:
    n += 1
    roll = rng.random()
    if roll < 0.35:
        r = rec(i); i += 1
        store.write([r]); singles.append(r)
        out = [r.run_id]
    elif roll < 0.45 and singles:
        store.write([rng.choice(singles)])  # a redelivery: must not duplicate
        out = []
    elif roll < 0.97:
        batch = [rec(i + k) for k in range(rng.randint(2, 25))]; i += len(batch)
        store.write(batch)
        out = [r.run_id for r in batch]
    else:
        store.compact(rng.choice(days))
        out = []
    sys.stdout.write("ok " + " ".join(out) + "\n"); sys.stdout.flush()
"""


def _run_and_kill(root: Path, prefix: str, seed: int, rng: random.Random) -> list[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), prefix, str(seed)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # wait until it is writing (imports take a while)
    if not first:
        err = proc.stderr.read().decode() if proc.stderr else ""
        raise AssertionError(f"writer died before writing: {err}")
    time.sleep(rng.uniform(0.05, 0.6))
    proc.send_signal(signal.SIGKILL)
    rest, _ = proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    reported: list[str] = []
    for line in (first + rest).decode().splitlines(keepends=True):
        if line.endswith("\n") and line.startswith("ok"):  # a torn last line is not a report
            reported.extend(line.split()[1:])
    return reported


def test_sigkill_writer_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    rng = random.Random(20260301)
    reported: list[str] = []
    for cycle in range(6):
        reported += _run_and_kill(tmp_path, f"c{cycle}", rng.randrange(1 << 30), rng)
    assert len(reported) > 50, "the writer barely ran; the test proves nothing"
    assert len(reported) == len(set(reported))

    store = RunStore(tmp_path)
    # every visible file is complete (tmp files and scratch dirs are not visible)
    for f in store.dataset.data_files():
        pq.read_metadata(f)
    stored = store.read_table(columns=["run_id"])["run_id"]
    assert pc.count_distinct(stored).as_py() == len(stored)
    missing = set(reported) - set(stored.to_pylist())
    assert not missing, f"{len(missing)} reported runs lost, e.g. {sorted(missing)[:3]}"

    # a compaction (finishing any the kills interrupted) leaves one physical row per run
    store.compact()
    raw = store.dataset.read(dedupe=False, columns=["run_id"])["run_id"]
    assert pc.count_distinct(raw).as_py() == len(raw)
    assert set(reported) <= set(raw.to_pylist())
    assert not list((tmp_path / "runs").glob(".compact-*"))
    assert not list((tmp_path / "runs" / "_compaction").glob("*.json"))
    store.dataset.remove_stale_tmp(older_than_s=0, now_s=time.time() + 1)
    assert not [p for p in (tmp_path / "runs").rglob(".*.tmp")]
