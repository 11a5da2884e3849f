"""``campaign_scale.py --stop-after-s``: a campaign too large to finish, measured on its way in.

From the moment the orchestrator starts planning (the corpus read, the store scanned for what is
done) it is stopped after ``--stop-after-s``; until then a watcher polls the simulator's request
count and the store's file list. Figures: seconds to the first call the simulator received and to
the first stored run, runs stored by the stop, the orchestrator's peak RSS (this process: the
local executor runs here, and so does the distributed executor's orchestrator) and then
``irbench status`` of the campaign in a child process (wall seconds and that child's peak RSS).
Also the helpers both modes share: the simulator's configuration and call count, the campaign
file, this process's peak RSS and a child measured by a launcher.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
from _cluster import BenchCluster, write_campaign

from orchestrator.campaign.prepared import prepare
from orchestrator.campaign.spec import load_campaign
from orchestrator.local.campaign import run_campaign_local
from simulator.server import start_subprocess
from storage.runs import RunStore

# Runs the command and prints "<wall s> <peak RSS KiB of its child>". A launcher because Linux
# starts a child's ru_maxrss at the RSS of the process it was forked from.
MEASURE = """import resource, subprocess, sys, time
t0 = time.perf_counter()
rc = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True)
sys.exit(rc)
"""


def measured_child(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of ``cmd`` run in a child of a small launcher."""
    proc = subprocess.run([sys.executable, "-c", MEASURE, *cmd], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[2:4])} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    wall, rss_kib = proc.stdout.split()[-2:]
    return float(wall), float(rss_kib) / 1024  # Linux: KiB


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


def sim_toml(models: list[str]) -> str:
    """Zero latency, no failures: the simulator's defaults for every model."""
    return "seed = 1\n" + "".join(f"[models.{m}]\n" for m in models)


def scale_campaign_file(
    directory: Path, name: str, base_url: str, models: list[str], prompts: int, runs: int,
    model_concurrency: int, executor_concurrency: int,
) -> Path:
    """Every model × every generated prompt × ``runs``, unlimited, ``model_concurrency`` each."""
    fields = {m: {"max_concurrency": model_concurrency} for m in models}
    path = write_campaign(directory, name, base_url, fields, prompts=prompts, runs=runs)
    path.write_text(path.read_text() + f"[executor]\nconcurrency = {executor_concurrency}\n")
    return path


def sim_calls(base_url: str) -> int:
    with urllib.request.urlopen(f"{base_url}/_stats", timeout=30) as resp:
        return sum(m["requests"] for m in json.load(resp)["models"].values())


def self_rss_mib() -> float:
    """Peak RSS of this process so far (MiB): the orchestrator side (and, for local, the executor)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


@dataclass(frozen=True)
class WindowFigures:
    label: str
    planned: int
    stop_after_s: float
    first_call_s: float  # nan: no call before the stop
    first_stored_s: float  # nan: no stored run before the stop
    stored: int
    orchestrator_rss_mib: float
    status_s: float
    status_rss_mib: float


class FirstEvents:
    """Polls ``calls()`` and the store's data files every ``poll_s`` from ``t0`` on and keeps the
    seconds to the first call and to the first published file."""

    def __init__(self, calls: Callable[[], int], store: RunStore, t0: float, poll_s: float = 0.05) -> None:
        self._calls, self._store, self._t0, self._poll_s = calls, store, t0, poll_s
        self.first_call_s = float("nan")
        self.first_stored_s = float("nan")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="first-events", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self._poll_s):
            now = time.perf_counter() - self._t0
            if self.first_call_s != self.first_call_s:  # nan: not seen yet
                try:
                    if self._calls() > 0:
                        self.first_call_s = now
                except OSError:
                    pass
            if self.first_stored_s != self.first_stored_s and self._store.dataset.data_files():
                self.first_stored_s = now
            if self.first_call_s == self.first_call_s and self.first_stored_s == self.first_stored_s:
                return

    def __enter__(self) -> FirstEvents:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def interrupt_after(seconds: float) -> threading.Timer:
    """A started timer that sends this process SIGINT after ``seconds``: the executor's event loop
    takes it as Ctrl-C (it stops, stores what it finished and returns ``interrupted``)."""
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.daemon = True
    timer.start()
    return timer


def stored_rows(store: RunStore) -> int:
    total = 0
    for f in store.dataset.data_files():
        try:
            total += pq.read_metadata(f).num_rows
        except (OSError, ValueError):
            continue
    return total


def status_of(campaign_toml: Path, data: Path, max_planned_runs: int) -> tuple[float, float]:
    """``irbench status`` (the table, store only) in a child: (wall seconds, peak RSS MiB)."""
    return measured_child([sys.executable, "-m", "orchestrator.cli.app", "status", str(campaign_toml),
                           "--data", str(data), "--max-planned-runs", str(max_planned_runs)])


def print_window_table(rows: list[WindowFigures]) -> None:
    print(f"{'executor':>14} {'planned':>10} {'stop_s':>6} {'1st_call_s':>10} {'1st_store_s':>11} {'stored':>8} "
          f"{'orch_MiB':>8} {'status_s':>8} {'status_MiB':>10}")
    for f in rows:
        print(f"{f.label:>14} {f.planned:>10} {f.stop_after_s:>6.0f} {f.first_call_s:>10.1f} {f.first_stored_s:>11.1f} "
              f"{f.stored:>8} {f.orchestrator_rss_mib:>8.0f} {f.status_s:>8.1f} {f.status_rss_mib:>10.0f}")
    sys.stdout.flush()


def run_local_window(args: argparse.Namespace, tmp: Path, models: list[str]) -> WindowFigures:
    """The local executor from planning on, stopped after ``--stop-after-s`` (SIGINT, as Ctrl-C)."""
    (tmp / "sim-local.toml").write_text(sim_toml(models))
    planned = len(models) * args.prompts * args.runs
    with start_subprocess(tmp / "sim-local.toml") as sim:
        path = scale_campaign_file(tmp / "local", "scale-local", sim.base_url, models, args.prompts, args.runs,
                                   args.model_concurrency, args.local_concurrency)
        store = RunStore(tmp / "data-local")
        print(f"\n== local executor: {planned} runs planned, stop after {args.stop_after_s:.0f} s; {load()}", flush=True)
        t0 = time.perf_counter()
        timer = interrupt_after(args.stop_after_s)
        with FirstEvents(lambda: sim_calls(sim.base_url), store, t0) as first:
            try:
                run_campaign_local(prepare(load_campaign(path), max_planned_runs=None), store, secrets={})
            except KeyboardInterrupt:  # the stop came before the executor's loop started
                print(f"local: stopped before the executor started ({time.perf_counter() - t0:.1f} s)", flush=True)
            finally:
                timer.cancel()
        rss = self_rss_mib()
    print(f"local stopped at {time.perf_counter() - t0:.1f} s; {load()}", flush=True)
    status_s, status_rss = status_of(path, store.root, planned)
    return WindowFigures("local", planned, args.stop_after_s, first.first_call_s, first.first_stored_s,
                         stored_rows(store), rss, status_s, status_rss)


def run_celery_window(args: argparse.Namespace, tmp: Path, models: list[str]) -> WindowFigures:
    """The distributed executor from planning on, given up after ``--stop-after-s``."""
    from orchestrator.distributed.executor import CeleryOptions, CeleryRun, run_campaign_celery

    (tmp / "sim-celery.toml").write_text(sim_toml(models))
    planned = len(models) * args.prompts * args.runs
    label = f"celery {args.workers}x{args.threads}"
    env = {"IRBENCH_LOG_LEVEL": "WARNING"}
    with BenchCluster(tmp / "sim-celery.toml", workers=args.workers, concurrency=args.threads, worker_env=env) as c:
        path = scale_campaign_file(tmp / "celery", "scale-celery", c.sim.base_url, models, args.prompts, args.runs,
                                   args.model_concurrency, args.local_concurrency)
        store = RunStore(tmp / "data-celery")
        print(f"\n== {label}: {planned} runs planned, stop after {args.stop_after_s:.0f} s; {load()}", flush=True)
        t0 = time.perf_counter()
        with FirstEvents(lambda: sum(m["requests"] for m in c.sim_stats().values()), store, t0) as first:
            prepared = prepare(load_campaign(path), max_planned_runs=None)
            left_s = max(args.stop_after_s - (time.perf_counter() - t0), 0.1)
            opts = CeleryOptions(analyze_on_complete=False, runs_per_message=args.runs_per_message)
            run_campaign_celery(prepared, store, c.url, CeleryRun(options=opts, timeout_s=left_s))
        rss = self_rss_mib()
    print(f"{label} stopped at {time.perf_counter() - t0:.1f} s; {load()}", flush=True)
    status_s, status_rss = status_of(path, store.root, planned)
    return WindowFigures(label, planned, args.stop_after_s, first.first_call_s, first.first_stored_s,
                         stored_rows(store), rss, status_s, status_rss)
