"""Whole ``irbench analyze`` of run stores of 20k and 100k runs: wall time and peak RSS.

For each size (models × prompts × runs; default 50×80×5 = 20k and 50×400×5 = 100k) a run store
is written with :func:`bench.run_store.write_run_store` (synthetic RunRecords through the
store's batch writer, IRs from the simulator's generator; or ``--store-dir`` reuses stores
written before: ``<dir>/<models>x<prompts>x<runs>``), then ``irbench analyze`` runs as a fresh
child process (imports included); its peak RSS comes from ``getrusage(RUSAGE_CHILDREN)``.
Beside it: the plain-numpy reference of :mod:`bench.reference` for the same panel shape (the
textbook per-model bootstrap alone) measured in the same run, the ratio, and the load average.

Usage: python bench/analysis_campaign.py [--sizes 50x80x5,50x400x5] [--replicates 10000]
       [--store-dir DIR] [--executor local|celery --broker URL]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.reference import load_average, plain_numpy_ci_s  # noqa: E402
from bench.run_store import write_run_store  # noqa: E402


_CHILD = """
import resource, runpy, subprocess, sys, time
t0 = time.perf_counter()
res = subprocess.run(sys.argv[1:], capture_output=True, text=True)
wall = time.perf_counter() - t0
sys.stderr.write(res.stderr[-3000:])
print(wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, res.returncode)
"""


def analyze_child(data: Path, out: Path, replicates: int, extra: list[str],
                  src: Path = ROOT) -> tuple[float, float]:
    """(wall s, peak RSS MiB) of ``irbench analyze`` (the code under ``src``) as a fresh
    process, measured by a small wrapper process so each run's peak RSS is its own."""
    cmd = [sys.executable, "-m", "orchestrator.cli.app", "analyze", "--data", str(data),
           "--out", str(out), "--replicates", str(replicates), *extra]
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONDONTWRITEBYTECODE": "1"}
    res = subprocess.run([sys.executable, "-c", _CHILD, *cmd], capture_output=True, text=True,
                         cwd=src, env=env, check=False)
    wall, rss, rc = res.stdout.split()
    if int(rc) != 0:
        raise RuntimeError(f"irbench analyze failed:\n{res.stderr[-3000:]}")
    return float(wall), float(rss)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="50x80x5,50x400x5")
    ap.add_argument("--replicates", type=int, default=10_000)
    ap.add_argument("--store-dir", type=Path, default=None)
    ap.add_argument("--store", type=Path, default=None,
                    help="analyse this data directory instead (e.g. the 100 x 10,000 panel "
                    "written by bench/analysis_scale.py --keep-store); --sizes is then its label")
    ap.add_argument("--executor", default="local")
    ap.add_argument("--broker", default=None)
    ap.add_argument("--baseline-src", type=Path, default=None,
                    help="a source tree of an earlier irbench (e.g. `git archive main | tar -x "
                    "-C DIR`): its analyze runs on the same store, side by side")
    args = ap.parse_args()
    extra = ["--executor", args.executor] + (["--broker", args.broker] if args.broker else [])
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            m, p, r = (int(x) for x in (size.split("x") + ["1"])[:3])
            store = args.store or (args.store_dir or Path(tmp)) / size
            if args.store is None and not (store / "runs").is_dir():
                t0 = time.perf_counter()
                n = write_run_store(store, models=m, prompts=p, runs=r)
                print(f"{size}: wrote {n} runs in {time.perf_counter() - t0:.1f} s", flush=True)
            print(f"{size}: {load_average()} (before)", flush=True)
            wall, rss = analyze_child(store, Path(tmp) / f"out-{size}", args.replicates, extra)
            ref = plain_numpy_ci_s([p] * m, replicates=args.replicates)
            print(f"{size} ({m * p * r} runs): whole `irbench analyze --executor {args.executor}` "
                  f"{wall:.1f} s, peak RSS {rss:.0f} MiB; plain-numpy per-model CIs alone "
                  f"{ref:.1f} s; ratio analyze/reference {wall / ref:.2f}; {load_average()} "
                  "(after)", flush=True)
            if args.baseline_src is not None:
                b_wall, b_rss = analyze_child(store, Path(tmp) / f"base-{size}",
                                              args.replicates, extra, src=args.baseline_src)
                print(f"{size}: baseline ({args.baseline_src}) {b_wall:.1f} s, peak RSS "
                      f"{b_rss:.0f} MiB -> this tree {b_wall / wall:.1f}x faster, "
                      f"{b_rss / rss:.1f}x less memory; {load_average()}", flush=True)


if __name__ == "__main__":
    main()
