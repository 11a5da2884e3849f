"""End-to-end throughput of the distributed executor against the local one, runs/second.

Zero-latency simulator (its own process), no rate limits, a concurrency cap far above what is
used: the figures are irbench's own per-run cost. Measured in ONE invocation, same campaign
shape each time: the local executor (``run_local`` on ``run_event_loop``, in this process), then
``run_campaign_celery`` with 1, 2 and 4 ``celery worker`` processes (threads pool) on a private
redis-server. Each worker set gets a small warm-up campaign first (worker start-up, imports,
connection pools), which is not timed. The distributed path's cost per run is reported as
``ms/run`` minus the local executor's ``ms/run`` (wall time per run, i.e. inverse throughput).

    python bench/distributed_throughput.py [--runs 600] [--workers 1,2,4] [--threads 8]
                                           [--local-concurrency 16] [--runs-per-message 1,8]

``--runs-per-message``: each worker set runs the timed campaign once per value (the
orchestrator's ``runs_per_message``: runs carried by one broker message).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from _cluster import BenchCluster, interrupt_as_keyboard, write_campaign

from orchestrator.campaign import PreparedCampaign, prepare
from orchestrator.celery_executor import CeleryOptions, run_campaign_celery
from orchestrator.local import LocalOptions, run_event_loop, run_local
from orchestrator.spec import load_campaign
from storage.runs import RunStore
from workers.runtask import ModelLimits

MODEL = "tp-zero"
PROMPTS = 20


def campaign(tmp: Path, name: str, base_url: str, runs: int, cap: int) -> PreparedCampaign:
    """``runs`` runs (rounded up to a multiple of the prompt count) of one unlimited model."""
    per_cell = max(1, -(-runs // PROMPTS))
    fields = {MODEL: {"max_concurrency": cap}}
    return prepare(load_campaign(write_campaign(tmp, name, base_url, fields, prompts=PROMPTS, runs=per_cell)))


def time_celery(c: BenchCluster, prepared: PreparedCampaign, store: RunStore, runs_per_message: int = 1) -> float:
    opts = CeleryOptions(poll_interval_s=0.05, analyze_on_complete=False, runs_per_message=runs_per_message)  # analysis on the workers would overlap the next timing
    t0 = time.perf_counter()
    summary = run_campaign_celery(prepared, store, c.url, options=opts, timeout_s=600)
    elapsed = time.perf_counter() - t0
    n = len(prepared.tasks)
    if summary.executed != n or summary.interrupted:
        raise SystemExit(f"{prepared.spec.name}: {summary.executed}/{n} stored, interrupted={summary.interrupted}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=600)
    parser.add_argument("--workers", default="1,2,4", help="worker process counts to measure")
    parser.add_argument("--threads", type=int, default=8, help="threads per worker (-c)")
    parser.add_argument("--local-concurrency", type=int, default=16, help="coroutines of the local executor")
    parser.add_argument("--runs-per-message", default="1", help="comma-separated: runs per broker message to measure")
    args = parser.parse_args()
    levels = [int(x) for x in args.workers.split(",")]
    per_message = [int(x) for x in args.runs_per_message.split(",")]
    cap = max(args.local_concurrency, args.threads * max(levels)) * 2  # never the bottleneck
    from workers.logs import configure_logging

    configure_logging(level="WARNING")
    load_before = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    env = {"IRBENCH_LOG_LEVEL": "WARNING"}  # per-run INFO lines cost CPU on a 2-core box
    rows: list[tuple[str, int, float]] = []
    with tempfile.TemporaryDirectory(prefix="irbench-bench-") as tmp, interrupt_as_keyboard():
        tmp_path = Path(tmp)
        (tmp_path / "sim.toml").write_text(f"seed = 1\n[models.{MODEL}]\n")
        with BenchCluster(tmp_path / "sim.toml", workers=0, concurrency=args.threads, worker_env=env) as c:
            base = c.sim.base_url
            # local executor: warm-up, then timed
            local_opts = LocalOptions()
            for name, n in (("tp-local-warm", 60), ("tp-local", args.runs)):
                prepared = campaign(tmp_path, name, base, n, cap)
                tasks = [t.model_copy(update={"limits": ModelLimits(max_concurrency=args.local_concurrency)})
                         for t in prepared.tasks]
                store = RunStore(tmp_path / f"data-{name}")
                t0 = time.perf_counter()
                summary = run_event_loop(run_local(tasks, store, secrets={}, options=local_opts))
                elapsed = time.perf_counter() - t0
                if summary.executed != len(tasks):
                    raise SystemExit(f"{name}: {summary.executed}/{len(tasks)} stored")
            rows.append((f"local x{args.local_concurrency}", len(tasks), elapsed))
            print(f"local executor ({args.local_concurrency} coroutines): {len(tasks) / elapsed:.1f} runs/s", flush=True)
            for level in levels:
                c.restart_workers(level)
                warm = campaign(tmp_path, f"tp-w{level}-warm", base, 20 * level * args.threads // 4, cap)
                time_celery(c, warm, RunStore(tmp_path / f"data-w{level}-warm"))
                for k in per_message:
                    prepared = campaign(tmp_path, f"tp-w{level}-k{k}", base, args.runs, cap)
                    elapsed = time_celery(c, prepared, RunStore(tmp_path / f"data-w{level}-k{k}"), k)
                    rows.append((f"celery {level}x{args.threads} k{k}", len(prepared.tasks), elapsed))
                    print(f"celery, {level} worker(s) x {args.threads} threads, {k} run(s)/message: "
                          f"{len(prepared.tasks) / elapsed:.1f} runs/s", flush=True)

    local_ms = 1000 * rows[0][2] / rows[0][1]
    one, five, fifteen = os.getloadavg()
    print(f"\nload average before {load_before}, after {one:.2f} {five:.2f} {fifteen:.2f}")
    print(f"{'executor':>18} {'runs':>5} {'seconds':>8} {'runs/s':>7} {'x_local':>7} {'ms/run':>7} {'overhead_ms/run':>15}")
    for label, n, elapsed in rows:
        ms = 1000 * elapsed / n
        over = "-" if label.startswith("local") else f"{ms - local_ms:+.2f}"
        print(f"{label:>18} {n:>5} {elapsed:>8.2f} {n / elapsed:>7.1f} {local_ms / ms:>7.2f} {ms:>7.2f} {over:>15}")


if __name__ == "__main__":
    main()
