"""Local executor throughput against a bare asyncio + httpx loop making the same calls, runs/s.

The simulator runs in its own process with zero latency and no limits, so the figures are the
client side's own per-run cost. For each concurrency level, measured side by side in one run
(each repeat alternates which goes first, the figure is the median over repeats):

* ``irbench``: ``run_local`` (call through ``PooledProvider``'s ``DirectClient``s, classify, IR
  extraction and validation, RunRecord, batched Parquet writes with fsync) over ``--runs`` runs
  at that concurrency, on the event loop
  ``irbench run`` uses (``run_event_loop``: uvloop); ``asyncio`` is the same on asyncio's
  default loop, to show what uvloop buys;
* ``bare``: the reference. ``concurrency`` coroutines pull the same runs from one iterator; each
  coroutine owns one ``httpx.AsyncClient`` (one keep-alive connection, as the local executor's
  workers do) and, per run, POSTs the same JSON body irbench sends (built by the same
  ``OpenAIProvider.build_body``, same headers) to ``/v1/chat/completions``, then ``json.loads``
  the response body and takes ``choices[0].message.content``. Nothing is stored or validated.
  A call that meets a dropped keep-alive connection is retried once.
* ``bare-shared``: the same loop with ONE ``AsyncClient`` (pool of ``concurrency`` connections)
  shared by every coroutine, the obvious way to write it. httpcore scans every pooled connection
  on each request, so this falls off at high concurrency; it is printed to show that cost.

Repeats run the levels ascending, then descending. Two verdicts close the table: whether the
medians never decrease, and, per step, the change paired within each repeat (median and range)
with how many repeats saw a decrease; a step is called a decrease only if every repeat (at
least 5) saw one, a sign test at p = 2^-repeats: on the plateau above 16 the medians' order
flips with the machine's drift.

``ratio`` is irbench (uvloop) / the better of the two bare loops (asyncio), per repeat, then the median. Also
printed: the client process's CPU per run (``process_time``, less noisy than wall time on a
shared machine), irbench's writer process's CPU per run (``+writer``: IR extraction, record
validation, Parquet; 0 when ``run_local`` writes from a thread, below 256 runs), the simulator process's CPU per run (``sim_ms``: when it is at or above the
client's, the simulator is the cap and both sides are held to its rate), and the load average
before and after.

    python bench/local_throughput.py [--runs 1000] [--levels 1,4,16,64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import ssl
import statistics
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import httpx

from orchestrator.campaign.instruction import load_instruction
from orchestrator.local.executor import LocalOptions, run_event_loop, run_local
from simulator.server import start_subprocess
from storage.runs import RunStore
from workers.providers.base import ChatRequest
from workers.providers.openai_compat import OpenAIProvider
from workers.runtask import EndpointRef, ModelLimits, RunTask

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MODEL = "sim-mild"
SIM_TOML = f'seed = 1\n[models.{MODEL}]\ndrop_prob = 0.03\nadd_rate = 0.3\nfence_prob = 0.5\n'
HEADERS = {"Cache-Control": "no-store", "Accept": "application/json"}  # what OpenAIProvider sends


def make_tasks(base_url: str, n: int, concurrency: int, tag: str) -> list[RunTask]:
    """``n`` runs of the example prompts (cycled) against the simulator, capped at ``concurrency``."""
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
                model=MODEL,
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


def request_bodies(tasks: list[RunTask]) -> list[dict[str, Any]]:
    """The JSON bodies irbench sends for ``tasks`` (same builder as the provider)."""
    provider = OpenAIProvider(httpx.AsyncClient(), tasks[0].endpoint.base_url, None)
    return [
        provider.build_body(
            ChatRequest(
                model=t.model, user_message=t.user_message, timeouts=t.timeouts, max_tokens=t.max_tokens,
                temperature=t.temperature, reasoning=t.reasoning, options=dict(t.options),
            )
        )
        for t in tasks
    ]


async def bare_loop(url: str, bodies: list[dict[str, Any]], concurrency: int, *, shared: bool, tls: ssl.SSLContext) -> int:
    """POST every body with ``concurrency`` coroutines; returns the answers parsed. ``tls`` is
    built once outside the timing (each client would otherwise load the CA bundle)."""
    source: Iterator[dict[str, Any]] = iter(bodies)
    answers = 0

    def client(connections: int) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        return httpx.AsyncClient(limits=limits, trust_env=False, timeout=30.0, verify=tls)

    async def drain(c: httpx.AsyncClient) -> None:
        nonlocal answers
        for body in source:
            try:
                response = await c.post(url, json=body, headers=HEADERS)
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                # a keep-alive connection the server dropped: retry once on a fresh one, as
                # irbench's retry policy would (without it a loaded run could die here)
                response = await c.post(url, json=body, headers=HEADERS)
            response.raise_for_status()
            content = json.loads(response.content)["choices"][0]["message"]["content"]
            answers += isinstance(content, str)

    async def lane() -> None:
        async with client(1) as c:
            await drain(c)

    if shared:
        async with client(concurrency) as c:
            await asyncio.gather(*[drain(c) for _ in range(concurrency)])
    else:
        await asyncio.gather(*[lane() for _ in range(concurrency)])
    return answers


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's exited, waited-for children: irbench's writer
    process (``orchestrator/local/writer.py``) once ``run_local`` returns; not the simulator,
    which is reaped only at the end."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(
    fn: Callable[[], Coroutine[Any, Any, int]], expected: int, loop: Callable[[Any], int], sim_pid: int
) -> tuple[float, float, float, float]:
    """``(runs/s, client CPU ms per run, simulator CPU ms per run, writer-process CPU ms per
    run)`` of one ``loop(fn())`` that must yield ``expected``."""
    t0, c0, s0, w0 = time.perf_counter(), time.process_time(), cpu_s(sim_pid), children_cpu_s()
    done = loop(fn())
    wall, cpu, sim = time.perf_counter() - t0, time.process_time() - c0, cpu_s(sim_pid) - s0
    writer = children_cpu_s() - w0
    if done != expected:
        raise SystemExit(f"only {done} of {expected} runs completed")
    return expected / wall, 1000 * cpu / expected, 1000 * sim / expected, 1000 * writer / expected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000, help="runs per measurement")
    parser.add_argument("--levels", default="1,4,16,64", help="concurrency levels")
    parser.add_argument("--repeats", type=int, default=3, help="paired measurements per level (median reported)")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    from workers.logs import configure_logging

    configure_logging(level="WARNING")
    load_before = os.getloadavg()
    kinds = ("irbench", "asyncio", "bare", "bare-shared")
    results: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {(k, lv): [] for k in kinds for lv in levels}
    with tempfile.TemporaryDirectory(prefix="irbench-bench-") as tmp:
        cfg = Path(tmp) / "sim.toml"
        cfg.write_text(SIM_TOML)
        with start_subprocess(cfg) as sim:
            url = f"{sim.base_url}/v1/chat/completions"
            tls = ssl.create_default_context()
            # warm-up (imports, simulator caches), not timed
            warm = make_tasks(sim.base_url, 50, 4, "warm")
            asyncio.run(run_local(warm, RunStore(Path(tmp) / "warm"), secrets={}))
            asyncio.run(bare_loop(url, request_bodies(warm), 4, shared=False, tls=tls))
            for rep in range(args.repeats):
                # levels ascending, then descending: a machine that drifts during a repeat
                # favours neither end of a step on the whole
                for level in (levels if rep % 2 == 0 else list(reversed(levels))):
                    tasks = make_tasks(sim.base_url, args.runs, level, f"r{rep}c{level}")
                    bodies = request_bodies(tasks)
                    stores = {k: RunStore(Path(tmp) / f"data-{k}-{rep}-{level}") for k in ("irbench", "asyncio")}

                    async def irbench(tasks: list[RunTask] = tasks, store: RunStore = stores["irbench"]) -> int:
                        summary = await run_local(tasks, store, secrets={}, options=LocalOptions())
                        return summary.executed

                    async def irbench_asyncio(tasks: list[RunTask] = tasks, store: RunStore = stores["asyncio"]) -> int:
                        summary = await run_local(tasks, store, secrets={}, options=LocalOptions())
                        return summary.executed

                    runners = {
                        "irbench": irbench,
                        "asyncio": irbench_asyncio,
                        "bare": lambda b=bodies, lv=level: bare_loop(url, b, lv, shared=False, tls=tls),
                        "bare-shared": lambda b=bodies, lv=level: bare_loop(url, b, lv, shared=True, tls=tls),
                    }
                    order = kinds if rep % 2 == 0 else tuple(reversed(kinds))
                    for kind in order:
                        loop = run_event_loop if kind == "irbench" else asyncio.run
                        results[(kind, level)].append(timed(runners[kind], args.runs, loop, sim.process.pid))
                    for kind, store in stores.items():
                        stored = len(store.completed_run_ids())
                        if stored != args.runs:
                            raise SystemExit(f"{kind}: stored {stored} of {args.runs} runs")
    load_after = os.getloadavg()

    def med(kind: str, level: int, i: int) -> float:
        return statistics.median(r[i] for r in results[(kind, level)])

    print(f"{args.runs} runs per measurement, median of {args.repeats} paired repeats; "
          f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    print(f"{'concurrency':>11} {'irbench/s':>10} {'asyncio/s':>10} {'bare/s':>8} {'shared/s':>9} {'ratio':>6} "
          f"{'cpu_ms irbench':>15} {'+writer':>8} {'asyncio':>8} {'bare':>5} {'shared':>6} {'sim_ms irbench':>15} {'bare':>5}")
    previous = 0.0
    monotone = True
    for level in levels:
        ratios = [
            ir[0] / max(b[0], s[0])
            for ir, b, s in zip(results[("irbench", level)], results[("bare", level)], results[("bare-shared", level)])
        ]
        ir_rate = med("irbench", level, 0)
        monotone &= ir_rate >= previous
        previous = ir_rate
        print(f"{level:>11} {ir_rate:>10.1f} {med('asyncio', level, 0):>10.1f} {med('bare', level, 0):>8.1f} "
              f"{med('bare-shared', level, 0):>9.1f} {statistics.median(ratios):>6.2f} {med('irbench', level, 1):>15.2f} "
              f"{med('irbench', level, 3):>8.2f} "
              f"{med('asyncio', level, 1):>8.2f} {med('bare', level, 1):>5.2f} {med('bare-shared', level, 1):>6.2f} "
              f"{med('irbench', level, 2):>15.2f} {med('bare', level, 2):>5.2f}")
    print(f"irbench runs/s non-decreasing in concurrency (medians): {'yes' if monotone else 'NO'}")
    # each step paired within a repeat: on a plateau the medians' order is a coin flip, so a
    # step counts as a decrease only when every repeat saw one (sign test: p = 2^-repeats)
    significant = []
    for a, b in zip(levels, levels[1:]):
        changes = [rb[0] / ra[0] - 1 for ra, rb in zip(results[("irbench", a)], results[("irbench", b)])]
        down = sum(1 for c in changes if c < 0)
        if down == len(changes) and len(changes) >= 5:
            significant.append(f"{a}->{b}")
        print(f"  step {a:>3} -> {b:<3}: {100 * statistics.median(changes):+6.1f} % "
              f"(repeats {100 * min(changes):+.1f} to {100 * max(changes):+.1f} %), lower in {down}/{len(changes)} repeats")
    verdict = "yes" if not significant else "NO (" + ", ".join(significant) + ")"
    print(f"irbench runs/s never lower at a higher concurrency in every paired repeat (sign test, >= 5 repeats): {verdict}")


if __name__ == "__main__":
    main()
