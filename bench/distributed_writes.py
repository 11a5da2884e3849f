"""Storage and completion figures of the distributed executor at campaign scale.

One zero-latency campaign (``--models`` x ``--prompts`` x ``--runs``) on ``--workers`` celery
workers x ``--threads`` threads, a private redis-server and the simulator in its own process.
Prints: runs/s; published files and files per 100 runs; bytes on disk per run before and after
compaction; executions vs runs (duplicates); completion lag = the orchestrator's return minus the
``finished_at`` of the last stored run (same machine clock); how many store files the
orchestrator read in total (its incremental cursor) and the load average.

    python bench/distributed_writes.py [--models 10 --prompts 100 --runs 20] [--workers 4] [--threads 8]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import tempfile
import time
from pathlib import Path

import pyarrow.compute as pc
from _cluster import BenchCluster, interrupt_as_keyboard, write_campaign

from orchestrator.campaign.prepared import prepare
from orchestrator.distributed.executor import CeleryOptions, CeleryRun, run_campaign_celery
from orchestrator.campaign.spec import load_campaign
from storage.runs import RunStore


def disk_bytes(store: RunStore) -> int:
    return sum(f.stat().st_size for f in store.dataset.data_files())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--runs", type=int, default=20, help="runs per prompt x model cell")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    from workers.logs import configure_logging

    configure_logging(level="WARNING")
    env = {"IRBENCH_LOG_LEVEL": "WARNING"}
    with tempfile.TemporaryDirectory(prefix="irbench-bench-") as tmp, interrupt_as_keyboard():
        tmp_path = Path(tmp)
        models = [f"w{i:02d}" for i in range(args.models)]
        (tmp_path / "sim.toml").write_text("seed = 1\n" + "".join(f"[models.{m}]\n" for m in models))
        with BenchCluster(tmp_path / "sim.toml", workers=args.workers, concurrency=args.threads, worker_env=env) as c:
            fields = {m: {"max_concurrency": args.threads * args.workers} for m in models}
            path = write_campaign(tmp_path, "scale", c.sim.base_url, fields, prompts=args.prompts, runs=args.runs)
            prepared = prepare(load_campaign(path))
            store = RunStore(tmp_path / "data")
            n = len(prepared.tasks)
            print(f"{n} runs: {args.models} models x {args.prompts} prompts x {args.runs} runs; "
                  f"{args.workers} workers x {args.threads} threads; load average {os.getloadavg()}", flush=True)
            t0 = time.perf_counter()
            summary = run_campaign_celery(prepared, store, c.url,
                                          CeleryRun(timeout_s=3600, options=CeleryOptions(analyze_on_complete=False)))
            returned = dt.datetime.now(dt.timezone.utc)
            elapsed = time.perf_counter() - t0
            calls = sum(m["requests"] for m in c.sim_stats().values())
        execs = store.read_executions(columns=["run_id", "finished_at"])
        last = pc.max(execs.column("finished_at")).as_py()
        files = len(store.dataset.data_files())
        before = disk_bytes(store)
        store.compact()
        after = disk_bytes(store)
        print(f"stored {summary.executed}/{n} runs in {elapsed:.1f} s: {n / elapsed:.1f} runs/s "
              f"(interrupted={summary.interrupted})")
        print(f"files: {files} ({100 * files / n:.2f} per 100 runs)")
        print(f"bytes per run on disk: {before / n:.0f} B = {before / n / 1024:.2f} KiB before compaction, "
              f"{after / n:.0f} B after")
        print(f"executions {execs.num_rows} for {n} runs ({execs.num_rows - n} duplicates); calls {calls}")
        print(f"completion lag (return - last finished_at): {(returned - last).total_seconds():.2f} s")
        print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
