"""The in-process executor: asyncio, per-model worker pools, one HTTP connection per call in flight.

Each model gets its own pool of ``max_concurrency`` coroutines taking from its own task stream
(each task built as it is taken), so a model waiting on its rate limit never holds up another model. Each endpoint's calls go through a
``PooledProvider``: a call borrows an idle single-connection client of that endpoint (or makes
one), so a client's per-request walk over its pool is one connection long (a shared httpx pool
of 64 costs more CPU per call at 64 coroutines than the call itself; bench/local_throughput.py
measures it) and an
endpoint sees no more connections than its peak of concurrent calls. The clients are
``AioClient``s (aiohttp on this uvloop loop; half the CPU per call of httpx's transport,
``workers.providers.aio``). Finished records go to a single
writer that flushes a batch every ``flush_interval_s`` (or ``flush_max_records``): a crash loses
at most the unflushed batch, and those runs simply execute again on the next ``irbench run``.
From ``writer_process_min_runs`` runs on, that writer is a child process that also does the IR
extraction and record validation (``local_writer``): a quarter of the per-run CPU off the event
loop (a fork: no start-up imports; where there is no ``os.fork``, the thread writer stays).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import structlog

from orchestrator.campaign.plan_state import PlanSelection
from storage.records import Outcome, RunRecord
from storage.runs import RunStore
from workers.clock import Clock, SystemClock
from orchestrator.local.batch_writer import BatchWriter
from orchestrator.local.writer import FinishedRun, ProcessWriter, WriterConfig
from workers.execute import ExecuteSettings, PendingRecord, RunContext, execute_run, execute_run_deferred, log_finished
from workers.gate import MemoryGate, ModelGate
from workers.gc_policy import tuned_collector
from workers.limits.base import Limiter
from workers.limits.memory import MemoryLimiter
from workers.loops import new_event_loop
from workers.providers.base import Provider
from workers.providers.pooled import PooledProvider
from workers.providers.registry import make_provider, make_tls_context
from workers.runtask import RunTask
from workers.spend import SpendMeter

log = structlog.get_logger("irbench.local")
T = TypeVar("T")


def run_event_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh event loop (``workers.loops``: uvloop's when
    installed, whose calls cost less CPU than asyncio's)."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)


@dataclass(frozen=True)
class LocalOptions:
    """``max_in_flight`` caps concurrent calls over all models (None = sum of model caps).

    ``connections_per_client``: the pool size of each pooled client (one call at a time each,
    so 1 keeps one keep-alive connection per client). An injected ``client`` is shared by every
    call instead.

    ``writer_process_min_runs``: from this many tasks on, records are finished and written by a
    writer process (``local_writer``) instead of a thread of this one.

    ``gc_young_threshold``: for an execution of that many tasks or more, the process's heap is
    frozen and its young generation collected every this many allocations while it runs
    (``workers.gc_policy``; the collector's cost otherwise grows with the runs in flight); 0
    leaves the collector alone.
    """

    max_in_flight: int | None = None
    default_model_concurrency: int = 4
    flush_interval_s: float = 0.25
    flush_max_records: int = 512
    connections_per_client: int = 1
    writer_process_min_runs: int | None = 256  # None: never a writer process
    gc_young_threshold: int = 10000


@dataclass(frozen=True)
class RunServices:
    """What every run of one execution shares besides its provider (``workers.execute.RunContext``):
    the ``limiter`` and model ``gate`` (``None``: in-memory ones, the gate closing a model after
    its tasks' ``disable_after_consecutive``), the ``clock`` (``None``: the system's), the
    execute ``settings`` and the spend cap's meter (``None``: no cap, ``workers.spend``)."""

    limiter: Limiter | None = None
    gate: ModelGate | None = None
    clock: Clock | None = None
    settings: ExecuteSettings = ExecuteSettings()
    spend: SpendMeter | None = None


@dataclass
class ModelProgress:
    """Counts of this call's runs of one model: ``done`` = finished in any class; ``failed`` = a
    failure other than ``cancelled`` (no IR); ``cancelled`` = never sent (model closed, campaign stopped)."""

    total: int
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    cancelled: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


ProgressCallback = Callable[[str, ModelProgress], None]


@dataclass(frozen=True)
class ExecutionSummary:
    executed: int
    by_model: Mapping[str, Mapping[str, int]]  # model -> outcome -> count
    interrupted: bool = False
    retired: tuple[RunRecord, ...] = ()  # the runs that met a 410 (one per model, usually)
    # outcome -> runs among ``by_model`` another orchestrator executed (distributed: for its messages;
    # local: while this one waited for the campaign's lock)
    by_others: Mapping[str, int] = field(default_factory=dict)


class _Providers:
    """One provider per endpoint, made on first use: a ``PooledProvider`` of single-connection
    clients, or a plain provider over an injected ``client``. ``aclose`` closes the pools."""

    def __init__(self, secrets: Mapping[str, str], options: LocalOptions, client: httpx.AsyncClient | None) -> None:
        self._secrets, self._options, self._client = secrets, options, client
        self._tls = make_tls_context() if client is None else None  # one CA bundle load for every client
        self._by_endpoint: dict[str, Provider] = {}
        self._pools: list[PooledProvider] = []

    def __call__(self, task: RunTask) -> Provider:
        key = task.endpoint.name
        if key not in self._by_endpoint:
            self._by_endpoint[key] = self._make(task)
        return self._by_endpoint[key]

    def _make(self, task: RunTask) -> Provider:
        endpoint = task.endpoint
        api_key = self._secrets.get(endpoint.api_key_env) if endpoint.api_key_env else None
        if self._client is not None:
            return make_provider(endpoint, self._client, api_key)
        assert self._tls is not None
        pool = PooledProvider(
            lambda c: make_provider(endpoint, c, api_key), tls=self._tls,
            connections_per_client=self._options.connections_per_client, wire_format=endpoint.wire_format,
        )
        self._pools.append(pool)
        return pool

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()


Execute = Callable[[RunTask, RunContext], Awaitable[RunRecord | PendingRecord]]


class _ModelPools:
    """Per-model task streams and the coroutines that drain them; counts what they finished.

    Each model gets ``max_concurrency`` coroutines (or the options' default) taking the next task
    of its own stream, all optionally under one ``max_in_flight`` semaphore. A stream is an
    iterator, so a ``PlanSelection``'s tasks are built one at a time as they are taken."""

    def __init__(self, tasks: Sequence[RunTask] | PlanSelection, options: LocalOptions,
                 on_progress: ProgressCallback | None) -> None:
        self.streams: dict[str, Iterator[RunTask]] = {}
        self.progress: dict[str, ModelProgress] = {}
        self.caps: dict[str, int] = {}
        self.by_model: dict[str, Counter[str]] = defaultdict(Counter)
        self.retired: list[RunRecord] = []
        self._on_progress = on_progress
        self._in_flight = asyncio.Semaphore(options.max_in_flight) if options.max_in_flight else None
        self.first: RunTask | None = None  # the first task of the first model (its retry policy)
        for model, (count, first, stream) in _streams(tasks).items():
            self.first = self.first or first
            self.streams[model] = stream
            self.caps[model] = first.limits.max_concurrency or options.default_model_concurrency
            self.progress[model] = ModelProgress(total=count)

    def _report(self, model: str) -> None:
        if self._on_progress:
            self._on_progress(model, self.progress[model])

    def on_finished(self, run: FinishedRun) -> None:
        """A run the writer process finished, now stored."""
        log_finished(run.campaign, run.run_id, run.model, run.fields)
        if run.failed:
            self.progress[run.model].failed += 1
            self._report(run.model)

    def start(self, execute: Execute, ctx: RunContext, writer: BatchWriter | ProcessWriter) -> list[asyncio.Task[None]]:
        """One task per coroutine slot of each model (no more than its runs)."""
        return [
            asyncio.create_task(self._drain(model, execute, ctx, writer))
            for model in self.streams
            for _ in range(min(self.caps[model], self.progress[model].total))
        ]

    async def _drain(self, model: str, execute: Execute, ctx: RunContext, writer: BatchWriter | ProcessWriter) -> None:
        stream, state = self.streams[model], self.progress[model]
        while True:
            task = next(stream, None)  # no await between taking and starting: the pool's coroutines share it
            if task is None:
                return
            state.in_flight += 1
            self._report(model)
            try:
                if self._in_flight is not None:
                    async with self._in_flight:
                        record = await execute(task, ctx)
                else:
                    record = await execute(task, ctx)
            finally:
                state.in_flight -= 1
            writer.add(record)  # type: ignore[arg-type]  # BatchWriter runs beside execute_run only, which returns RunRecords
            self._count(model, record)

    def _count(self, model: str, record: RunRecord | PendingRecord) -> None:
        state, outcome = self.progress[model], record.outcome
        if outcome is Outcome.RETIRED:
            assert isinstance(record, RunRecord)  # no answer, so never a PendingRecord
            self.retired.append(record)
        self.by_model[model][outcome.value] += 1
        state.done += 1
        state.outcomes[outcome.value] += 1
        if outcome is Outcome.CANCELLED:
            state.cancelled += 1
        elif isinstance(record, PendingRecord):
            # an answer that ended other than ok failed whatever its IR; an ok one fails if
            # its IR does not parse, which the writer process tells (on_finished)
            state.failed += outcome is not Outcome.OK
        elif record.failed:
            state.failed += 1
        self._report(model)


def _streams(tasks: Sequence[RunTask] | PlanSelection) -> dict[str, tuple[int, RunTask, Iterator[RunTask]]]:
    """Per model with tasks (first-seen order): its task count, first task and a stream that
    yields all of them in order."""
    if isinstance(tasks, PlanSelection):
        out: dict[str, tuple[int, RunTask, Iterator[RunTask]]] = {}
        for model, count in tasks.counts().items():
            if count:
                stream = tasks.tasks_of(model)
                first = next(stream)
                out[model] = (count, first, itertools.chain([first], stream))
        return out
    grouped: dict[str, list[RunTask]] = {}
    for task in tasks:
        grouped.setdefault(task.model, []).append(task)
    return {model: (len(ts), ts[0], iter(ts)) for model, ts in grouped.items()}


async def _open_writer(store: RunStore, options: LocalOptions, n_tasks: int, pools: _ModelPools
                       ) -> tuple[BatchWriter | ProcessWriter, Execute]:
    """The writer for an execution of ``n_tasks`` and the execute function that feeds it: a
    forked writer process (which also extracts the IR) from ``writer_process_min_runs`` on."""
    min_runs = options.writer_process_min_runs
    if min_runs is not None and n_tasks >= min_runs and hasattr(os, "fork"):
        config = WriterConfig(store, options.flush_interval_s, options.flush_max_records)
        writer = ProcessWriter(store, config, pools.on_finished)
        await writer.start()
        return writer, execute_run_deferred
    return BatchWriter(store, options.flush_interval_s, options.flush_max_records), execute_run


async def _cancel_all(workers: Sequence[asyncio.Task[None]]) -> None:
    for w in workers:
        w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)


async def _await_workers(workers: list[asyncio.Task[None]], writer: BatchWriter | ProcessWriter) -> bool:
    """Wait for ``workers`` to finish, stopping them if the writer fails (nothing more can be
    stored) or on cancellation / Ctrl-C. Returns True when interrupted."""
    all_done: asyncio.Future[Any] = asyncio.gather(*workers)
    write_failed = asyncio.create_task(writer.failed.wait())
    try:
        await asyncio.wait([all_done, write_failed], return_when=asyncio.FIRST_COMPLETED)
        if writer.failure is not None:
            await _cancel_all(workers)
        await all_done if all_done.done() and not all_done.cancelled() else None
    except (asyncio.CancelledError, KeyboardInterrupt):
        await _cancel_all(workers)
        return True
    finally:
        write_failed.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await write_failed
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(all_done, return_exceptions=True)
    return False


async def run_local(
    tasks: Sequence[RunTask] | PlanSelection,
    store: RunStore,
    *,
    secrets: Mapping[str, str],
    options: LocalOptions = LocalOptions(),
    services: RunServices = RunServices(),
    client: httpx.AsyncClient | None = None,
    on_progress: ProgressCallback | None = None,
) -> ExecutionSummary:
    """Execute ``tasks`` (already filtered to the pending ones: a list, or a ``PlanSelection``
    enumerated as it runs) and store every record.

    ``secrets`` maps environment-variable names to API keys; it is read here and handed to the
    providers in memory only. ``client``: one HTTP client every call shares (None: pooled
    clients per endpoint). Returns counts per model and outcome; raises ``StorageError``
    when the store refused a write (the runs not stored execute again on the next resume).
    """
    providers = _Providers(secrets, options, client)
    pools = _ModelPools(tasks, options, on_progress)
    first = pools.first
    ctx = RunContext(
        provider_for=providers, limiter=services.limiter or MemoryLimiter(),
        gate=services.gate or MemoryGate(first.retry.disable_after_consecutive if first else 3),
        clock=services.clock or SystemClock(), settings=services.settings, spend=services.spend,
    )
    min_runs = options.writer_process_min_runs
    long_run = min_runs is not None and len(tasks) >= min_runs
    # a long execution runs under the workers' collector policy, set before the writer's fork
    with tuned_collector(options.gc_young_threshold if long_run else 0):
        writer, execute = await _open_writer(store, options, len(tasks), pools)
        writer_task = asyncio.create_task(writer.run())
        try:
            interrupted = await _await_workers(pools.start(execute, ctx, writer), writer)
        finally:
            writer.close()
            await asyncio.shield(writer_task)
            await providers.aclose()
    log.info("local_execution_finished", executed=writer.written, interrupted=interrupted)
    if writer.failure is not None:
        raise writer.error()
    return ExecutionSummary(
        executed=writer.written, by_model={m: dict(c) for m, c in pools.by_model.items()},
        interrupted=interrupted, retired=tuple(pools.retired),
    )
