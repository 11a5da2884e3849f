"""``campaign_scale.py --stop-after-s``: a campaign too large to finish, measured on its way in.

From the moment the orchestrator starts planning (the corpus read, the store scanned for what is
done) it is stopped after ``--stop-after-s``; until then a watcher polls the simulator's request
count and the store's file list. Figures: seconds to the first call the simulator received and to
the first stored run, runs stored by the stop, the orchestrator's peak RSS (this process: the
local executor runs here, and so does the distributed executor's orchestrator) and then
``irbench status`` of the campaign in a child process (wall seconds and that child's peak RSS).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from storage.runs import RunStore

# Runs the command and prints "<wall s> <peak RSS KiB of its child>". A launcher because Linux
# starts a child's ru_maxrss at the RSS of the process it was forked from.
MEASURE = """import resource, subprocess, sys, time
t0 = time.perf_counter()
rc = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True)
sys.exit(rc)
"""


def measured_child(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of ``cmd`` run in a child of a small launcher."""
    proc = subprocess.run([sys.executable, "-c", MEASURE, *cmd], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[2:4])} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    wall, rss_kib = proc.stdout.split()[-2:]
    return float(wall), float(rss_kib) / 1024  # Linux: KiB


def self_rss_mib() -> float:
    """Peak RSS of this process so far (MiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


@dataclass(frozen=True)
class WindowFigures:
    label: str
    planned: int
    stop_after_s: float
    first_call_s: float  # nan: no call before the stop
    first_stored_s: float  # nan: no stored run before the stop
    stored: int
    orchestrator_rss_mib: float
    status_s: float
    status_rss_mib: float


class FirstEvents:
    """Polls ``calls()`` and the store's data files every ``poll_s`` from ``t0`` on and keeps the
    seconds to the first call and to the first published file."""

    def __init__(self, calls: Callable[[], int], store: RunStore, t0: float, poll_s: float = 0.05) -> None:
        self._calls, self._store, self._t0, self._poll_s = calls, store, t0, poll_s
        self.first_call_s = float("nan")
        self.first_stored_s = float("nan")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="first-events", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self._poll_s):
            now = time.perf_counter() - self._t0
            if self.first_call_s != self.first_call_s:  # nan: not seen yet
                try:
                    if self._calls() > 0:
                        self.first_call_s = now
                except OSError:
                    pass
            if self.first_stored_s != self.first_stored_s and self._store.dataset.data_files():
                self.first_stored_s = now
            if self.first_call_s == self.first_call_s and self.first_stored_s == self.first_stored_s:
                return

    def __enter__(self) -> FirstEvents:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def interrupt_after(seconds: float) -> threading.Timer:
    """A started timer that sends this process SIGINT after ``seconds``: the executor's event loop
    takes it as Ctrl-C (it stops, stores what it finished and returns ``interrupted``)."""
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.daemon = True
    timer.start()
    return timer


def stored_rows(store: RunStore) -> int:
    total = 0
    for f in store.dataset.data_files():
        try:
            total += pq.read_metadata(f).num_rows
        except (OSError, ValueError):
            continue
    return total


def status_of(campaign_toml: Path, data: Path, max_planned_runs: int) -> tuple[float, float]:
    """``irbench status`` (the table, store only) in a child: (wall seconds, peak RSS MiB)."""
    return measured_child([sys.executable, "-m", "orchestrator.cli.app", "status", str(campaign_toml),
                           "--data", str(data), "--max-planned-runs", str(max_planned_runs)])


def print_window_table(rows: list[WindowFigures]) -> None:
    print(f"{'executor':>14} {'planned':>10} {'stop_s':>6} {'1st_call_s':>10} {'1st_store_s':>11} {'stored':>8} "
          f"{'orch_MiB':>8} {'status_s':>8} {'status_MiB':>10}")
    for f in rows:
        print(f"{f.label:>14} {f.planned:>10} {f.stop_after_s:>6.0f} {f.first_call_s:>10.1f} {f.first_stored_s:>11.1f} "
              f"{f.stored:>8} {f.orchestrator_rss_mib:>8.0f} {f.status_s:>8.1f} {f.status_rss_mib:>10.0f}")
    sys.stdout.flush()
