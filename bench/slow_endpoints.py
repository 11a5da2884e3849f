"""Slow endpoints: makespan against its lower bound, local executor and 4 celery workers.

20 simulated models each answering in 2 s (``latency_ms_median = 2000``, lognormal sigma 0.01),
each allowing 50 calls at once (``max_concurrency = 50``, no rate cap): 1,000 calls allowed at
once. 10,000 runs (20 models x 100 prompts x 5 runs). The lower bound of the makespan is
runs x latency / calls allowed at once = 20 s. In ONE invocation: the simulator in its own
process, a private redis-server on a free port, 4 real ``celery worker`` processes (deploy's
``CeleryWorkers``, the default threads and worker settings: no run-slot or memory-budget
override unless given), then the local executor (``run_local``, in this process, default options).

Printed per executor: makespan, bound, ratio (makespan / bound), the most requests the
simulator had open at once (from its ``/_stats`` exchanges), and for the workers each one's
peak RSS (``VmHWM`` of ``/proc/<pid>/status``), its RSS when idle after a warm-up campaign, and
the RSS one call in flight costs: (peak - idle) / (peak calls in flight / workers). That last
figure is what ``workers.celery.runtime``'s per-call memory estimate comes from.

    python bench/slow_endpoints.py [--runs 10000] [--latency-ms 2000] [--models 20] [--cap 50]
                                   [--workers 4] [--memory-budget-mib N] [--run-slots N] [--no-local]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))
PROMPTS = 100


def status_kib(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` figure in KiB (``VmRSS``, ``VmHWM``: peak RSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, all its threads (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_open(stats: dict[str, Any]) -> int:
    """Most requests the simulator held open at once, over every model (from the exchanges)."""
    events = []
    for s in stats.values():
        for arrived, replied, *_ in s["exchanges"]:
            events += [(arrived, 1), (replied, -1)]
    events.sort(key=lambda e: (e[0], e[1]))  # a reply before an arrival at the same instant
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def open_over_time(stats: dict[str, Any], step_s: float) -> list[int]:
    """Requests open at the simulator every ``step_s`` from the first arrival to the last reply."""
    spans = [(a, r) for s in stats.values() for a, r, *_ in s["exchanges"]]
    if not spans:
        return []
    t0, t1 = min(a for a, _ in spans), max(r for _, r in spans)
    return [sum(1 for a, r in spans if a <= t < r) for t in [t0 + step_s * k for k in range(int((t1 - t0) / step_s) + 1)]]


def campaign(tmp: Path, name: str, base_url: str, args: argparse.Namespace, runs_per_cell: int, prompts: int) -> Any:
    from _cluster import write_campaign

    from orchestrator.campaign.prepared import prepare
    from orchestrator.campaign.spec import load_campaign

    models = {f"slow{i:02d}": {"max_concurrency": args.cap} for i in range(args.models)}
    path = write_campaign(tmp, name, base_url, models, prompts=prompts, runs=runs_per_cell)
    return prepare(load_campaign(path))


def report(label: str, span_s: tuple[float, float], bound_s: float, stats: dict[str, Any]) -> None:
    """``span_s``: ``time.monotonic()`` at the start and end (the simulator stamps on the same clock)."""
    started_s, seconds = span_s[0], span_s[1] - span_s[0]
    spans = [(a, r) for s in stats.values() for a, r, *_ in s["exchanges"]]
    first, last = min(a for a, _ in spans) - started_s, max(r for _, r in spans) - started_s
    print(f"{label}: makespan {seconds:.1f} s, bound {bound_s:.1f} s, ratio {seconds / bound_s:.2f}, "
          f"peak calls in flight {peak_open(stats)}; first call at {first:.1f} s, last answer at {last:.1f} s",
          flush=True)
    print(f"  calls in flight every second: {' '.join(str(n) for n in open_over_time(stats, 1.0))}", flush=True)


def run_celery(c: Any, tmp: Path, args: argparse.Namespace, bound_s: float) -> None:
    from orchestrator.distributed.executor import CeleryOptions, CeleryRun, run_campaign_celery
    from storage.runs import RunStore

    def once(name: str, prepared: Any) -> tuple[float, float]:
        t0 = time.monotonic()
        opts = CeleryOptions(analyze_on_complete=False).with_values(max_outstanding=args.max_outstanding)
        s = run_campaign_celery(prepared, RunStore(tmp / f"data-{name}"), c.url, CeleryRun(options=opts, timeout_s=900))
        if s.executed != len(prepared.tasks) or s.interrupted:
            raise SystemExit(f"{name}: {s.executed}/{len(prepared.tasks)} stored, interrupted={s.interrupted}")
        return t0, time.monotonic()

    once("warm", campaign(tmp, "slow-warm", c.sim.base_url, args, 1, 5))  # imports, pools, first connections
    pids = [p.pid for p in c.workers.procs if p is not None]
    idle = [status_kib(p, "VmRSS") for p in pids]
    c.sim_reset()
    prepared = campaign(tmp, "slow-celery", c.sim.base_url, args, args.runs // (args.models * PROMPTS), PROMPTS)
    parts = {"workers": pids, "simulator": [c.sim.process.pid], "redis": [c.redis._proc.pid], "orchestrator": [os.getpid()]}
    cpu0 = {k: sum(cpu_s(p) for p in v) for k, v in parts.items()}
    span_s = once("celery", prepared)
    cpu = {k: sum(cpu_s(p) for p in v) - cpu0[k] for k, v in parts.items()}
    stats = c.sim_stats()
    if args.stats_json:
        Path(args.stats_json).write_text(json.dumps(stats))
    peak = peak_open(stats)
    hwm = [status_kib(p, "VmHWM") for p in pids]
    report(f"celery, {len(pids)} workers", span_s, bound_s, stats)
    print("  CPU seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
          + f" (of {os.cpu_count()} cores x {span_s[1] - span_s[0]:.1f} s)", flush=True)
    for i, (h, r) in enumerate(zip(hwm, idle)):
        print(f"  worker {i}: peak RSS {h / 1024:.0f} MiB, idle RSS {r / 1024:.0f} MiB", flush=True)
    per_worker = peak / len(pids)
    if per_worker:
        cost = (max(hwm) - min(idle)) / per_worker
        print(f"  RSS per call in flight: {cost:.0f} KiB ((max peak - min idle) / ({peak} / {len(pids)}))", flush=True)


def run_local_executor(c: Any, tmp: Path, args: argparse.Namespace, bound_s: float) -> None:
    from orchestrator.local.executor import LocalOptions, run_event_loop, run_local
    from storage.runs import RunStore

    c.sim_reset()
    prepared = campaign(tmp, "slow-local", c.sim.base_url, args, args.runs // (args.models * PROMPTS), PROMPTS)
    rss0 = status_kib(os.getpid(), "VmRSS")
    started_s = time.monotonic()
    s = run_event_loop(run_local(prepared.tasks, RunStore(tmp / "data-local"), secrets={}, options=LocalOptions()))
    span_s = (started_s, time.monotonic())
    if s.executed != len(prepared.tasks):
        raise SystemExit(f"local: {s.executed}/{len(prepared.tasks)} stored")
    report("local executor", span_s, bound_s, c.sim_stats())
    print(f"  this process: RSS {rss0 / 1024:.0f} MiB before, peak {status_kib(os.getpid(), 'VmHWM') / 1024:.0f} MiB",
          flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--latency-ms", type=float, default=2000.0)
    p.add_argument("--models", type=int, default=20)
    p.add_argument("--cap", type=int, default=50, help="each model's max_concurrency")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--threads", type=int, default=None, help="threads per worker (default: the workers' DEFAULT_THREADS)")
    p.add_argument("--memory-budget-mib", type=int, default=None, help="IRBENCH_MEMORY_BUDGET_MIB (default: the workers')")
    p.add_argument("--run-slots", type=int, default=None, help="IRBENCH_RUN_SLOTS (default: the workers')")
    p.add_argument("--max-outstanding", type=int, default=None, help="CeleryOptions.max_outstanding (default: its own)")
    p.add_argument("--stats-json", default=None, help="write the simulator's /_stats of the celery campaign here")
    p.add_argument("--no-local", dest="local", action="store_false")
    p.add_argument("--no-celery", dest="celery", action="store_false")
    args = p.parse_args()
    sys.path.insert(0, str(HERE))
    from _cluster import BenchCluster, interrupt_as_keyboard

    from workers.celery import DEFAULT_THREADS
    from workers.logs import configure_logging

    configure_logging(level="WARNING")
    env = {"IRBENCH_LOG_LEVEL": "WARNING"}  # an INFO line per run costs CPU on 2 shared cores
    if args.memory_budget_mib is not None:
        env["IRBENCH_MEMORY_BUDGET_MIB"] = str(args.memory_budget_mib)
    if args.run_slots is not None:
        env["IRBENCH_RUN_SLOTS"] = str(args.run_slots)
    runs = args.runs // (args.models * PROMPTS) * args.models * PROMPTS
    bound_s = runs * args.latency_ms / 1000 / (args.models * args.cap)
    print(f"{runs} runs, {args.models} models x max_concurrency {args.cap}, latency {args.latency_ms:.0f} ms: "
          f"bound {bound_s:.1f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="irbench-slow-") as tmp, interrupt_as_keyboard():
        tmp_path = Path(tmp)
        sim = "".join(f"[models.slow{i:02d}]\nlatency_ms_median = {args.latency_ms}\nlatency_sigma = 0.01\n"
                      for i in range(args.models))
        (tmp_path / "sim.toml").write_text("seed = 1\n" + sim)
        workers = args.workers if args.celery else 0
        with BenchCluster(tmp_path / "sim.toml", workers=workers, concurrency=args.threads or DEFAULT_THREADS, worker_env=env) as c:
            if args.celery:
                run_celery(c, tmp_path, args, bound_s)
            if args.local:
                run_local_executor(c, tmp_path, args, bound_s)


if __name__ == "__main__":
    main()
