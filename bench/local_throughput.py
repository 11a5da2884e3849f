"""End-to-end throughput of the local executor: call + parse + Parquet write, runs/second.

The simulator runs in its own process (the other core) with zero latency and no limits, so the
figure is irbench's own per-run cost. Concurrency levels are measured side by side in one run.

    python bench/local_throughput.py [--runs 1200] [--levels 1,4,16]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from orchestrator.instruction import load_instruction
from orchestrator.local import LocalOptions, run_local
from simulator.server import start_subprocess
from storage.runs import RunStore
from workers.runtask import EndpointRef, ModelLimits, RunTask

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def make_tasks(base_url: str, n: int, concurrency: int, tag: str) -> list[RunTask]:
    import hashlib

    instr = load_instruction(None)
    prompts = sorted((EXAMPLES / "prompts").glob("*.prompt.rtpl"))
    texts = [(p.name, p.read_text()) for p in prompts]
    tasks = []
    for i in range(n):
        name, text = texts[i % len(texts)]
        tasks.append(
            RunTask(
                run_id=f"{tag}-{i:06d}",
                campaign=f"bench-{tag}",
                panel="bench",
                model="sim-mild",
                endpoint=EndpointRef(name="sim", base_url=base_url),
                limits=ModelLimits(max_concurrency=concurrency),
                prompt_sha256=hashlib.sha256(text.encode()).hexdigest(),
                prompt_name=name,
                run_index=i // len(texts),
                user_message=instr.render(name, text),
                instruction_version=instr.version,
                instruction_sha256=instr.sha256,
            )
        )
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1200)
    parser.add_argument("--levels", default="1,4,16")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    from workers.logs import configure_logging

    configure_logging(level="WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "sim.toml"
        cfg.write_text('seed = 1\n[models.sim-mild]\ndrop_prob = 0.03\nadd_rate = 0.3\nfence_prob = 0.5\n')
        with start_subprocess(cfg) as sim:
            # warm-up (imports, connection pool, simulator caches)
            asyncio.run(run_local(make_tasks(sim.base_url, 50, 4, "warm"), RunStore(Path(tmp) / "warm"), secrets={}))
            print(f"{'concurrency':>11} {'runs':>6} {'seconds':>8} {'runs/s':>8} {'ms/run':>7}")
            for level in levels:
                store = RunStore(Path(tmp) / f"data-{level}")
                tasks = make_tasks(sim.base_url, args.runs, level, f"c{level}")
                t0 = time.perf_counter()
                summary = asyncio.run(run_local(tasks, store, secrets={}, options=LocalOptions()))
                elapsed = time.perf_counter() - t0
                stored = len(store.completed_run_ids())
                assert stored == args.runs == summary.executed, (stored, summary.executed)
                print(f"{level:>11} {args.runs:>6} {elapsed:>8.2f} {args.runs / elapsed:>8.1f} {1000 * elapsed / args.runs:>7.2f}")


if __name__ == "__main__":
    main()
