"""Instructions per run of a worker's run path, counted by valgrind: a figure the CPU's speed does not move.

Wall and CPU time on these 2-core VMs drift by up to 2x within minutes, which hides any change
under ~20 % unless it is alternated many times. Instructions executed do not depend on the CPU's
speed (though they do on how runs batch, below). This runs ``workers.celery.tasks.run_message``
on a real ``WorkerRuntime`` (its event loop, run slots, claims and done markers on a private redis-server, the group-commit spool with
its fsyncs) under ``valgrind --tool=callgrind``, against a zero-latency simulator and
redis-server running natively, and prints the user-space instructions of the whole worker
process (every thread) per run, for the timed part only (``callgrind_control`` zeroes the
counters after a warm-up message and dumps them after the last one).

What it does not count: the kernel's work (syscalls, fsync, loopback TCP), which callgrind does
not see, and Celery/kombu (no broker here: ``distributed_throughput.py`` measures those). Under
valgrind the process runs ~50x slower while the simulator and Redis do not, so batches (runs
that claim or finish together) are larger than in a live worker at the same slots, and their
size varies from one measurement to the next: at 8 slots repeats agreed within ~4 %, at 32
slots with 64 runs per message one tree gave 2.15-2.18 M and, an hour later, 2.98 and 3.94 M
instructions per run. Alternate the trees (``--trees``) and compare within one invocation,
over several repeats:

    python bench/worker_instructions.py [--runs 400] [--slots 8] [--per-message 16] [--repeats 2]
                                        [--trees DIR,DIR]   # default: this tree only

Needs ``valgrind`` (``apt-get install valgrind``). About a minute per measurement.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# The child: one run path under callgrind. argv: SRC RUNS SLOTS PER_MESSAGE REDIS_URL SIM_URL DATA BENCH
# (SRC's packages, run by this tree's ``worker_path`` helpers, so any older tree can be measured)
_CHILD = r'''
import os, subprocess, sys
src, bench = sys.argv[1], sys.argv[8]
sys.path[:0] = [src]
# the measured tree's packages first; then this tree's bench helpers, which find them imported
import analysis, deploy, orchestrator, simulator, storage, viewer, workers  # noqa: F401,E401
sys.path[:0] = [bench]
from pathlib import Path
import worker_path as wp
from workers.celery.runtime import WorkerSettings
from workers.logs import configure_logging
configure_logging(level="WARNING")
n, slots, per = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
redis_url, sim_url, data = sys.argv[5], sys.argv[6], Path(sys.argv[7])
tasks = wp.tasks_for(data / "plan", f"wi{os.getpid()}", sim_url, n + 64)
holder, timed = wp.warm_runtime(redis_url, tasks, data / "store", slots, WorkerSettings.gc_young_threshold)
subprocess.run(["callgrind_control", "--zero", str(os.getpid())], check=True, capture_output=True)
wp.run_all(holder, timed, data / "store", per)
subprocess.run(["callgrind_control", "--dump=timed", str(os.getpid())], check=True, capture_output=True)
os._exit(0)  # no shutdown in the counts
'''


def instructions(out_prefix: str) -> int:
    """The timed dump's total instructions (the largest ``totals`` of the child's dump files)."""
    best = 0
    for path in glob.glob(out_prefix + ".*"):
        for line in Path(path).read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                best = max(best, int(line.split()[1]))
    return best


def measure(src: Path, args: argparse.Namespace, redis_url: str, sim_url: str, tmp: Path, tag: str) -> float:
    """Millions of instructions per run of ``src``'s worker path."""
    child = tmp / "child.py"
    child.write_text(_CHILD)
    out = str(tmp / f"callgrind.{tag}")
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p", sys.executable, str(child), str(src),
         str(args.runs), str(args.slots), str(args.per_message), redis_url, sim_url, str(tmp / f"data-{tag}"), str(HERE)],
        capture_output=True, text=True)
    total = instructions(out)
    if proc.returncode != 0 or not total:
        raise SystemExit(f"{src}: the run path under valgrind failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return total / args.runs / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=400, help="timed runs per measurement")
    parser.add_argument("--slots", type=int, default=8, help="the worker's run slots")
    parser.add_argument("--per-message", type=int, default=16, help="runs handed to run_message at once")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--trees", default=str(ROOT), help="comma-separated source trees, alternated")
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: apt-get install valgrind")
    sys.path[:0] = [str(ROOT)]
    from deploy.redis_server import RedisServer
    from simulator.server import start_subprocess

    trees = [Path(t).resolve() for t in args.trees.split(",")]
    got: dict[Path, list[float]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory(prefix="irbench-wi-") as tmp, RedisServer() as srv:
        tmp_path = Path(tmp)
        (tmp_path / "sim.toml").write_text("seed = 1\n[models.tp-zero]\n")
        with start_subprocess(tmp_path / "sim.toml") as sim:
            for rep in range(args.repeats):
                for i, tree in enumerate(trees):
                    m = measure(tree, args, srv.url, sim.base_url, tmp_path, f"{rep}-{i}")
                    got[tree].append(m)
                    print(f"repeat {rep + 1} {tree}: {m:.3f} M instructions per run", file=sys.stderr, flush=True)
    print(f"\n{args.runs} timed runs per measurement, {args.slots} run slots, {args.per_message} runs per message; "
          "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    first = statistics.median(got[trees[0]])
    for tree in trees:
        med = statistics.median(got[tree])
        each = ", ".join(f"{m:.3f}" for m in got[tree])
        print(f"{str(tree):>40}: median {med:.3f} M instructions/run ({each}); x first tree {med / first:.3f}")


if __name__ == "__main__":
    main()
