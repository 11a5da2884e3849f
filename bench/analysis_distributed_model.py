"""How ``analyze --executor celery`` scales with the data on several machines, by simulation from
costs measured here.

Measures, in this process and in one run on the same store: the local analysis (``run_analysis``,
what one machine reading all runs does), the plan (key columns), each map task (read its files,
``summarise_part``, write the summaries: seconds, input bytes, summary bytes) and the reduce
(read summaries, merge, cross-part statistics, write). Then models K machines, each holding
its share of the runs on ``--cores`` cores (the map work re-cut into K·cores equal parts), the
summaries shipped to the reducing machine over ``--gbit`` Gbit/s, then the reduce:

    wall(K) = startup + plan + dispatch + map_s / (K cores) + summary_bytes / bandwidth + reduce
    local   = startup + local analysis

and, for comparison, shared storage without locality (each map reads its input over the same
link). ``startup`` is a fresh interpreter importing the CLI and the analysis (measured) and
``dispatch`` the Celery round trips (``--dispatch-s``, default the orchestrator's 0.5 s poll
plus one task hop); with ``--cold-workers`` the celery side pays start-up twice (each fresh
worker imports the analysis on its first task). The validation runs the measured parts on one
machine (list scheduling on ``--cores``). Validation: with ``--measured-celery-s`` (bench/analysis_distributed.py on
the same store) it prints the 1-machine prediction with ``--cores`` slots beside it.

Usage: python bench/analysis_distributed_model.py --store DIR [--replicates 10000] [--cores 2] [--cold-workers]
       [--cores 2] [--measured-celery-s S --measured-local-s S]
"""

from __future__ import annotations

import argparse
import heapq
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.reference import load_average  # noqa: E402


def schedule(costs: list[float], slots: int) -> float:
    """Makespan of ``costs`` on ``slots`` workers, longest first to the least-loaded worker."""
    loads = [0.0] * max(1, slots)
    heapq.heapify(loads)
    for c in sorted(costs, reverse=True):
        heapq.heappush(loads, heapq.heappop(loads) + c)
    return max(loads)


def predict(k: int, maps: list[float], summary_b: list[int], input_b: list[int], cores: int,
            bw_bps: float, fixed_s: float, reduce_s: float, locality: bool = True) -> float:
    """Wall of K machines with ``cores`` each, the map work re-cut into K·cores equal parts
    (the plan packs or hash-shards cells into as many parts as asked): the measured map seconds
    and bytes divide evenly; the summaries cross the link once (K > 1)."""
    span = sum(maps) / (k * cores)
    shipped = sum(summary_b) if k > 1 else 0  # one machine: the summaries stay on its disk
    if not locality and k > 1:
        span += sum(input_b) / k / bw_bps  # each machine pulls its share of the runs
    return fixed_s + span + shipped / bw_bps + reduce_s


def predict_measured_parts(maps: list[float], slots: int, fixed_s: float, reduce_s: float) -> float:
    """One machine running the measured parts on ``slots`` cores (list scheduling)."""
    return fixed_s + schedule(maps, slots) + reduce_s


def import_seconds() -> float:
    """Start-up of a fresh interpreter importing the CLI and the analysis (what ``irbench
    analyze`` pays once, and each worker on its first analysis task)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import orchestrator.cli.app, analysis.pipeline, "
                    "analysis.tables.part_summaries"], cwd=ROOT, check=True)
    return time.perf_counter() - t0


def measure(store: Path, replicates: int) -> dict:
    from analysis.options import AnalysisOptions
    from analysis.pipeline import run_analysis
    from orchestrator.jobs.analysis_plan import plan_analysis
    from orchestrator.jobs.analysis_tasks import part_paths, run_map, run_reduce, scratch_dir, split_path
    from storage.parquet.atomic import write_parquet_atomic

    options = AnalysisOptions(replicates=replicates)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run_analysis(store, Path(tmp) / "local", options)
        local = time.perf_counter() - t0
        t0 = time.perf_counter()
        plan = plan_analysis(store, options)
        plan_s = time.perf_counter() - t0
        job = {"job_id": "model", "data_dir": str(store), "out_dir": str(Path(tmp) / "dist"),
               "options": options.model_dump(mode="json"), "parts": len(plan.parts)}
        scratch_dir(job).mkdir(parents=True)
        write_parquet_atomic(plan.split, split_path(job))
        maps, summ, inp = [], [], []
        for i, (files, shard) in enumerate(zip(plan.parts, plan.shards)):
            t0 = time.perf_counter()
            run_map(job, i, files, None if shard is None else list(shard))
            maps.append(time.perf_counter() - t0)
            base = part_paths(job, i)[0]
            summ.append(sum(p.stat().st_size for p in base.parent.glob(base.name + ".*.parquet")))
            inp.append(sum(Path(f).stat().st_size for f in files))
        t0 = time.perf_counter()
        run_reduce(job)
        reduce_s = time.perf_counter() - t0
    return {"local": local, "plan": plan_s, "maps": maps, "summary": summ, "input": inp,
            "reduce": reduce_s, "split": plan.split.num_rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--replicates", type=int, default=10_000)
    ap.add_argument("--cores", type=int, default=2, help="cores per machine (this one has 2)")
    ap.add_argument("--cold-workers", action="store_true",
                    help="workers import the analysis on their first task (a fresh cluster)")
    ap.add_argument("--gbit", type=float, default=1.0)
    ap.add_argument("--dispatch-s", type=float, default=0.6)
    ap.add_argument("--measured-celery-s", type=float, default=None)
    ap.add_argument("--measured-local-s", type=float, default=None)
    args = ap.parse_args()
    print(f"measuring on {args.store}; {load_average()}", flush=True)
    m = measure(args.store, args.replicates)
    bw = args.gbit * 1e9 / 8
    startup = import_seconds()
    # the CLI starts once; a fresh worker also imports the analysis on its first task
    fixed = (2 if args.cold_workers else 1) * startup + m["plan"] + args.dispatch_s
    print(f"in-process: local {m['local']:.2f} s; plan {m['plan']:.2f} s; {len(m['maps'])} maps "
          f"sum {sum(m['maps']):.2f} s (max {max(m['maps']):.2f}); reduce {m['reduce']:.2f} s; "
          f"input {sum(m['input']) / 2**20:.1f} MiB -> summaries {sum(m['summary']) / 2**20:.1f} MiB; "
          f"split cells {m['split']}; {load_average()}")
    local_wall = startup + m["local"]
    print(f"model ({args.cores} cores per machine, {args.gbit:g} Gbit/s, fixed {fixed:.2f} s incl. "
          f"start-up {startup:.2f} s): one machine reading everything (local) {local_wall:.2f} s")
    best = None
    for k in (1, 2, 4, 8, 16):
        w = predict(k, m["maps"], m["summary"], m["input"], args.cores, bw, fixed, m["reduce"])
        nl = predict(k, m["maps"], m["summary"], m["input"], args.cores, bw, fixed, m["reduce"], False)
        if best is None and w < local_wall:
            best = k
        print(f"  K={k:2d} machines: celery {w:6.2f} s (celery/local {w / local_wall:.2f}); "
              f"shared storage, no locality {nl:6.2f} s")
    print(f"crossover: {best} machine(s)" if best else "crossover: none up to 16 machines "
          f"(the reduce alone is {m['reduce']:.2f} s)")
    if args.measured_celery_s is not None:
        one = predict_measured_parts(m["maps"], args.cores, fixed, m["reduce"])
        print(f"validation, 1 machine with {args.cores} cores: celery predicted {one:.2f} s, measured "
              f"{args.measured_celery_s:.2f} s (predicted/measured {one / args.measured_celery_s:.2f})")
    if args.measured_local_s is not None:
        print(f"validation, local: predicted {local_wall:.2f} s, measured {args.measured_local_s:.2f} s "
              f"(predicted/measured {local_wall / args.measured_local_s:.2f}); {load_average()}")


if __name__ == "__main__":
    main()
