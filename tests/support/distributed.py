"""The cluster and the helpers of the distributed tests (tests/test_distributed*.py, test_soak,
test_analysis_jobs): the workers' test settings (``WORKER_ENV``, ``FAST``), the module-scoped
``cluster`` (redis-server with AOF, three ``celery worker`` processes) and ``live`` fixtures,
``make_campaign`` (a campaign file against the simulator), ``sim``, the checks that every run
was stored and every call is an attempt, ``Background`` (the orchestrator in a thread) and
``wait_for``. Test modules import the ``cluster`` and ``live`` fixtures by name; each module
that does gets its own cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bench._cluster import write_campaign
from tests.support.workers import CeleryWorkers
from deploy.redis_server import RedisServer
from orchestrator.campaign.prepared import PreparedCampaign
from orchestrator.distributed.executor import CeleryOptions, CeleryRun, run_campaign_celery
from orchestrator.local.executor import ExecutionSummary
from simulator.config import SimConfig, SimModel
from simulator.server import RunningSimulator, start_background
from simulator.wire import WireCapture
from storage.runs import RunStore
from storage.parquet.spool import pending_rows
from workers.celery.runtime import WorkerSettings

LIMIT_PERIOD_S = 1.0  # workers count requests_per_minute per second here, to test windows quickly
WORKER_ENV = {
    "IRBENCH_CLAIM_TTL_S": "3",
    "IRBENCH_LEASE_TTL_S": "3",
    "IRBENCH_MAX_WAIT_S": "1",
    "IRBENCH_MIN_DEFER_S": "0.3",
    "IRBENCH_MAX_DEFER_S": "3",
    "IRBENCH_REDIS_RETRY_S": "30",
    "IRBENCH_LIMIT_PERIOD_S": str(LIMIT_PERIOD_S),
    "IRBENCH_RUN_SLOTS": "4",  # = the cluster's threads (default 64): the slot bound shows at test scale
}
RUN_SLOTS = int(WORKER_ENV["IRBENCH_RUN_SLOTS"])  # answered calls a SIGKILLed worker may lose
ALLOWANCE_S = WorkerSettings.limit_jitter_allowance_s  # the workers' grant-to-send bound (not overridden above)
FAST = CeleryOptions(claim_ttl_s=3.0, reconcile_interval_s=1.0)


@dataclass
class Cluster:
    redis: RedisServer
    workers: CeleryWorkers

    @property
    def url(self) -> str:
        return self.redis.url


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with RedisServer(aof=True) as srv, CeleryWorkers(srv.url, count=3, concurrency=4, env=WORKER_ENV) as workers:
        yield Cluster(srv, workers)


@pytest.fixture
def live(cluster: Cluster) -> Iterator[Cluster]:
    """The shared cluster with every worker up (a previous test may have killed one)."""
    if not cluster.redis.running:
        cluster.redis.start()
    cluster.workers.ensure_running()
    yield cluster


#: the cluster's campaign defaults: short timeouts (a hang is cut fast), 4 calls per model at most
TEST_DEFAULTS = {"max_concurrency": 4, "connect_timeout_s": 2, "read_timeout_s": 10, "total_timeout_s": 10}


def make_campaign(
    tmp: Path, name: str, base_url: str, models: dict[str, dict], *, prompts: int = 4, runs: int = 3,
    retry: dict | None = None,
) -> Path:
    """``bench._cluster.write_campaign`` with the test cluster's defaults."""
    return write_campaign(tmp, name, base_url, models, prompts=prompts, runs=runs, defaults=TEST_DEFAULTS, retry=retry)


def sim(models: dict[str, SimModel]) -> RunningSimulator:
    return start_background(SimConfig(seed=11, models=models))


@contextlib.contextmanager
def wire_capture(port: int) -> Iterator[WireCapture | None]:
    """Requests and replies on the wire when we may open an AF_PACKET socket (root on Linux),
    else None (the caller falls back to the simulator's stamps)."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        yield None
        return
    with WireCapture(port, replies=True) as wire:
        yield wire


def stats(base_url: str) -> dict:
    with urllib.request.urlopen(f"{base_url}/_stats", timeout=5) as resp:
        return json.load(resp)["models"]


def executions_per_run(store: RunStore, campaign: str | None = None) -> Counter[str]:
    """Distinct executions per run_id over every published file, read one by one (NOT the
    deduplicating reader): what the endpoint's calls must be matched against. ``campaign``: only
    its rows (a store several campaigns share)."""
    seen: set[tuple[str, str]] = set()
    for f in sorted((store.root / "runs").rglob("*.parquet")):
        if not f.name.startswith("."):
            t = pq.read_table(f, columns=["run_id", "execution_id", "campaign"])
            rows = zip(t.column("run_id").to_pylist(), t.column("execution_id").to_pylist(),
                       t.column("campaign").to_pylist())
            seen.update((r, e) for r, e, c in rows if campaign is None or c == campaign)
    return Counter(r for r, _ in seen)


def attempts_by_model(store: RunStore, campaign: str) -> Counter[str]:
    """Attempts of every stored execution (every file, copies of one execution counted once)."""
    t = store.read_executions(campaigns=[campaign], columns=["model", "attempts"])
    out: Counter[str] = Counter()
    for model, attempts in zip(t.column("model").to_pylist(), t.column("attempts").to_pylist()):
        out[model] += len(attempts)
    return out


def assert_every_run_stored(store: RunStore, prepared: PreparedCampaign, *, max_duplicates: int = 0) -> Counter[str]:
    """Every planned run has at least one execution; at most ``max_duplicates`` have more."""
    execs = executions_per_run(store, prepared.spec.name)
    planned = {t.run_id for t in prepared.tasks}
    assert set(execs) == planned, f"missing {len(planned - set(execs))}, extra {len(set(execs) - planned)}"
    dup = {r: n for r, n in execs.items() if n != 1}
    assert len(dup) <= max_duplicates, f"{len(dup)} runs executed more than once"
    assert len(store.read_records(campaigns=[prepared.spec.name])) == len(planned)  # analysis: one per run
    return execs


def settle(store: RunStore, url: str, campaign: str, timeout_s: float = 15.0) -> None:
    """Wait until no execution of ``campaign`` is still running and every spool is published: a
    duplicate execution (a claim that expired under load) may still be finishing when the
    orchestrator returns, and its call must be matched by its stored attempts."""
    import redis as _redis

    from workers.state.campaign_state import CampaignState

    client = _redis.Redis.from_url(url)
    try:
        state = CampaignState(client, campaign)
        wait_for(lambda: not state.claims.running() and pending_rows(store.dataset) == 0, timeout_s, "executions settled")
    finally:
        client.close()


def assert_calls_equal_attempts(store: RunStore, campaign: str, st: dict, models, *, lost: int = 0,
                                unsent: int = 0) -> None:
    """Calls the endpoint received == attempts stored (all executions, ``worker_died`` ones
    included: a SIGKILLed worker's calls in flight, from its recovered spool), per model;
    ``lost``: calls allowed to be missing (none with the workers' intent journal on);
    ``unsent``: stored attempts allowed beyond the calls (a SIGKILL between an intent's fsync and
    its send stores a ``worker_died`` attempt the endpoint never received)."""
    stored = attempts_by_model(store, campaign)
    gap = {m: st[m]["requests"] - stored[m] for m in models}
    over = -sum(g for g in gap.values() if g < 0)
    assert over <= unsent and sum(g for g in gap.values() if g > 0) <= lost, (gap, dict(stored))


def records_by_model(store: RunStore, campaign: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in store.read_records(campaigns=[campaign]):
        out.setdefault(r.model, []).append(r)
    return out


def stored_count(store: RunStore, campaign: str) -> int:
    """Runs durable so far: published, or in a worker's spool awaiting publication."""
    try:
        return len(store.completed_run_ids(campaign)) + pending_rows(store.dataset)
    except Exception:
        return 0


class Background:
    """``run_campaign_celery`` in a thread, so the test can inject faults meanwhile."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.result: ExecutionSummary | None = None
        self.error: BaseException | None = None
        self._t = threading.Thread(target=self._run, args=args, kwargs=kwargs, daemon=True)
        self._t.start()

    def _run(self, *args: object, **kwargs: object) -> None:
        try:
            # the keyword arguments are CeleryRun's fields (timeout_s=, options=, ...)
            self.result = run_campaign_celery(*args, CeleryRun(**kwargs))  # type: ignore[arg-type]
        except BaseException as e:
            self.error = e

    def join(self, timeout_s: float) -> ExecutionSummary:
        self._t.join(timeout_s)
        assert not self._t.is_alive(), "orchestrator did not finish"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def wait_for(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def wait_settled(read, quiet_s: float, timeout_s: float, what: str):
    """``read()`` once it returned the same value for ``quiet_s`` (e.g. a server's request count
    and the store's attempts after a woken worker finishes): a quiet period that ends as soon as
    the system is still, instead of a fixed sleep sized for the slowest machine."""
    deadline = time.monotonic() + timeout_s
    value, since = read(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, f"{what} kept changing for {timeout_s} s (last: {value!r})"
        time.sleep(0.05)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
    return value


def log_events(text: str) -> list[dict]:
    """The structlog JSON objects in worker log text (a line's JSON starts at its first ``{``;
    Celery prefixes the lines it redirects)."""
    events = []
    for line in text.splitlines():
        start = line.find("{")
        if start < 0:
            continue
        try:
            obj = json.loads(line[start:])
        except ValueError:
            continue
        if isinstance(obj, dict) and "event" in obj:
            events.append(obj)
    return events
