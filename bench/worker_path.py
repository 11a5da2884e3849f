"""A Celery worker's run path without Celery, against the local executor, in one process: CPU per run.

``distributed_throughput.py`` measures the whole distributed system; this isolates what a worker
process does per run once a message is in hand: ``workers.celery.tasks.run_message`` on a real
``WorkerRuntime`` (its event loop, run slots, claims and done markers on a private
redis-server, the group-commit spool with its fsyncs, the spool's Parquet publisher) — no
broker, no kombu consumer, no orchestrator. Next to it, in the same invocation and on the same
zero-latency simulator, ``run_local`` (the local executor: its event loop and its writer
process) executes the same tasks at the same concurrency. Both run in this process, so the
figures are this process's CPU (user + system, all threads, plus the local executor's writer
child once reaped) per run, and runs/s; the two alternate ``--repeats`` times (these 2-core
machines drift by ±20 % between consecutive runs).

    python bench/worker_path.py [--runs 4000] [--slots 8,32] [--per-message 64] [--repeats 2] [--gc 0,10000]

``--gc``: the workers' ``gc_young_threshold`` values to measure (``workers.gc_policy``; the
collector is put back to Python's defaults before every measurement, the local one included).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _cluster  # noqa: F401 - puts the repo root on sys.path (`python bench/x.py` puts bench/ first)
from distributed_throughput import MODEL, campaign

from deploy.redis_server import RedisServer
from orchestrator.local.executor import LocalOptions, run_event_loop, run_local
from simulator.server import start_subprocess
from storage.runs import RunStore
from workers.state.campaign_state import CampaignState
from workers.celery.runtime import RuntimeHolder, WorkerSettings
from workers.celery.tasks import run_message
from workers.logs import configure_logging
from workers.runtask import ModelLimits, RunTask



def cpu_s() -> float:
    """User + system CPU seconds of this process and its reaped children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def tasks_for(tmp: Path, name: str, base_url: str, runs: int) -> list[RunTask]:
    """``distributed_throughput.py``'s campaign (one unlimited model), dated today as a
    dispatched run is."""
    today = dt.date.today()
    return [t.model_copy(update={"measured_on": today}) for t in campaign(tmp, name, base_url, runs, 1000).tasks]


def default_collector() -> None:
    """Python's own collector settings (a runtime made earlier in this process tuned them)."""
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)


def warm_runtime(redis_url: str, tasks: list[RunTask], data: Path, slots: int,
                 gc_young_threshold: int) -> tuple[RuntimeHolder, list[RunTask]]:
    """A worker runtime with the campaign's runs dispatched (as the orchestrator records them
    before publishing) and its first 64 run (connections, spool, imports); returns it and the
    runs left to time."""
    settings = WorkerSettings(redis_url=redis_url, run_slots=slots, gc_young_threshold=gc_young_threshold)
    holder = RuntimeHolder(redis_url, settings)
    state = CampaignState(holder.get().redis, tasks[0].campaign)
    state.done.set_planned({MODEL: len(tasks)})
    state.queued.record(t.run_id for t in tasks)
    run_message(holder, "bench", tasks[:64], str(data))
    return holder, tasks[64:]


def run_all(holder: RuntimeHolder, tasks: list[RunTask], data: Path, per_message: int) -> None:
    """``run_message`` over ``tasks``, ``per_message`` runs a call; every run must end ``ok``."""
    for i in range(0, len(tasks), per_message):
        results = run_message(holder, "bench", tasks[i : i + per_message], str(data))
        if any(r != "ok" for r in results):
            raise SystemExit(f"worker path: a run ended {sorted(set(results))}")


def worker_path(redis_url: str, tasks: list[RunTask], data: Path, slots: int, per_message: int,
                gc_young_threshold: int) -> tuple[float, float]:
    """(seconds, CPU seconds) of ``run_message`` over ``tasks``, ``per_message`` runs a call."""
    default_collector()
    holder, timed = warm_runtime(redis_url, tasks, data, slots, gc_young_threshold)
    c0, t0 = cpu_s(), time.perf_counter()
    run_all(holder, timed, data, per_message)
    seconds, cpu = time.perf_counter() - t0, cpu_s() - c0
    holder.close()
    return seconds, cpu


def local_path(tasks: list[RunTask], data: Path, concurrency: int) -> tuple[float, float]:
    """(seconds, CPU seconds, writer child included) of ``run_local`` over ``tasks``."""
    tasks = [t.model_copy(update={"limits": ModelLimits(max_concurrency=concurrency)}) for t in tasks]
    default_collector()
    run_event_loop(run_local(tasks[:64], RunStore(data / "warm"), secrets={}, options=LocalOptions()))
    store = RunStore(data / "timed")
    c0, t0 = cpu_s(), time.perf_counter()
    summary = run_event_loop(run_local(tasks[64:], store, secrets={}, options=LocalOptions()))
    seconds, cpu = time.perf_counter() - t0, cpu_s() - c0
    if summary.executed != len(tasks) - 64:
        raise SystemExit(f"local: {summary.executed}/{len(tasks) - 64} stored")
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=4000)
    parser.add_argument("--slots", default="8,32", help="comma-separated: the worker's run slots (= local concurrency)")
    parser.add_argument("--per-message", type=int, default=64, help="runs handed to run_message at once")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--gc", default="10000", help="comma-separated: the workers' gc_young_threshold (0: Python's)")
    args = parser.parse_args()
    configure_logging(level="WARNING")
    load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    rows: dict[tuple[str, int], list[tuple[float, float]]] = {}
    # (label, the workers' gc_young_threshold; None: the local executor)
    kinds: list[tuple[str, int | None]] = [(f"worker gc{g}", int(g)) for g in args.gc.split(",")] + [("local", None)]
    n = 0
    with tempfile.TemporaryDirectory(prefix="irbench-wp-") as tmp, RedisServer() as srv:
        tmp_path = Path(tmp)
        (tmp_path / "sim.toml").write_text(f"seed = 1\n[models.{MODEL}]\n")
        with start_subprocess(tmp_path / "sim.toml") as sim:
            for rep in range(args.repeats):
                for slots in (int(x) for x in args.slots.split(",")):
                    for kind, gc_young in kinds:
                        name = f"wp-{kind.replace(' ', '-')}-{slots}-{rep}"
                        tasks = tasks_for(tmp_path / name, name, sim.base_url, args.runs + 64)
                        n = len(tasks) - 64
                        data = tmp_path / name / "data"
                        got = (local_path(tasks, data, slots) if gc_young is None
                               else worker_path(srv.url, tasks, data, slots, args.per_message, gc_young))
                        rows.setdefault((kind, slots), []).append(got)
                        print(f"repeat {rep + 1} {kind} x{slots}: {n / got[0]:.1f} runs/s, "
                              f"{1000 * got[1] / n:.3f} ms CPU/run", file=sys.stderr, flush=True)
    print(f"\n{n} timed runs per measurement; load average before {load}, after "
          + "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print(f"{'path':>12} {'slots':>5} | {'runs/s (median)':>15} {'CPU ms/run':>10} | each repeat (runs/s, CPU ms/run)")
    for (kind, slots), got in rows.items():
        rates, cpus = [n / s for s, _ in got], [1000 * c / n for _, c in got]
        each = ", ".join(f"{r:.0f}/{c:.3f}" for r, c in zip(rates, cpus))
        print(f"{kind:>12} {slots:>5} | {statistics.median(rates):>15.1f} {statistics.median(cpus):>10.3f} | {each}")


if __name__ == "__main__":
    main()
