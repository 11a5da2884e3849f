"""What one Celery worker process shares between its task threads.

* one event loop (uvloop where installed, ``workers.loops``) in a background thread; a task
  thread hands its message's runs to it with ``asyncio.run_coroutine_threadsafe`` and blocks
  until all of them are through (``workers.celery.tasks``). The loop runs at most
  ``call_slots`` of them at once (``slots``, an ``asyncio.Semaphore``: what the memory
  budget holds, ``workers.celery.memory_budget``), and its ``batcher``s
  let the runs that claim or finish together share one fsync and one ``EVALSHA``;
* per endpoint a ``PooledProvider`` (one-connection ``AioClient``s, as many as calls in flight:
  aiohttp, opened lazily on that loop; about half the CPU per call of httpx's
  transport, ``workers.providers.aio``) and one ``RedisLimiter`` (async Redis client), all
  living on that loop;
* one sync Redis client for campaign state, the gate and ``ClaimPermits`` (a run's claim with
  its first permit, its done marker with its last release: ``workers.state.claim_permit``), and
  the loop's async one: both handed in by the caller (``WorkerClients``, which
  ``RuntimeHolder`` connects on first use);
* a heartbeat thread renewing the claims and limiter leases of the runs executing here (so a
  killed worker's runs and slots come back within a TTL instead of a call's worst-case
  duration), and the queued time of the runs waiting here for a slot (so the reconciler does
  not take them for lost).

``workers.celery.deferring.DeferringLimiter`` (re-exported here) wraps the Redis limiter for
``execute_run``: bounded waits, deferral, the gate re-check after a grant.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from storage.objectstore.location import is_store_url
from storage.runs import RunStore
from workers.celery.bucket_sink import BucketSink
from storage.parquet.spool import RunSpool, SpoolConfig, recover_orphans
from workers.celery import DEFAULT_THREADS
from workers.celery.local_cooldowns import LocalCooldowns
from workers.celery.memory_budget import DEFAULT_MEMORY_BUDGET_MIB, calls_within
from workers.state.campaign_state import CampaignState
from workers.state.claim_permit import ClaimPermits
from workers.state.connect import RedisTimeouts, async_redis, sync_redis
from workers.limits.memory import RateTiming
from workers.state.redis_limiter import RedisLimiter
from workers.celery.transport import ACK_FLUSH_S
from workers.celery.deferring import Deferred, DeferringLimiter
from workers.celery.coalesce import Coalescer
from workers.errors import ConfigError
from workers.cpu_policy import POLICIES
from workers.gc_policy import tune_collector
from workers.loops import new_event_loop
from workers.limits.base import Permit
from workers.providers.base import Provider
from workers.providers.pooled import PooledProvider
from workers.providers.registry import make_provider, make_tls_context
from workers.runtask import RunTask

__all__ = ["Deferred", "DeferringLimiter", "RuntimeHolder", "WorkerClients", "WorkerRuntime", "WorkerSettings"]

log = structlog.get_logger("irbench.worker")
T = TypeVar("T")

ENV_PREFIX = "IRBENCH_"
#: Fields whose variable is not ``IRBENCH_<FIELD>``: the store root has one name for every
#: command, the CLI's ``--data`` default included.
_ENV_NAMES = {"data_dir": "IRBENCH_DATA"}
#: Names an older release read, refused with the name to use instead.
_RENAMED_ENV = {"IRBENCH_DATA_DIR": "IRBENCH_DATA"}


@dataclass(frozen=True)
class WorkerSettings:
    """Worker knobs; each can be set by env ``IRBENCH_<FIELD>`` (e.g. ``IRBENCH_CLAIM_TTL_S``;
    :meth:`env_name` gives each field's variable).

    ``redis_url``: Redis for limiter/state (default: the broker). ``data_dir``: the run store
    root (``IRBENCH_DATA``, as for every command); when set it wins over the path a task carries
    (the worker's own mount of the store), or ``s3://BUCKET/PREFIX`` for a bucket store.
    ``spool_dir``: with a bucket store, the local directory of the spool and of the files
    waiting for upload (default: one per store under ``~/.local/state/irbench/spool``).
    ``lease_ttl_s``/``claim_ttl_s``: lifetime of a limiter lease / run claim without a heartbeat
    (renewed every third of the shorter one). ``max_wait_s``: longest wait for a permit while
    holding a worker slot. ``min_defer_s``/``max_defer_s``: bounds of a deferral countdown (keep
    ``max_defer_s`` far below the broker visibility timeout); rate slots are reserved at most
    ``max_defer_s`` ahead. ``limit_period_s``: the window ``requests_per_minute``/
    ``tokens_per_minute`` are counted over. ``limit_jitter_allowance_s``: added to that window by
    the limiter so the spread of grant-to-provider delays cannot push one request too many into a
    provider's window (0.25 s: the worst spread ``bench/rate_limits.py`` measures; 0.4 % of a 60 s
    window). ``reservation_grace_s``: how long after its slot a deferred run's reservation waits
    to be claimed before it is abandoned. ``redis_retry_s``: how long to keep retrying Redis for
    the done marker before giving up to the reconciler. ``visibility_timeout_s``: the broker
    redelivers a message unacknowledged this long (``workers.celery.app``'s rule says how long
    it must be). ``ack_flush_s``: longest delay of a gathered ack (``workers.celery.transport``).
    ``memory_budget_mib``: the memory this worker process is sized to (default 768 MiB, so a
    worker fits in 1 GiB); it keeps as many calls in flight as that holds
    (``workers.celery.memory_budget``: about 2,400 by default), and each model's own
    ``max_concurrency`` and rate limits bound what an endpoint sees. ``run_slots``: a fixed
    number of calls in flight instead (0, the default: what the budget holds). A run takes a
    slot before its claim and hands it on once its call is answered, to a run that calls only
    after that record is durable: a SIGKILL loses at most that many answered calls. A worker
    at its budget claims no more: the runs of its messages wait for a slot unclaimed, and the
    orchestrator's auto message size keeps the runs a worker holds within its slots
    (``orchestrator.distributed.message_size``).
    ``gc_young_threshold``: once the runtime is up, the start-up heap is frozen and the young
    generation collected every this many allocations (``workers.gc_policy``); 0 leaves
    Python's collector as it is. ``cpu_policy``: how the kernel schedules a worker process, set
    when the Celery worker starts: ``batch`` (default; Linux ``SCHED_BATCH``: its threads do not
    preempt others when woken, ``workers.cpu_policy``) or ``normal``.
    ``intent_journal``: before each call, make the record the run gets if this worker dies
    mid-call durable in the spool (``storage.parquet.intents``; group-committed with the
    records), so that a call in flight at a SIGKILL is stored as a ``worker_died`` attempt;
    off (``0``), such a call is lost.
    ``presence_interval_s``: how often the worker publishes its presence (queues, store, slots).
    ``log_level``: the worker's own JSON log level; ``celery_task_log_level``: that of Celery's
    per-task lines (two records per run that say less than ``run_finished``).
    """

    redis_url: str
    data_dir: str | None = None
    spool_dir: str | None = None
    lease_ttl_s: float = 30.0
    claim_ttl_s: float = 30.0
    max_wait_s: float = 1.5
    min_defer_s: float = 0.5
    max_defer_s: float = 30.0
    limit_period_s: float = 60.0
    limit_jitter_allowance_s: float = 0.25
    reservation_grace_s: float = 30.0
    redis_retry_s: float = 30.0
    visibility_timeout_s: float = 10800.0
    ack_flush_s: float = ACK_FLUSH_S
    key_prefix: str = "irbench"
    failure_backoff_s: float = 1.0
    max_regrants: int = 5
    spool_max_rows: int = 2000
    spool_max_age_s: float = 5.0
    spool_idle_s: float = 0.5
    intent_journal: bool = True
    memory_budget_mib: int = DEFAULT_MEMORY_BUDGET_MIB
    run_slots: int = 0
    gc_young_threshold: int = 10000
    cpu_policy: str = "batch"
    presence_interval_s: float = 2.0
    log_level: str = "INFO"
    celery_task_log_level: str = "WARNING"

    def __post_init__(self) -> None:
        if self.visibility_timeout_s <= 0:
            raise ConfigError(f"visibility timeout must be > 0 s, got {self.visibility_timeout_s}")
        if self.ack_flush_s < 0:
            raise ConfigError(f"ack flush delay must be >= 0 s, got {self.ack_flush_s}")
        if self.run_slots < 0:
            raise ConfigError(f"run slots must be >= 0 (0: what the memory budget holds), got {self.run_slots}")
        calls_within(self.memory_budget_mib)  # a budget that holds no call is a ConfigError
        if self.gc_young_threshold < 0:
            raise ConfigError(f"IRBENCH_GC_YOUNG_THRESHOLD must be >= 0 (0: Python's default), got {self.gc_young_threshold}")
        if self.cpu_policy not in POLICIES:
            raise ConfigError(f"unknown CPU policy {self.cpu_policy!r} (IRBENCH_CPU_POLICY, irbench worker "
                              f"--cpu-policy): use one of {', '.join(POLICIES)}")

    @property
    def call_slots(self) -> int:
        """Calls this worker keeps in flight at most: ``run_slots``, or with 0 what
        ``memory_budget_mib`` holds."""
        return self.run_slots or calls_within(self.memory_budget_mib)

    @property
    def heartbeat_s(self) -> float:
        return min(self.lease_ttl_s, self.claim_ttl_s) / 3.0

    @staticmethod
    def env_name(field_name: str) -> str:
        """The environment variable that sets ``field_name``."""
        return _ENV_NAMES.get(field_name, ENV_PREFIX + field_name.upper())

    @classmethod
    def from_env(cls, broker_url: str, environ: Mapping[str, str] | None = None) -> WorkerSettings:
        env = os.environ if environ is None else environ
        for old, new in _RENAMED_ENV.items():
            if env.get(old) and not env.get(new):
                raise ConfigError(f"{old} is not read any more: set {new}={env[old]} instead (one name for the store root)")
        values: dict[str, Any] = {"redis_url": env.get(ENV_PREFIX + "REDIS_URL") or broker_url}
        for f in fields(cls):
            raw = env.get(cls.env_name(f.name))
            if f.name == "redis_url" or raw in (None, ""):
                continue
            if f.type in ("bool", bool):
                values[f.name] = _flag(cls.env_name(f.name), str(raw))
                continue
            try:
                values[f.name] = int(raw) if f.type in ("int", int) else float(raw) if "float" in str(f.type) else raw
            except ValueError:
                raise ConfigError(f"{cls.env_name(f.name)}={raw!r} is not a number") from None
        return cls(**values)


def _flag(name: str, raw: str) -> bool:
    """A boolean variable: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r} is not a switch: use 1 or 0")


@dataclass(frozen=True)
class WorkerClients:
    """The Redis clients of a worker runtime, made by its caller: ``redis`` (sync: campaign
    state, the gate, claim permits, the heartbeat) and ``aredis`` (asyncio, used on the
    runtime's loop only: the limiter and the runs' Redis batches). The runtime closes both."""

    redis: redis.Redis
    aredis: aioredis.Redis

    @classmethod
    def connect(cls, redis_url: str) -> WorkerClients:
        """Both clients on ``redis_url``; the async one makes no retries of its own (the
        limiter's callers retry)."""
        return cls(sync_redis(redis_url), async_redis(redis_url, RedisTimeouts(retries=0)))


@dataclass
class _Claim:
    state: CampaignState
    run_id: str
    owner: str


class WorkerRuntime:
    """Per-process shared resources. Create once per worker process; ``close()`` at shutdown.

    ``clients``: the Redis clients (``WorkerClients.connect(settings.redis_url)`` in a worker);
    ``threads``: the worker's thread count (the broker messages it holds at once)."""

    def __init__(self, settings: WorkerSettings, clients: WorkerClients, threads: int = DEFAULT_THREADS) -> None:
        self.settings = settings
        self.slots = asyncio.Semaphore(settings.call_slots)  # used on the loop only
        self.redis = clients.redis
        self.aredis = clients.aredis
        self._loop = new_event_loop()  # uvloop where installed: less CPU per call
        self._thread = threading.Thread(target=self._loop.run_forever, name="irbench-loop", daemon=True)
        self._thread.start()
        self._lock = threading.Lock()
        self._claims: dict[str, _Claim] = {}
        self._waiting: dict[str, _Claim] = {}  # delivered runs waiting for a slot (owner unused)
        self._permits: dict[tuple[str, str], Permit] = {}
        self.cooldowns = LocalCooldowns()  # 429 cooldowns this process met, before Redis has them
        self._providers: dict[tuple[str, str, str, str | None], PooledProvider] = {}
        self._stores: dict[str, RunStore] = {}
        self._spools: dict[str, RunSpool] = {}
        self._sinks: list[BucketSink] = []
        self._stop = threading.Event()
        self._tls = make_tls_context()  # one CA bundle load for every client of this process
        self.limiter = self.run(self._make_limiter())  # made on the loop it lives on
        self.claims = ClaimPermits(self.redis, self.limiter, async_client=self.aredis)  # claim + first permit, done + last release
        self._batchers: dict[str, Coalescer[Any, Any]] = {}  # see ``batcher``
        self._heartbeat = threading.Thread(target=self._beat, name="irbench-heartbeat", daemon=True)
        self._heartbeat.start()
        tune_collector(settings.gc_young_threshold)  # the process's long-lived objects exist by now

    async def _make_limiter(self) -> RedisLimiter:
        return RedisLimiter(
            self.aredis,
            key_prefix=f"{self.settings.key_prefix}:lim",
            timing=RateTiming(
                lease_ttl_s=self.settings.lease_ttl_s,
                period_s=self.settings.limit_period_s,
                jitter_allowance_s=self.settings.limit_jitter_allowance_s,
                reserve_ahead_s=self.settings.max_defer_s,
                reservation_grace_s=self.settings.reservation_grace_s,
            ),
            max_block_s=max(self.settings.max_wait_s, 0.05),
        )

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the shared loop and wait for it from the calling (task) thread."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    # ----- shared objects -----------------------------------------------------------------------
    def provider_for(self, task: RunTask) -> Provider:
        """Provider of ``task``'s endpoint; the key is read from THIS process's environment."""
        ep = task.endpoint
        key = (ep.name, ep.base_url, ep.wire_format, ep.api_key_env)
        with self._lock:
            if key not in self._providers:
                api_key = os.environ.get(ep.api_key_env) if ep.api_key_env else None
                # a free list of one-connection AioClients, as in the local executor
                # (workers.providers.pooled): no pool walk per call, aiohttp's C parser instead
                # of httpcore/h11 (0.18-0.22 against 0.31-0.41 ms of CPU per call on uvloop,
                # bench/http_clients.py). Its calls all run
                # on this runtime's one event loop, as PooledProvider needs (the clients'
                # sessions open on it, on first use).
                self._providers[key] = PooledProvider(
                    functools.partial(make_provider, ep, api_key=api_key), tls=self._tls,
                    wire_format=ep.wire_format,
                )
            return self._providers[key]

    def batcher(self, key: str, make: Callable[[], Coalescer[Any, Any]]) -> Coalescer[Any, Any]:
        """The process's ``Coalescer`` named ``key``, made by ``make()`` on first use (call it
        on the loop only): what the runs finishing together share (an fsync, a pipeline)."""
        if key not in self._batchers:
            self._batchers[key] = make()
        return self._batchers[key]

    def store(self, data_dir: str | None) -> RunStore:
        """The run store at ``data_dir`` (the worker's own ``--data`` wins); for a bucket store,
        the local one its spool publishes into, with an uploader to the bucket."""
        root = self.settings.data_dir or data_dir
        if not root:
            raise ConfigError("no data directory: set IRBENCH_DATA on the worker (or --data) or pass data_dir in the task")
        with self._lock:
            if root not in self._stores:
                local = Path(root)
                if is_store_url(root):
                    sink = BucketSink(root, self.settings.spool_dir, self.redis, self.settings.key_prefix)
                    self._sinks.append(sink)
                    local = sink.root
                self._stores[root] = RunStore(local)
            return self._stores[root]

    def spool(self, data_dir: str | None) -> RunSpool:
        """This process's group-commit spool for the store at ``data_dir`` (created on first
        use, after publishing the spools of dead writers)."""
        store = self.store(data_dir)
        key = str(store.root)
        with self._lock:
            if key not in self._spools:
                recovered = recover_orphans(store.dataset)
                if recovered:
                    log.info("spool_orphans_published", rows=recovered, root=key)
                s = self.settings
                self._spools[key] = RunSpool(
                    store.dataset,
                    config=SpoolConfig(s.spool_max_rows, s.spool_max_age_s, s.spool_idle_s),
                    on_error=lambda exc: log.warning("spool_publish_failed", error=str(exc)),
                )
            return self._spools[key]

    # ----- heartbeat ----------------------------------------------------------------------------
    def hold_claim(self, state: CampaignState, run_id: str, owner: str) -> None:
        with self._lock:
            self._claims[run_id] = _Claim(state, run_id, owner)

    def drop_claim(self, run_id: str) -> None:
        with self._lock:
            self._claims.pop(run_id, None)

    def hold_waiting(self, state: CampaignState, run_id: str) -> None:
        """A delivered run waits for a slot, unclaimed: the heartbeat refreshes its queued time
        so the reconciler does not take it for lost."""
        with self._lock:
            self._waiting[run_id] = _Claim(state, run_id, "")

    def drop_waiting(self, run_id: str) -> None:
        with self._lock:
            self._waiting.pop(run_id, None)

    def hold_permit(self, permit: Permit) -> None:
        with self._lock:
            self._permits[(permit.model, permit.holder)] = permit

    def drop_permit(self, permit: Permit) -> None:
        with self._lock:
            self._permits.pop((permit.model, permit.holder), None)

    def _beat(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_s):
            with self._lock:
                claims, permits = list(self._claims.values()), list(self._permits.values())
                waiting = list(self._waiting.values())
            by_state: dict[int, tuple[CampaignState, list[str]]] = {}
            for w in waiting:
                by_state.setdefault(id(w.state), (w.state, []))[1].append(w.run_id)
            for state, run_ids in by_state.values():
                try:
                    state.queued.refresh(run_ids)
                except RedisError as exc:
                    log.warning("queued_refresh_failed", runs=len(run_ids), error=str(exc))
            for c in claims:
                try:
                    c.state.claims.renew(c.run_id, c.owner, self.settings.claim_ttl_s)
                except RedisError as exc:
                    log.warning("claim_renew_failed", run_id=c.run_id, error=str(exc))
            for p in permits:
                try:
                    self.run(self.limiter.renew(p), timeout_s=self.settings.heartbeat_s)
                except Exception as exc:
                    log.warning("lease_renew_failed", model=p.model, error=str(exc))

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            spools, self._spools = list(self._spools.values()), {}
        for sp in spools:
            with contextlib.suppress(Exception):
                sp.close()
        for sink in self._sinks:  # after the spools: their last segments are published by now
            with contextlib.suppress(Exception):
                sink.close()

        async def _close() -> None:
            await self.limiter.aclose()
            for provider in list(self._providers.values()):
                await provider.aclose()
            await self.aredis.aclose()

        with contextlib.suppress(Exception):
            self.run(_close(), timeout_s=5.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        self.redis.close()


class RuntimeHolder:
    """Lazily creates the process's ``WorkerRuntime`` on first use (thread-safe)."""

    def __init__(self, broker_url: str, settings: WorkerSettings | None = None) -> None:
        self._broker_url = broker_url
        self._settings = settings
        self._lock = threading.Lock()
        self._runtime: WorkerRuntime | None = None
        self.threads = DEFAULT_THREADS  # the worker's thread count, set at worker start (``set_threads``)

    def set_threads(self, threads: int) -> None:
        """The worker's ``--concurrency``: the broker messages it holds at once."""
        self.threads = max(int(threads), 1)

    def slots(self) -> tuple[int, int]:
        """(messages, runs) this worker takes at once: its thread count (Celery's prefetch
        multiplier is 1) and its call slots."""
        return self.threads, self.settings.call_slots

    @property
    def settings(self) -> WorkerSettings:
        """The settings this process's runtime uses (given, or read from the environment)."""
        return self._settings or WorkerSettings.from_env(self._broker_url)

    def get(self) -> WorkerRuntime:
        with self._lock:
            if self._runtime is None:
                settings = self._settings or WorkerSettings.from_env(self._broker_url)
                self._runtime = WorkerRuntime(settings, WorkerClients.connect(settings.redis_url), self.threads)
            return self._runtime

    def close(self) -> None:
        with self._lock:
            rt, self._runtime = self._runtime, None
        if rt is not None:
            rt.close()
