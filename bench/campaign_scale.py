"""A campaign at scale: models × prompts × runs against the zero-latency simulator, on the local
executor and on N Celery workers, then the analysis of what was stored.

Default size: 50 models × 400 prompts × 5 runs = 100,000 runs (``--models/--prompts/--runs``
make it smaller, e.g. ``--prompts 40`` for 10,000). Every model is unlimited with zero latency,
so the figures are irbench's own costs. Per executor, in one invocation, with a fresh simulator
(its request counts are the endpoint's side of the books) and a fresh store:

* **runs/s over time**: a watcher thread reads the row count of each newly published Parquet
  file of the store (footer only) every ``--sample-s`` and prints stored runs, the rate over the
  last interval and the file count: what a reader of the store sees, spool or buffers excluded;
* **files** and **bytes per run** on disk (every visible data file under ``runs/``, before
  compaction), and files per 100 runs. On the workers that figure depends on throughput: each
  worker's spool publishes a segment after ``IRBENCH_SPOOL_MAX_AGE_S`` (5 s) or
  ``IRBENCH_SPOOL_IDLE_S`` (0.5 s) without an append, so at ``r`` runs/s per worker a file holds
  at most ``5 r`` runs (2 files per 100 runs at 10 runs/s per worker), fewer when a starved
  worker pauses;
* **completion lag**: from the end of the last stored execution (``finished_at``) to the
  executor's return;
* **lost / duplicated**: planned run ids with no stored execution; stored executions beyond one
  per run id; and calls the simulator received against attempts stored (every attempt of every
  stored execution);
* **analysis**: ``irbench analyze`` of that store in a child process: wall time and its peak RSS
  (``wait4``'s ``ru_maxrss`` of that child alone).

The local executor runs in this process (``run_campaign_local``, what ``irbench run`` calls);
the distributed one is ``run_campaign_celery`` with ``--workers`` ``celery worker`` processes
(``--threads`` each) on a private redis-server (``bench/_cluster.py``). The load average is
printed before and after each phase: run it when the machine is as quiet as possible.

    python bench/campaign_scale.py [--models 50] [--prompts 400] [--runs 5]
        [--executors local,celery,celery-s3] [--workers 4] [--threads 8] [--runs-per-message 0]
        [--local-concurrency 64]
        [--model-concurrency 4] [--sample-s 10] [--replicates 2000] [--no-analysis]
        [--total-runs N] [--stop-after-s S]

``--stop-after-s S`` (local, celery) measures a campaign too large to finish: each executor is
stopped S seconds after it starts planning, then the time to its first call and first stored
run, its peak RSS and ``irbench status`` time are printed (``bench/_scale_window.py``), e.g.
``--total-runs 10000000 --runs 50 --executors local --stop-after-s 60``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
from _cluster import BenchCluster, interrupt_as_keyboard

from _scale_window import (
    load, measured_child, print_window_table, run_celery_window, run_local_window, scale_campaign_file, self_rss_mib,
    sim_calls, sim_toml,
)

from orchestrator.campaign.prepared import PreparedCampaign, prepare

from orchestrator.local.campaign import run_campaign_local
from orchestrator.local.executor import ExecutionSummary
from orchestrator.campaign.spec import load_campaign
from simulator.server import start_subprocess
from storage.runs import RunStore


def scale_campaign(
    directory: Path, name: str, base_url: str, models: list[str], prompts: int, runs: int,
    model_concurrency: int, executor_concurrency: int,
) -> PreparedCampaign:
    return prepare(load_campaign(scale_campaign_file(directory, name, base_url, models, prompts, runs,
                                                     model_concurrency, executor_concurrency)),
                   max_planned_runs=None)


class StoreWatcher:
    """Every ``interval_s``, the rows of newly published data files of ``store`` (Parquet footers
    only); prints one line per sample and keeps ``(seconds, rows, files)``."""

    def __init__(self, store: RunStore, interval_s: float, total: int) -> None:
        self.store, self.interval_s, self.total = store, interval_s, total
        self.samples: list[tuple[float, int, int]] = []
        self._rows: dict[Path, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="store-watcher", daemon=True)
        self._t0 = 0.0

    def sample(self) -> tuple[int, int]:
        files = self.store.dataset.data_files()
        for f in files:
            if f not in self._rows:
                try:
                    self._rows[f] = pq.read_metadata(f).num_rows
                except (OSError, ValueError):  # removed (compaction) between listing and reading
                    continue
        present = set(files)
        rows = sum(n for f, n in self._rows.items() if f in present)
        return rows, len(files)

    def _record(self) -> None:
        rows, files = self.sample()
        t = time.perf_counter() - self._t0
        last_t, last_rows = self.samples[-1][:2] if self.samples else (0.0, 0)
        self.samples.append((t, rows, files))
        rate = (rows - last_rows) / (t - last_t) if t > last_t else 0.0
        print(f"{t:>7.1f} {rows:>8} {rate:>8.1f} {files:>6}", flush=True)

    def _loop(self) -> None:
        print(f"{'t_s':>7} {'stored':>8} {'runs/s':>8} {'files':>6}", flush=True)
        while not self._stop.wait(self.interval_s):
            self._record()

    def __enter__(self) -> StoreWatcher:
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._record()  # what the store holds at the executor's return


@dataclass(frozen=True)
class Figures:
    label: str
    planned: int
    seconds: float
    files: int
    bytes_on_disk: int
    lag_s: float
    lost: int
    duplicated: int
    calls: int
    attempts: int
    failed_attempts: dict[str, int]
    analysis_s: float = float("nan")
    analysis_rss_mib: float = float("nan")


def account(label: str, prepared: PreparedCampaign, store: RunStore, seconds: float, returned_at: dt.datetime,
            calls: int) -> Figures:
    """Files, bytes, lag, lost and duplicated runs of one finished campaign."""
    files = store.dataset.data_files()
    table = store.read_executions(campaigns=[prepared.spec.name], columns=["run_id", "attempts", "finished_at"])
    stored_ids = set(table.column("run_id").to_pylist())
    planned_ids = {t.run_id for t in prepared.tasks}
    last_end = pc.max(table.column("finished_at")).as_py()
    flat = pc.list_flatten(table.column("attempts"))
    kinds = pc.value_counts(pc.struct_field(flat, "outcome")).to_pylist() if len(flat) else []
    failed = {k["values"]: k["counts"] for k in kinds if k["values"] != "ok"}
    return Figures(
        label=label,
        planned=len(planned_ids),
        seconds=seconds,
        files=len(files),
        bytes_on_disk=sum(f.stat().st_size for f in files),
        lag_s=(returned_at - last_end).total_seconds() if last_end is not None else float("nan"),
        lost=len(planned_ids - stored_ids),
        duplicated=table.num_rows - len(stored_ids),
        calls=calls,
        attempts=int(pc.sum(pc.list_value_length(table.column("attempts"))).as_py() or 0),
        failed_attempts=failed,
    )


def analyze(data: Path, out: Path, replicates: int) -> tuple[float, float]:
    """``irbench analyze`` of ``data`` in a child process: (wall seconds, peak RSS MiB of that child)."""
    return measured_child([sys.executable, "-m", "orchestrator.cli.app", "analyze", "--data", str(data), "--out",
                           str(out), "--replicates", str(replicates)])


def watched(store: RunStore, args: argparse.Namespace, n: int, execute: Callable[[], ExecutionSummary]
            ) -> tuple[ExecutionSummary, float, dt.datetime]:
    """``execute()`` under a StoreWatcher: (summary, seconds, UTC time it returned)."""
    with StoreWatcher(store, args.sample_s, n):
        t0 = time.perf_counter()
        summary = execute()
        seconds = time.perf_counter() - t0
        returned = dt.datetime.now(dt.timezone.utc)
    return summary, seconds, returned


def run_local_phase(args: argparse.Namespace, tmp: Path, models: list[str]) -> Figures:
    (tmp / "sim-local.toml").write_text(sim_toml(models))
    with start_subprocess(tmp / "sim-local.toml") as sim:
        prepared = scale_campaign(tmp / "local", "scale-local", sim.base_url, models, args.prompts, args.runs,
                                  args.model_concurrency, args.local_concurrency)
        store = RunStore(tmp / "data-local")
        n = len(prepared.tasks)
        print(f"\n== local executor: {n} runs, {args.local_concurrency} in flight; {load()}", flush=True)
        summary, seconds, returned = watched(store, args, n, lambda: run_campaign_local(prepared, store, secrets={})[1])
        if summary.executed != n or summary.interrupted:
            raise SystemExit(f"local: {summary.executed}/{n} executed, interrupted={summary.interrupted}")
        figures = account("local", prepared, store, seconds, returned, sim_calls(sim.base_url))
    print(f"local done in {seconds:.1f} s; bench process peak RSS {self_rss_mib():.0f} MiB; {load()}", flush=True)
    return figures


def run_celery_phase(args: argparse.Namespace, tmp: Path, models: list[str]) -> Figures:
    from orchestrator.distributed.executor import CeleryOptions, CeleryRun, run_campaign_celery

    (tmp / "sim-celery.toml").write_text(sim_toml(models))
    env = {"IRBENCH_LOG_LEVEL": "WARNING"}  # per-run INFO lines cost CPU on a 2-core box
    label = f"celery {args.workers}x{args.threads} " + (f"k{args.runs_per_message}" if args.runs_per_message else "k auto")
    with BenchCluster(tmp / "sim-celery.toml", workers=args.workers, concurrency=args.threads, worker_env=env) as c:
        prepared = scale_campaign(tmp / "celery", "scale-celery", c.sim.base_url, models, args.prompts, args.runs,
                                  args.model_concurrency, args.local_concurrency)
        store = RunStore(tmp / "data-celery")
        n = len(prepared.tasks)
        print(f"\n== {label}: {n} runs; {load()}", flush=True)
        opts = CeleryOptions(analyze_on_complete=False, runs_per_message=args.runs_per_message)
        summary, seconds, returned = watched(
            store, args, n, lambda: run_campaign_celery(prepared, store, c.url, CeleryRun(options=opts, timeout_s=args.timeout_s))
        )
        if summary.interrupted:
            print(f"{label}: interrupted after {seconds:.0f} s ({summary.executed}/{n} stored)", flush=True)
        figures = account(label, prepared, store, seconds, returned, sum(m["requests"] for m in c.sim_stats().values()))
    print(f"{label} done in {seconds:.1f} s; bench process peak RSS {self_rss_mib():.0f} MiB; {load()}", flush=True)
    return figures


def run_bucket_phase(args: argparse.Namespace, tmp: Path, models: list[str]) -> Figures:
    """The distributed phase on an S3 bucket (SeaweedFS on loopback): each worker's spool on local
    disk, uploads announced in Redis, the orchestrator on a mirror (``--data s3://…``)."""
    from deploy.seaweed_server import SeaweedServer
    from orchestrator.distributed.executor import CeleryOptions, CeleryRun, run_campaign_celery
    from storage.objectstore.location import parse_store_url
    from storage.objectstore.session import BucketOptions, BucketSession

    (tmp / "sim-s3.toml").write_text(sim_toml(models))
    label = f"celery-s3 {args.workers}x{args.threads}"
    with SeaweedServer() as s3:
        os.environ.update(s3.env())
        url = f"s3://{s3.bucket}/scale"
        env = {"IRBENCH_LOG_LEVEL": "WARNING", **s3.env(), "IRBENCH_DATA": url, "IRBENCH_SPOOL_DIR": str(tmp / "spool-s3")}
        with BenchCluster(tmp / "sim-s3.toml", workers=args.workers, concurrency=args.threads, worker_env=env) as c:
            prepared = scale_campaign(tmp / "celery-s3", "scale-s3", c.sim.base_url, models, args.prompts, args.runs,
                                      args.model_concurrency, args.local_concurrency)
            session = BucketSession(parse_store_url(url), BucketOptions(cache_dir=tmp / "cache-s3")).open()
            store = RunStore(session.root)
            n = len(prepared.tasks)
            print(f"\n== {label}: {n} runs; {load()}", flush=True)
            opts = CeleryOptions(analyze_on_complete=False, runs_per_message=args.runs_per_message)
            summary, seconds, returned = watched(store, args, n, lambda: run_campaign_celery(
                prepared, store, c.url, CeleryRun(options=opts, timeout_s=args.timeout_s, bucket=session)))
            figures = account(label, prepared, store, seconds, returned, sum(m["requests"] for m in c.sim_stats().values()))
            session.close()
        if not args.no_analysis:
            print(f"analysing {url} from a fresh cache; {load()}", flush=True)
            os.environ["IRBENCH_S3_CACHE"] = str(tmp / "cache-analyze")
            wall, rss = analyze(url, tmp / "out-celery-s3", args.replicates)  # type: ignore[arg-type]  (a URL is a --data too)
            figures = Figures(**{**figures.__dict__, "analysis_s": wall, "analysis_rss_mib": rss})
    print(f"{label} done in {seconds:.1f} s; {load()}", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--runs", type=int, default=5, help="runs per (model, prompt)")
    parser.add_argument("--total-runs", type=int, default=None, help="runs in all: sets --prompts to this ÷ "
                        "(models × runs), e.g. --total-runs 10000000 --runs 50 is 50 × 4000 × 50")
    parser.add_argument("--stop-after-s", type=float, default=None, help="stop each executor this long after it "
                        "starts planning and print time to first call, orchestrator RSS and status time (no analysis)")
    parser.add_argument("--executors", default="local,celery", help="comma-separated: local, celery, celery-s3 "
                        "(the distributed executor on an S3 bucket: SeaweedFS on loopback)")
    parser.add_argument("--workers", type=int, default=4, help="celery worker processes")
    parser.add_argument("--threads", type=int, default=8, help="threads per worker (-c)")
    parser.add_argument("--runs-per-message", type=int, default=0, help="runs per broker message (celery; 0: auto, the default)")
    parser.add_argument("--local-concurrency", type=int, default=64, help="runs in flight in the local executor")
    parser.add_argument("--model-concurrency", type=int, default=4, help="max_concurrency of every model")
    parser.add_argument("--sample-s", type=float, default=10.0, help="seconds between store samples")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="give up on the distributed campaign")
    parser.add_argument("--replicates", type=int, default=2000, help="bootstrap replicates of the analysis")
    parser.add_argument("--no-analysis", action="store_true", help="skip irbench analyze")
    parser.add_argument("--keep", type=Path, default=None, help="work in this directory and keep the stores")
    args = parser.parse_args()
    from workers.logs import configure_logging

    configure_logging(level="WARNING")
    models = [f"m{i:02d}" for i in range(args.models)]
    if args.total_runs is not None:
        args.prompts, rest = divmod(args.total_runs, args.models * args.runs)
        if rest or not args.prompts:
            raise SystemExit(f"--total-runs {args.total_runs} is not a multiple of models × runs")
    if args.stop_after_s is not None:
        window_rows = []
        with tempfile.TemporaryDirectory(prefix="irbench-scale-") as tmp, interrupt_as_keyboard():
            tmp_path = Path(tmp) if args.keep is None else args.keep
            tmp_path.mkdir(parents=True, exist_ok=True)
            for name in args.executors.split(","):
                window = {"local": run_local_window, "celery": run_celery_window}[name]
                window_rows.append(window(args, tmp_path, models))
                print_window_table(window_rows[-1:])
        print(f"\n{args.models} models x {args.prompts} prompts x {args.runs} runs; {load()}")
        print_window_table(window_rows)
        return
    phases = {"local": run_local_phase, "celery": run_celery_phase, "celery-s3": run_bucket_phase}
    rows: list[Figures] = []
    with tempfile.TemporaryDirectory(prefix="irbench-scale-") as tmp, interrupt_as_keyboard():
        tmp_path = Path(tmp) if args.keep is None else args.keep
        tmp_path.mkdir(parents=True, exist_ok=True)
        for name in args.executors.split(","):
            figures = phases[name](args, tmp_path, models)
            if not args.no_analysis and name != "celery-s3":  # that phase analyses from the bucket itself
                data = tmp_path / f"data-{name}"
                print(f"analysing {data.name} ({args.replicates} replicates); {load()}", flush=True)
                wall, rss = analyze(data, tmp_path / f"out-{name}", args.replicates)
                figures = Figures(**{**figures.__dict__, "analysis_s": wall, "analysis_rss_mib": rss})
            rows.append(figures)
            print_table([figures])  # each phase's row as soon as it is known: a later phase may fail

    print(f"\n{args.models} models x {args.prompts} prompts x {args.runs} runs; {load()}")
    print_table(rows)


def print_table(rows: list[Figures]) -> None:
    """The summary table of ``rows``, then the non-ok attempts of each executor by outcome."""
    print(f"{'executor':>14} {'runs':>7} {'seconds':>8} {'runs/s':>7} {'files':>6} {'files/100':>9} "
          f"{'B/run':>6} {'lag_s':>6} {'lost':>5} {'dup':>5} {'calls':>7} {'attempts':>8} "
          f"{'analyze_s':>9} {'rss_MiB':>7}")
    for f in rows:
        print(f"{f.label:>14} {f.planned:>7} {f.seconds:>8.1f} {f.planned / f.seconds:>7.1f} {f.files:>6} "
              f"{100 * f.files / f.planned:>9.2f} {f.bytes_on_disk / f.planned:>6.0f} {f.lag_s:>6.2f} {f.lost:>5} "
              f"{f.duplicated:>5} {f.calls:>7} {f.attempts:>8} {f.analysis_s:>9.1f} {f.analysis_rss_mib:>7.0f}")
    for f in rows:
        if f.failed_attempts:
            print(f"{f.label}: attempts that did not succeed, by outcome: {f.failed_attempts}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
