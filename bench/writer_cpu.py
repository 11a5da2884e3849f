"""CPU per run of the local executor's writer process, and of each step of its work, in ms.

Collects ``--runs`` finished runs from the simulator (the ``local_throughput.py`` model, called
through ``execute_run_deferred``: ``PendingRecord``s for the answers, ``RunRecord``s for the
rest), then, with no HTTP and no simulator running:

* ``child``: a ``ProcessWriter`` fed those runs at ``--rate`` runs/s from an event loop, as
  ``run_local`` feeds it; CPU per run of the forked child (``RUSAGE_CHILDREN``, user + system)
  and its minor page faults per run (copy-on-write after the fork shows up there);
* in this process, per step: ``pickle`` + ``unpickle`` of the frames, ``finish`` (IR extraction
  and ``RunRecord`` validation), ``extract_ir`` alone, ``write`` (``RunStore.write`` in batches
  of ``--batch``, fsync off so the disk does not decide).

Every figure is the median of ``--repeats``; the load average is printed before and after.
CPU time is far less sensitive to other load than wall time. To compare two trees side by side,
run this script from one tree with ``PYTHONPATH=<other tree>`` and alternate the two.

    python bench/writer_cpu.py [--runs 2000] [--rate 1500] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import pickle
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

import storage
from local_throughput import SIM_TOML, make_tasks
from orchestrator.local.writer import ProcessWriter, WriterConfig
from simulator.server import start_subprocess
from storage.records import RunRecord
from storage.runs import RunStore
from workers.execute import PendingRecord, RunContext, execute_run_deferred
from workers.gate import MemoryGate
from workers.ir_extract import extract_ir
from workers.limits.memory import MemoryLimiter
from workers.providers.registry import make_provider

Item = RunRecord | PendingRecord


async def _collect(base_url: str, n: int) -> list[Item]:
    tasks = make_tasks(base_url, n, 16, "w")
    async with httpx.AsyncClient(trust_env=False, timeout=30.0) as client:
        provider = make_provider(tasks[0].endpoint, client, None)
        ctx = RunContext(provider_for=lambda _t: provider, limiter=MemoryLimiter(), gate=MemoryGate(1000))
        queue = iter(tasks)
        out: list[Item] = []

        async def lane() -> None:
            for task in queue:
                out.append(await execute_run_deferred(task, ctx))

        await asyncio.gather(*[lane() for _ in range(16)])
    return out


def collect(n: int) -> list[Item]:
    """``n`` finished runs of the simulator, as the event loop hands them to the writer."""
    with tempfile.TemporaryDirectory(prefix="irbench-wcpu-") as tmp:
        cfg = Path(tmp) / "sim.toml"
        cfg.write_text(SIM_TOML)
        with start_subprocess(cfg) as sim:
            return asyncio.run(_collect(sim.base_url, n))


def _children() -> tuple[float, int]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime, usage.ru_minflt


async def _feed(items: list[Item], store: RunStore, rate: float) -> int:
    stored = 0

    def on_finished(_run: object) -> None:
        nonlocal stored
        stored += 1

    writer = ProcessWriter(store, WriterConfig(store, 0.25, 512), on_finished)
    await writer.start()
    runner = asyncio.create_task(writer.run())
    step = max(1, int(rate / 500))  # a few runs every 2 ms, as finished runs trickle in
    for i in range(0, len(items), step):
        for item in items[i : i + step]:
            writer.add(item)
        await asyncio.sleep(step / rate)
    writer.close()
    await runner
    return writer.written


def child_cpu(items: list[Item], rate: float, root: Path) -> tuple[float, float]:
    """(child CPU ms per run, child minor faults per run) of one ``ProcessWriter`` over ``items``."""
    c0, f0 = _children()
    written = asyncio.run(_feed(items, RunStore(root, fsync=False), rate))
    c1, f1 = _children()
    assert written == len(items), (written, len(items))
    return 1000 * (c1 - c0) / len(items), (f1 - f0) / len(items)


def _per_run(fn: Callable[[], object], n: int) -> float:
    t0 = time.process_time()
    fn()
    return 1000 * (time.process_time() - t0) / n


def steps(items: list[Item], batch: int, root: Path) -> dict[str, float]:
    """In-process CPU ms per run of each step of the writer's work."""
    frames = [pickle.dumps(items[i : i + 16], protocol=pickle.HIGHEST_PROTOCOL) for i in range(0, len(items), 16)]
    answers = [item for item in items if isinstance(item, PendingRecord)]
    records: list[RunRecord] = []
    out = {
        "pickle": _per_run(lambda: [pickle.dumps(items[i : i + 16], protocol=5) for i in range(0, len(items), 16)], len(items)),
        "unpickle": _per_run(lambda: [pickle.loads(f) for f in frames], len(items)),
        # each result dropped at once: kept, the IRs' objects would trigger full collections
        "extract_ir": _per_run(lambda: collections.deque((extract_ir(a.reply.answer_text) for a in answers), 0), len(answers)),
        "finish": _per_run(lambda: records.extend(a.finish() for a in answers), len(answers)),
    }
    records += [item for item in items if isinstance(item, RunRecord)]
    store = RunStore(root, fsync=False)
    out["write"] = _per_run(lambda: [store.write(records[i : i + batch]) for i in range(0, len(records), batch)], len(records))
    out["bytes"] = sum(map(len, frames)) / len(items)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2000, help="runs per measurement")
    parser.add_argument("--rate", type=float, default=1500.0, help="runs/s fed to the writer process")
    parser.add_argument("--batch", type=int, default=200, help="records per RunStore.write in the step figures")
    parser.add_argument("--repeats", type=int, default=3, help="measurements (median reported)")
    args = parser.parse_args()
    from workers.logs import configure_logging

    configure_logging(level="WARNING")
    load_before = os.getloadavg()
    items = collect(args.runs)
    answered = sum(isinstance(i, PendingRecord) for i in items)
    child: list[tuple[float, float]] = []
    step: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="irbench-wcpu-") as tmp:
        for rep in range(args.repeats):
            child.append(child_cpu(items, args.rate, Path(tmp) / f"child-{rep}"))
            step.append(steps(items, args.batch, Path(tmp) / f"steps-{rep}"))
    load_after = os.getloadavg()
    print(f"tree {Path(storage.__file__).resolve().parent.parent}; {args.runs} runs ({answered} answered), "
          f"median of {args.repeats}; load average before {' '.join(f'{x:.2f}' for x in load_before)}, "
          f"after {' '.join(f'{x:.2f}' for x in load_after)}")
    print(f"child CPU ms/run {statistics.median(c for c, _ in child):.3f}  "
          f"minor faults/run {statistics.median(f for _, f in child):.1f}")
    print("in-process ms/run: " + "  ".join(
        f"{k} {statistics.median(s[k] for s in step):.3f}" for k in step[0] if k != "bytes"
    ) + f"  (frame bytes/run {step[0]['bytes']:.0f})")


if __name__ == "__main__":
    main()
