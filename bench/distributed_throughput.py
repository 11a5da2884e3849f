"""End-to-end throughput of the distributed executor against the local one, runs/second.

Zero-latency simulator (its own process), no rate limits, a concurrency cap far above what is
used: the figures are irbench's own per-run cost. Measured in ONE invocation, same campaign
shape each time: the local executor (``run_local`` on ``run_event_loop``, in this process), then
``run_campaign_celery`` with 1, 2 and 4 ``celery worker`` processes (threads pool) on a private
redis-server. Each worker set gets a small warm-up campaign first (worker start-up, imports,
connection pools), which is not timed. The distributed path's cost per run is reported as
``ms/run`` minus the local executor's ``ms/run`` (wall time per run, i.e. inverse throughput).

For each timed campaign it also prints, per run: the CPU time (ms) of the workers together, of
this process (orchestrator, or the local executor), of the simulator and of redis-server (from
``/proc``: on 2 shared cores CPU per run is what bounds throughput, and it is less sensitive to
other load than wall time), and Redis's own counts of read events (``rt``: about one per round
trip) and of commands (``cmds``; a script's own ``redis.call``s count, one each), and the whole
machine's context switches (``cs``, ``/proc/stat``: other processes' included). The local row's
CPU includes its writer process (reaped when the campaign ends).

    python bench/distributed_throughput.py [--runs 600] [--workers 1,2,4] [--threads 8] [--run-slots 64]
                                           [--local-concurrency 16] [--runs-per-message 0,16] [--no-bare]
                                           [--pairs 1]
                                           [--baseline-src DIR --rounds 2]

``--runs-per-message``: each worker set runs the timed campaign once per value (the
orchestrator's ``runs_per_message``: runs carried by one broker message; 0, the default, is the
orchestrator's auto size). ``--run-slots``: each worker's run slots (``IRBENCH_RUN_SLOTS``;
default 64, the workers' own default; 0: their threads). ``--pairs N``: on the last
worker set, N rounds of the timed campaigns with the local executor measured again between them
and after them; ``x_pair`` is each irbench row's runs/s over the mean of the local rows right
before and after it, and a summary line gives its median over the rounds (this machine's speed
drifts within minutes: a ratio to one local run at the start mixes that drift in).

Then, on the same Redis and simulator, each worker count runs the **bare Celery reference**
(``bench/bare_celery.py``: stock Celery making the same calls in messages of the same shape,
with none of irbench's claims, records, spool or done markers) once per ``--runs-per-message``
value; ``x_bare`` is irbench's runs/s over that row's (``--no-bare`` skips it).

``--baseline-src DIR``: also measure another source tree (e.g. ``git archive main | tar -x -C
DIR``), alternating DIR and this tree ``--rounds`` times; each measurement is a fresh process
with its own redis-server, simulator and workers (``--src``: run one measurement from a tree).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODEL = "tp-zero"
PROMPTS = 20
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _use_tree(src: Path) -> None:
    """Import the project (and ``_cluster``) from ``src`` instead of this tree."""
    mine = {str(HERE), str(HERE.parent)}
    sys.path[:] = [str(src / "bench"), str(src)] + [p for p in sys.path if p not in mine]


def cpu_s(pid: int, reaped: bool = False) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads); with ``reaped``, plus its
    children that have exited and been waited for (the local executor's writer process)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return sum(int(f) for f in fields[11:15 if reaped else 13]) / CLK_TCK


def context_switches() -> int:
    """Context switches of the whole machine since boot (``/proc/stat``)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("ctxt "):
            return int(line.split()[1])
    return 0


def redis_counts(client: Any) -> tuple[int, int]:
    """(read events, top-level commands) redis-server has processed."""
    s = client.info("stats")
    return int(s["total_reads_processed"]), int(s["total_commands_processed"])


def campaign(tmp: Path, name: str, base_url: str, runs: int, cap: int) -> Any:
    """``runs`` runs (rounded up to a multiple of the prompt count) of one unlimited model."""
    from _cluster import write_campaign

    from orchestrator.campaign.prepared import prepare
    from orchestrator.campaign.spec import load_campaign

    per_cell = max(1, -(-runs // PROMPTS))
    fields = {MODEL: {"max_concurrency": cap}}
    return prepare(load_campaign(write_campaign(tmp, name, base_url, fields, prompts=PROMPTS, runs=per_cell)))


def _pids(c: Any) -> dict[str, list[int]]:
    workers = [p.pid for p in (c.workers.procs if c.workers is not None else []) if p is not None]
    return {"workers": workers, "self": [os.getpid()], "sim": [c.sim.process.pid], "redis": [c.redis._proc.pid]}


def measured(c: Any, label: str, n_runs: int, body: Any) -> dict[str, Any]:
    """Run ``body()`` and return its row: wall seconds, CPU ms per run by component, Redis
    read events and commands per run."""
    import redis

    client = redis.Redis.from_url(c.url)
    pids = _pids(c)
    before = {k: sum(cpu_s(p, reaped=k == "self") for p in v) for k, v in pids.items()}
    rt0, cmd0 = redis_counts(client)
    cs0, t0 = context_switches(), time.perf_counter()
    body()
    elapsed, cs1 = time.perf_counter() - t0, context_switches()
    rt1, cmd1 = redis_counts(client)
    after = {k: sum(cpu_s(p, reaped=k == "self") for p in v) for k, v in pids.items()}
    client.close()
    row = {"label": label, "runs": n_runs, "seconds": elapsed, "rt": (rt1 - rt0) / n_runs, "cmds": (cmd1 - cmd0) / n_runs,
           "cs": (cs1 - cs0) / n_runs}
    row.update({f"cpu_{k}": 1000 * (after[k] - before[k]) / n_runs for k in pids})
    return row


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every timed campaign of one invocation (one tree), as rows."""
    from _cluster import BenchCluster, interrupt_as_keyboard

    from orchestrator.distributed.executor import CeleryOptions, CeleryRun, run_campaign_celery
    from orchestrator.local.executor import LocalOptions, run_event_loop, run_local
    from storage.runs import RunStore
    from workers.logs import configure_logging
    from workers.runtask import ModelLimits

    levels = [int(x) for x in args.workers.split(",")]
    per_message = [int(x) for x in args.runs_per_message.split(",")]
    slots = args.run_slots or args.threads
    cap = max(args.local_concurrency, slots * max(levels)) * 2  # never the bottleneck
    configure_logging(level="WARNING")
    env = {"IRBENCH_LOG_LEVEL": "WARNING", "IRBENCH_RUN_SLOTS": str(slots)}  # INFO lines per run cost CPU on 2 cores
    rows: list[dict[str, Any]] = []

    def time_celery(c: BenchCluster, prepared: Any, store: RunStore, k: int) -> None:
        # no analysis (on the workers it would overlap the next timing); the default poll interval
        # (0.25 s), the product's own; 0.05 s costs the orchestrator more CPU than it saves in lag
        opts = CeleryOptions(analyze_on_complete=False, runs_per_message=k)
        summary = run_campaign_celery(prepared, store, c.url, CeleryRun(options=opts, timeout_s=600))
        n = len(prepared.tasks)
        if summary.executed != n or summary.interrupted:
            raise SystemExit(f"{prepared.spec.name}: {summary.executed}/{n} stored, interrupted={summary.interrupted}")

    with tempfile.TemporaryDirectory(prefix="irbench-bench-") as tmp, interrupt_as_keyboard():
        tmp_path = Path(tmp)
        (tmp_path / "sim.toml").write_text(f"seed = 1\n[models.{MODEL}]\n")
        with BenchCluster(tmp_path / "sim.toml", workers=0, concurrency=args.threads, worker_env=env) as c:
            base = c.sim.base_url
            local_opts = LocalOptions()

            def time_local(name: str, n: int) -> dict[str, Any]:
                prepared = campaign(tmp_path, name, base, n, cap)
                tasks = [t.model_copy(update={"limits": ModelLimits(max_concurrency=args.local_concurrency)})
                         for t in prepared.tasks]
                store = RunStore(tmp_path / f"data-{name}")
                result: dict[str, Any] = {}

                def local() -> None:
                    result["summary"] = run_event_loop(run_local(tasks, store, secrets={}, options=local_opts))

                row = measured(c, f"local x{args.local_concurrency}", len(tasks), local)
                if result["summary"].executed != len(tasks):
                    raise SystemExit(f"{name}: {result['summary'].executed}/{len(tasks)} stored")
                print(f"local executor ({args.local_concurrency} coroutines): {row['runs'] / row['seconds']:.1f} runs/s",
                      file=sys.stderr, flush=True)
                return row

            time_local("tp-local-warm", 60)
            rows.append(time_local("tp-local", args.runs))
            for level in levels:
                c.restart_workers(level)
                warm = campaign(tmp_path, f"tp-w{level}-warm", base, 20 * level * args.threads // 4, cap)
                time_celery(c, warm, RunStore(tmp_path / f"data-w{level}-warm"), 1)
                for pair in range(args.pairs):
                    if pair:  # the local executor again, between this level's rounds (x_pair)
                        rows.append(time_local(f"tp-local-w{level}-{pair}", args.runs))
                    for k in per_message:
                        name = f"tp-w{level}-k{k}" + (f"-{pair}" if pair else "")
                        prepared = campaign(tmp_path, name, base, args.runs, cap)
                        store = RunStore(tmp_path / f"data-{name}")
                        row = measured(c, f"celery {level}x{args.threads} k{k}", len(prepared.tasks),
                                       lambda p=prepared, s=store, k=k: time_celery(c, p, s, k))
                        rows.append(row)
                        print(f"celery, {level} worker(s) x {args.threads} threads, {k} run(s)/message: "
                              f"{row['runs'] / row['seconds']:.1f} runs/s", file=sys.stderr, flush=True)
                if args.pairs > 1:
                    rows.append(time_local(f"tp-local-w{level}-end", args.runs))
                if args.bare:
                    rows += measure_bare(c, tmp_path, level, per_message, args, cap)
    return rows


def measure_bare(c: Any, tmp_path: Path, level: int, per_message: list[int], args: argparse.Namespace,
                 cap: int) -> list[dict[str, Any]]:
    """The bare Celery reference (``bench/bare_celery.py``) on ``level`` workers: the same
    calls, the same message sizes, on the same Redis and simulator; one row per ``k``."""
    import redis
    from bare_celery import DONE_KEY, QUEUE, make_app, send_calls, wait_for
    from local_throughput import request_bodies

    rows = []
    c.restart_workers(level, app="bench.bare_celery", queues=QUEUE)
    sender, client = make_app(c.url), redis.Redis.from_url(c.url)
    url = f"{c.sim.base_url}/v1/chat/completions"
    try:
        for name, n, ks in (("warm", 20 * level * args.threads // 4, [1]), ("timed", args.runs, per_message)):
            bodies = request_bodies(list(campaign(tmp_path, f"bare-w{level}-{name}", c.sim.base_url, n, cap).tasks))
            for k in ks:
                if k == 0:  # auto: the size the orchestrator picks for these workers and this campaign
                    from orchestrator.distributed.options import CeleryOptions
                    from orchestrator.distributed.message_size import auto_runs_per_message
                    k = auto_runs_per_message(level * args.threads, min(CeleryOptions().max_outstanding, len(bodies)))
                client.set(DONE_KEY, 0)

                def body(bodies: list = bodies, k: int = k) -> None:
                    send_calls(sender, url, bodies, k)
                    wait_for(client, len(bodies))

                row = measured(c, f"bare {level}x{args.threads} k{k}", len(bodies), body)
                if name == "timed":
                    rows.append(row)
                    print(f"bare celery, {level} worker(s) x {args.threads} threads, {k} call(s)/message: "
                          f"{row['runs'] / row['seconds']:.1f} calls/s", file=sys.stderr, flush=True)
    finally:
        client.close()
        sender.close()
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    """One line per row; ratios and overhead against the local row of the same measurement, and
    (``x_bare``) each irbench row's runs/s over the bare Celery row of the same shape."""
    pair = _pair_ratios(rows)
    print(f"{'tree':>5} {'executor':>18} {'runs':>5} {'seconds':>7} {'runs/s':>7} {'x_local':>7} {'x_pair':>6} {'x_bare':>6} "
          f"{'ms/run':>6} {'overhead_ms':>11} | {'cpu ms/run: workers':>19} {'self':>5} {'sim':>5} {'redis':>5} "
          f"{'total':>6} | {'rt/run':>6} {'cmds/run':>8} {'cs/run':>6}")
    bare = {(r.get("tree"), r["label"].split(" ", 1)[1]): r["runs"] / r["seconds"]
            for r in rows if r["label"].startswith("bare")}
    local_ms = 0.0
    for i, r in enumerate(rows):
        ms = 1000 * r["seconds"] / r["runs"]
        if r["label"].startswith("local"):
            local_ms = ms
        over = "-" if r["label"].startswith("local") else f"{ms - local_ms:+.2f}"
        ref = bare.get((r.get("tree"), r["label"].split(" ", 1)[1])) if r["label"].startswith("celery") else None
        x_bare = "-" if ref is None else f"{r['runs'] / r['seconds'] / ref:.2f}"
        total = r["cpu_workers"] + r["cpu_self"] + r["cpu_sim"] + r["cpu_redis"]
        x_pair = f"{pair[i]:.2f}" if i in pair else "-"
        print(f"{r.get('tree', 'this'):>5} {r['label']:>18} {r['runs']:>5} {r['seconds']:>7.2f} {r['runs'] / r['seconds']:>7.1f} "
              f"{local_ms / ms:>7.2f} {x_pair:>6} {x_bare:>6} {ms:>6.2f} {over:>11} | {r['cpu_workers']:>19.2f} {r['cpu_self']:>5.2f} "
              f"{r['cpu_sim']:>5.2f} {r['cpu_redis']:>5.2f} {total:>6.2f} | {r['rt']:>6.2f} {r['cmds']:>8.2f} {r.get('cs', 0.0):>6.2f}")


def _pair_ratios(rows: list[dict[str, Any]]) -> dict[int, float]:
    """Per irbench row (by index): its runs/s over the mean runs/s of the local rows measured
    right before and right after it (``--pairs``; with one local row around, that one). On these
    machines the speed drifts by up to 2x within minutes, so a ratio to a local run made minutes
    earlier says as much about the drift as about irbench; the bracketing locals cancel most of it."""
    rate = [r["runs"] / r["seconds"] for r in rows]
    local = [i for i, r in enumerate(rows) if r["label"].startswith("local")]
    out = {}
    for i, r in enumerate(rows):
        if not r["label"].startswith("celery"):
            continue
        near = [j for j in local if j < i][-1:] + [j for j in local if j > i][:1]
        if near:
            out[i] = rate[i] / (sum(rate[j] for j in near) / len(near))
    return out


def pair_summary(rows: list[dict[str, Any]]) -> None:
    """Each irbench configuration's ``x_pair`` over the ``--pairs`` rounds: median and range."""
    by: dict[str, list[float]] = {}
    for i, x in _pair_ratios(rows).items():
        by.setdefault(f"{rows[i].get('tree', 'this')} {rows[i]['label']}", []).append(x)
    for label, xs in by.items():
        if len(xs) > 1:
            print(f"{label}: x_pair median {statistics.median(xs):.2f} over {len(xs)} rounds (min {min(xs):.2f}, max {max(xs):.2f})")


def loadavg() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def alternate(args: argparse.Namespace, argv: list[str]) -> None:
    """``--rounds`` times: the baseline tree, then this one, each a fresh ``--src`` process."""
    trees = [("base", Path(args.baseline_src).resolve()), ("this", HERE.parent)]
    rows = []
    for rnd in range(args.rounds):
        for name, src in trees:
            load = loadavg()
            out = subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv, "--src", str(src), "--json"],
                                 check=True, capture_output=True, text=True).stdout
            got = json.loads(out.strip().splitlines()[-1])
            for r in got:
                r["tree"] = name
            print(f"round {rnd + 1} {name} ({src}): load before {load}, after {loadavg()}", flush=True)
            print_table(got)
            rows += got
    print(f"\nload average at the end {loadavg()}")
    pair_summary(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=600)
    parser.add_argument("--workers", default="1,2,4", help="worker process counts to measure")
    parser.add_argument("--threads", type=int, default=8, help="threads per worker (-c)")
    parser.add_argument("--run-slots", type=int, default=64, help="runs each worker executes at once (0: --threads)")
    parser.add_argument("--local-concurrency", type=int, default=16, help="coroutines of the local executor")
    parser.add_argument("--runs-per-message", default="0", help="comma-separated: runs per broker message to measure (0: auto)")
    parser.add_argument("--pairs", type=int, default=1,
                        help="rounds of (local executor, irbench) on the last worker set, for x_pair (see _pair_ratios)")
    parser.add_argument("--no-bare", dest="bare", action="store_false",
                        help="skip the bare Celery reference (bench/bare_celery.py)")
    parser.add_argument("--baseline-src", default=None, help="another source tree to measure, alternating with this one")
    parser.add_argument("--rounds", type=int, default=2, help="with --baseline-src: how many times each tree runs")
    parser.add_argument("--src", default=None, help=argparse.SUPPRESS)  # measure this tree (a child of --baseline-src)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_src and not args.src:
        argv = ["--runs", str(args.runs), "--workers", args.workers, "--threads", str(args.threads),
                "--run-slots", str(args.run_slots), "--local-concurrency", str(args.local_concurrency), "--runs-per-message", args.runs_per_message,
                "--pairs", str(args.pairs), *([] if args.bare else ["--no-bare"])]
        alternate(args, argv)
        return
    if args.src:
        _use_tree(Path(args.src).resolve())
    load_before = loadavg()
    rows = measure(args)
    if args.json:
        print(json.dumps(rows))
        return
    print(f"\nload average before {load_before}, after {loadavg()}")
    print_table(rows)
    pair_summary(rows)


if __name__ == "__main__":
    main()
