"""``irbench analyze --executor celery`` with N workers beside ``--executor local``, same store.

Starts a local cluster with ``deploy/local_cluster.py up`` (its own redis-server on a free port,
N ``celery worker`` processes, ``-c 1`` each), runs the distributed analyze and the local one
on the same run store (written by :mod:`bench.run_store` unless ``--store`` is given), in
``--rounds`` alternating rounds (local first, then celery first: the load drifts), prints every
wall with the load average, the means and their ratio, then ``down``.

Usage: python bench/analysis_distributed.py [--store DIR | --size 50x400x5] [--workers 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.reference import load_average  # noqa: E402
from bench.run_store import write_run_store  # noqa: E402


def _analyze(data: Path, out: Path, replicates: int, extra: list[str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "orchestrator.cli.app", "analyze", "--data", str(data),
                          "--out", str(out), "--replicates", str(replicates), *extra],
                         capture_output=True, text=True, cwd=ROOT, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"analyze failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--size", default="50x400x5")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--replicates", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store
        if store is None:
            m, p, r = (int(x) for x in args.size.split("x"))
            store = Path(tmp) / "data"
            write_run_store(store, models=m, prompts=p, runs=r)
        state = Path(tmp) / "cluster"
        cluster = [sys.executable, str(ROOT / "deploy" / "local_cluster.py")]
        up = subprocess.run([*cluster, "up", "--state", str(state), "--workers", str(args.workers),
                             "--concurrency", "1", "--data", str(store)],
                            capture_output=True, text=True, cwd=ROOT, check=False)
        if up.returncode != 0:
            raise RuntimeError(f"cluster did not start:\n{up.stdout}\n{up.stderr}")
        try:
            broker = json.loads((state / "cluster.json").read_text())["broker_url"]
            print(f"{args.workers} workers on {broker}; {load_average()}", flush=True)
            dists, locals_ = [], []
            for i in range(args.rounds):  # alternate (local, celery), (celery, local): load drifts
                order = ["local", "celery"] if i % 2 == 0 else ["celery", "local"]
                for kind in order:
                    extra = ["--executor", "celery", "--broker", broker] if kind == "celery" else []
                    wall = _analyze(store, Path(tmp) / f"out-{kind}-{i}", args.replicates, extra)
                    (dists if kind == "celery" else locals_).append(wall)
                    print(f"  round {i + 1} {kind}: {wall:.1f} s; {load_average()}", flush=True)
            dist, local = sum(dists) / len(dists), sum(locals_) / len(locals_)
            print(f"analyze --executor celery ({args.workers} workers) {dist:.1f} s, local "
                  f"{local:.1f} s (means of {args.rounds}): celery/local {dist / local:.2f}; "
                  f"{load_average()}", flush=True)
        finally:
            subprocess.run([*cluster, "down", "--state", str(state), "--grace", "10"],
                           capture_output=True, text=True, cwd=ROOT, check=False)


if __name__ == "__main__":
    main()
