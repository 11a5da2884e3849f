"""Global per-model limits under the distributed executor: are they held, and are they used?

Four simulated models with different request limits, concurrency caps and lognormal latencies
(medians 50-300 ms) run a few hundred runs on 3 ``celery worker`` processes sharing one private
redis-server. SHORT WINDOWS: the workers count ``requests_per_minute`` per 10 s
(``IRBENCH_LIMIT_PERIOD_S=10``) so the whole campaign takes about a minute; "limit" below means
requests per 10 s. Printed per model:

* ``window/limit``: the most requests the simulator saw in any sliding window of one period
  (half-open, on the simulator's clock) divided by the limit — must be <= 1.00;
* ``over``: how many windows opening at a request hold limit + 1 requests — must be 0;
* ``span/bound``: the model's first-to-last request span over ``(runs - 1) / rate``, the
  shortest span GCRA without burst allows — 1.00 means the model ran at its full rate;

and for the campaign: end-to-end makespan (dispatch to every outcome stored) divided by its
lower bound ``max over models of runs / rate`` — the aim is <= 1.10.

    python bench/rate_limits.py [--workers 3] [--threads 8] [--period-s 10] [--scale 1.0]
                                [--worker-env IRBENCH_MAX_WAIT_S=1.5 ...] [--cpu-hogs 12]

``--wire`` (default when root) also counts the same windows on the wire: kernel timestamps of
each request as it crossed the loopback interface (``simulator/wire.py``), which a starved
simulator cannot shift; and how late the simulator's own stamps were against them.

``--cpu-hogs N`` runs the campaign against N busy-loop processes at the workers' priority
(CPU starvation, load average >= 10 on 2 cores); the load average is printed either way, and
so is how often a late permit was given back and re-acquired (``permit_regranted`` in the
worker logs: its grant-to-send delay exceeded the jitter allowance).

The workers use their defaults otherwise, including the limiter's jitter allowance
(``IRBENCH_LIMIT_JITTER_ALLOWANCE_S``, 0.25 s: the limiter enforces windows of period + 0.25 s)
and slot reservations (a denied run defers with the exact countdown to its reserved slot).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import tempfile
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from _cluster import BenchCluster, interrupt_as_keyboard, sliding_window_max, write_campaign
from _load import LoadSampler, cpu_hogs

from orchestrator.campaign.prepared import prepare
from orchestrator.distributed.executor import CeleryOptions, CeleryRun, run_campaign_celery
from orchestrator.campaign.spec import load_campaign
from simulator.wire import WireCapture
from storage.runs import RunStore


@dataclass(frozen=True)
class BenchModel:
    """One simulated model: ``limit`` requests per period, ``max_concurrency`` calls at once,
    lognormal latency (``latency_ms_median``, ``latency_sigma``), ``runs`` runs in the campaign."""

    name: str
    limit: int
    max_concurrency: int
    latency_ms_median: float
    latency_sigma: float
    runs: int


# Two models (b, c) set the lower bound (40 s at scale 1); a and d have some slack, so the
# bound is tight only if a saturated model never slows the others down.
MODELS = (
    BenchModel("rl-a", limit=60, max_concurrency=3, latency_ms_median=80, latency_sigma=0.4, runs=200),
    BenchModel("rl-b", limit=30, max_concurrency=2, latency_ms_median=300, latency_sigma=0.4, runs=120),
    BenchModel("rl-c", limit=24, max_concurrency=2, latency_ms_median=150, latency_sigma=0.4, runs=96),
    BenchModel("rl-d", limit=10, max_concurrency=1, latency_ms_median=50, latency_sigma=0.4, runs=30),
)


def sim_toml(models: tuple[BenchModel, ...]) -> str:
    lines = ["seed = 3"]
    for m in models:
        lines += [f"[models.{m.name}]", f"latency_ms_median = {m.latency_ms_median}", f"latency_sigma = {m.latency_sigma}"]
    return "\n".join(lines) + "\n"


def window_table(models: tuple[BenchModel, ...], arrivals_s: dict[str, list[float]], period_s: float,
                 requests: dict[str, int]) -> None:
    """Per model: the fullest sliding window, windows over the limit and the span of the run."""
    print(f"{'model':>6} {'limit':>5} {'conc':>4} {'lat_ms':>6} {'runs':>4} {'reqs':>4} {'max_win':>7} "
          f"{'win/limit':>9} {'over':>4} {'min_span_s':>10} {'span_s':>6} {'span/bound':>10}")
    for m in models:
        arr = sorted(arrivals_s[m.name])
        rate_per_s = m.limit / period_s
        worst = sliding_window_max(arr, period_s)
        # shortest time limit+1 requests arrived in: < period means a window held too many
        spans = [arr[i + m.limit] - arr[i] for i in range(len(arr) - m.limit)]
        tight = min(spans, default=float("nan"))
        over = sum(sp < period_s for sp in spans)  # windows opening at a request that hold limit + 1
        span = arr[-1] - arr[0] if len(arr) > 1 else 0.0
        ideal = (len(arr) - 1) / rate_per_s if len(arr) > 1 else float("nan")
        print(f"{m.name:>6} {m.limit:>5} {m.max_concurrency:>4} {m.latency_ms_median:>6.0f} {m.runs:>4} "
              f"{requests[m.name]:>4} {worst:>7} {worst / m.limit:>9.2f} {over:>4} {tight:>10.3f} {span:>6.1f} "
              f"{span / ideal:>10.2f}")


def stamp_lag_line(models: tuple[BenchModel, ...], stats: dict, on_wire: dict[str, list[float]],
                   clock_offset_s: float) -> str:
    """How late the simulator stamped requests against the wire, per model: the k-th stamp minus
    the k-th wire time (both sorted; ``clock_offset_s`` = CLOCK_REALTIME - CLOCK_MONOTONIC), median
    and max in ms. Stamps that are late by different amounts are what can fill a window."""
    parts = []
    for m in models:
        stamps = sorted(a + clock_offset_s for a in stats.get(m.name, {}).get("arrivals_s", []))
        wire = on_wire.get(m.name, [])
        if len(stamps) != len(wire) or not stamps:
            parts.append(f"{m.name} n/a ({len(stamps)} stamps, {len(wire)} on the wire)")
            continue
        lags = sorted((s - w) * 1000 for s, w in zip(stamps, wire))
        parts.append(f"{m.name} {lags[len(lags) // 2]:.1f}/{lags[-1]:.1f}")
    return "simulator stamp minus wire time, median/max ms: " + ", ".join(parts)


def sim_port(base_url: str) -> int:
    return int(urllib.parse.urlsplit(base_url).port or 80)


def renice(pid: int, niceness: int) -> None:
    """Set the niceness of every thread of ``pid`` (Linux niceness is per thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.setpriority(os.PRIO_PROCESS, int(tid), niceness)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=3, help="celery worker processes")
    parser.add_argument("--threads", type=int, default=8, help="threads per worker (-c); 8 = irbench worker default")
    parser.add_argument("--period-s", type=float, default=10.0, help="IRBENCH_LIMIT_PERIOD_S on the workers")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every model's run count")
    parser.add_argument("--worker-env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra worker environment (e.g. IRBENCH_MAX_WAIT_S=3)")
    parser.add_argument("--cpu-hogs", type=int, default=0, help="busy-loop processes running alongside")
    parser.add_argument("--sim-nice", type=int, default=None,
                        help="niceness of the simulator (e.g. -10, needs root): a provider has its own CPUs, "
                             "so its arrival clock should not starve with ours")
    parser.add_argument("--wire", action=argparse.BooleanOptionalAction, default=os.geteuid() == 0,
                        help="also count windows on the wire (AF_PACKET capture on lo, needs root; default: if root)")
    args = parser.parse_args()
    models = tuple(replace(m, runs=max(2, round(m.runs * args.scale))) for m in MODELS)
    env = {"IRBENCH_LIMIT_PERIOD_S": str(args.period_s), "IRBENCH_LOG_LEVEL": "INFO"}  # INFO: deferrals are counted from the logs
    env.update(kv.split("=", 1) for kv in args.worker_env)

    with tempfile.TemporaryDirectory(prefix="irbench-bench-") as tmp, interrupt_as_keyboard():
        tmp_path = Path(tmp)
        (tmp_path / "sim.toml").write_text(sim_toml(models))
        with BenchCluster(tmp_path / "sim.toml", workers=args.workers, concurrency=args.threads, worker_env=env) as c:
            if args.sim_nice is not None:
                renice(c.sim.process.pid, args.sim_nice)
            prompts = 20
            fields = {m.name: {"requests_per_minute": m.limit, "max_concurrency": m.max_concurrency} for m in models}
            toml = write_campaign(tmp_path, "bench-rl", c.sim.base_url, fields, prompts=prompts,
                                  runs=math.ceil(max(m.runs for m in models) / prompts))
            full = prepare(load_campaign(toml))
            wanted = {m.name: m.runs for m in models}
            taken: Counter[str] = Counter()
            tasks = []
            for t in full.tasks:  # planned (interleaved) order, trimmed to each model's run count
                if taken[t.model] < wanted[t.model]:
                    taken[t.model] += 1
                    tasks.append(t)
            prepared = replace(full, tasks=tasks)
            store = RunStore(tmp_path / "data")
            print(f"limits are per {args.period_s:g} s (IRBENCH_LIMIT_PERIOD_S={args.period_s:g}), not per minute; "
                  f"{len(tasks)} runs on {args.workers} workers x {args.threads} threads", flush=True)
            clock_offset_s = time.time() - time.monotonic()
            wire = WireCapture(sim_port(c.sim.base_url)) if args.wire else None
            with cpu_hogs(args.cpu_hogs), LoadSampler() as load, wire or contextlib.nullcontext():
                t0 = time.monotonic()
                # analysis is not part of the campaign: run_campaign_celery would enqueue it after the
                # last outcome (about 2 s here), which the makespan must not include
                summary = run_campaign_celery(prepared, store, c.url,
                                              CeleryRun(options=CeleryOptions(poll_interval_s=0.1, analyze_on_complete=False)))
                makespan_s = time.monotonic() - t0
            if summary.interrupted:  # Ctrl-C / SIGTERM: the cluster is stopped on the way out
                raise SystemExit(f"interrupted after {makespan_s:.1f} s; {summary.executed}/{len(tasks)} stored")
            stats = c.sim_stats()
            logs = c.workers.logs() if c.workers else ""

    bounds = [m.runs / (m.limit / args.period_s) for m in models]
    print("simulator's stamps (its event loop's clock, when its handler got the request):")
    window_table(models, {m.name: stats.get(m.name, {}).get("arrivals_s", []) for m in models}, args.period_s,
                 {m.name: stats.get(m.name, {}).get("requests", 0) for m in models})
    if wire is not None:
        print(f"on the wire (kernel timestamps of each request's first segment on lo; {wire.drops} segments "
              f"dropped, {wire.unmatched} requests without a model):")
        on_wire = wire.arrivals_s()
        window_table(models, {m.name: on_wire.get(m.name, []) for m in models}, args.period_s,
                     {m.name: len(on_wire.get(m.name, [])) for m in models})
        print(stamp_lag_line(models, stats, on_wire, clock_offset_s))
    bound = max(bounds)
    reserved = len(re.findall(r'"reserved":\s*true', logs))  # worker logs are JSON lines
    outcomes: Counter[str] = Counter()
    for per in summary.by_model.values():
        outcomes.update(per)
    print(f"makespan {makespan_s:.1f} s, lower bound {bound:.1f} s (max over models of runs / rate), "
          f"ratio {makespan_s / bound:.2f}; outcomes {dict(outcomes)}; "
          f"deferrals (re-published runs) {logs.count('run_deferred')}, "
          f"of which with a reserved slot {reserved}; "
          f"permits given back as late {logs.count('permit_regranted')}")
    print(f"{args.cpu_hogs} busy loops alongside, simulator niceness {args.sim_nice or 0}; {load.summary()}")
    # the simulator's arrival times are CLOCK_MONOTONIC, the same clock as t0 here (Linux)
    every = [a for st in stats.values() for a in st["arrivals_s"]]
    if every:
        print(f"first request at +{min(every) - t0:.1f} s, last at +{max(every) - t0:.1f} s, "
              f"every outcome seen by the orchestrator at +{makespan_s:.1f} s")
    if summary.executed != len(tasks):
        raise SystemExit(f"campaign incomplete: {summary.executed}/{len(tasks)} stored")


if __name__ == "__main__":
    main()
