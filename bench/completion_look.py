"""The distributed orchestrator's last store look on a real campaign's store, beside a whole-store look.

The orchestrator confirms completion against the store through ``StoreCursor``. It refreshes the
cursor every ``reconcile_interval_s`` while runs are pending, so the end reads only what was
published since the last look; a cursor first refreshed when Redis says every run is done would
read every file of the campaign in that one look. This replays a finished store's publication: its
data files are hard-linked, in modification-time order, into a scratch store, ``--interval-s``
of publication at a time, and the cursor refreshes after each step, as during a campaign.
Printed, side by side in one run:

* **one look over everything**: a fresh cursor's ``refresh()`` of the whole store;
* **the last incremental look** (the orchestrator's end look): the cursor's ``refresh()`` after the last step,
  i.e. the files of the last ``--interval-s`` of publication only;
* ``latest()`` (the summary table) after each, and once more with the execution rule's sort
  (which ``latest()`` skips when every run has one row); the peak RSS of this process.

    python bench/completion_look.py STORE CAMPAIGN [--interval-s 5]

e.g. ``STORE`` = ``data-celery`` of ``campaign_scale.py --keep DIR`` (campaign ``scale-celery``).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from _cluster import REPO  # noqa: F401 - puts the repo on sys.path

from orchestrator.distributed.store_cursor import StoreCursor
from storage.runs import RunStore, latest_executions


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def replay(src: RunStore, campaign: str, scratch: Path, interval_s: float) -> tuple[int, float, int, float]:
    """Publish ``src``'s files into ``scratch`` ``interval_s`` of mtime at a time, refreshing a cursor
    after each step. Returns (steps, seconds of the last refresh, files it read, seconds of latest())."""
    files = sorted(src.dataset.data_files(), key=lambda f: f.stat().st_mtime)
    dst = RunStore(scratch)
    cursor = StoreCursor(dst, campaign)
    steps, i, last_s, last_files = 0, 0, 0.0, 0
    while i < len(files):
        until = files[i].stat().st_mtime + interval_s
        j = i
        while j < len(files) and files[j].stat().st_mtime < until:
            rel = files[j].relative_to(src.root)
            (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
            os.link(files[j], scratch / rel)
            j += 1
        before = cursor.files_read
        t0 = time.perf_counter()
        cursor.refresh()
        last_s, last_files = time.perf_counter() - t0, cursor.files_read - before
        steps, i = steps + 1, j
    t0 = time.perf_counter()
    cursor.latest()
    return steps, last_s, last_files, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store", type=Path)
    parser.add_argument("campaign")
    parser.add_argument("--interval-s", type=float, default=5.0, help="publication per step (reconcile_interval_s)")
    args = parser.parse_args()
    src = RunStore(args.store)
    n_files = len(src.dataset.data_files())
    print(f"{args.store}: {n_files} data files; {load()}", flush=True)

    with tempfile.TemporaryDirectory(prefix="irbench-look-", dir=args.store.parent) as tmp:
        steps, last_s, last_files, latest_new_s = replay(src, args.campaign, Path(tmp), args.interval_s)
    rss_new = rss_mib()
    print(f"incremental: {steps} looks of {args.interval_s:g} s of publication; {load()}", flush=True)

    cursor = StoreCursor(src, args.campaign)
    t0 = time.perf_counter()
    cursor.refresh()
    all_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rows = cursor.latest().num_rows
    latest_now_s = time.perf_counter() - t0
    # the summary table with the execution rule's sort over every row (skipped when each run has one row)
    t0 = time.perf_counter()
    latest_executions(pa.concat_tables(cursor._tables))
    latest_old_s = time.perf_counter() - t0
    print(f"\n{'end look':>28} {'files read':>10} {'refresh_s':>9} {'latest_s':>8} {'peak_rss_MiB':>12}")
    print(f"{'new: last incremental look':>28} {last_files:>10} {last_s:>9.2f} {latest_new_s:>8.2f} {rss_new:>12.0f}")
    print(f"{'old: one look over all':>28} {cursor.files_read:>10} {all_s:>9.2f} {latest_old_s:>8.2f} {rss_mib():>12.0f}")
    print(f"latest() now {latest_now_s:.2f} s (one row per run: no sort) against {latest_old_s:.2f} s with the sort")
    print(f"{rows} runs; refresh ratio old/new {all_s / max(last_s, 1e-9):.0f}x; {load()}")


if __name__ == "__main__":
    main()
