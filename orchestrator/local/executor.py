"""The in-process executor: asyncio, per-model worker pools, one HTTP connection per call in flight.

Each model gets its own pool of ``max_concurrency`` coroutines pulling from its own queue, so a
model waiting on its rate limit never holds up another model. Each endpoint's calls go through a
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
import os
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import structlog

from storage.errors import StorageError
from storage.records import Outcome, RunRecord
from storage.runs import RunStore
from workers.clock import Clock, SystemClock
from orchestrator.local.writer import FinishedRun, ProcessWriter, WriterConfig, write_error
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


class _BatchWriter:
    """Collects records and writes them to the store in batches from a background task.

    A failed write (disk full, permissions) never raises out of the background task: it is kept
    in ``failure``, ``failed`` is set so the executor stops starting runs, and later batches are
    dropped (``lost`` counts the records not stored; they run again on the next resume)."""

    def __init__(self, store: RunStore, options: LocalOptions) -> None:
        self._store = store
        self._options = options
        self._buffer: list[RunRecord] = []
        self._wake = asyncio.Event()
        self._closing = False
        self.written = 0
        self.lost = 0
        self.failure: Exception | None = None
        self.failed = asyncio.Event()

    def add(self, record: RunRecord) -> None:
        if self.failure is not None:
            self.lost += 1
            return
        self._buffer.append(record)
        if len(self._buffer) >= self._options.flush_max_records:
            self._wake.set()

    async def _flush(self) -> None:
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        if self.failure is not None:
            self.lost += len(batch)
            return
        try:
            await asyncio.to_thread(self._store.write, batch)
        except (StorageError, OSError) as exc:
            self.failure, self.lost = exc, self.lost + len(batch)
            self.failed.set()
            log.info("store_write_failed", error=str(exc), records=len(batch))  # the raised error says it
            return
        self.written += len(batch)

    async def run(self) -> None:
        """Flush every interval until ``close()``; the last flush is awaited, never cancelled
        (a cancelled write would leave it unknown whether its batch was stored)."""
        while not self._closing:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._options.flush_interval_s)
            self._wake.clear()
            await self._flush()
        await self._flush()

    def close(self) -> None:
        """Ask ``run()`` to write what is left and return."""
        self._closing = True
        self._wake.set()

    def error(self) -> StorageError:
        """The failure as one actionable ``StorageError``."""
        return write_error(self._store.root, self.failure, self.written, self.lost)


async def run_local(  # noqa: C901  (being split into dispatcher, writer and progress parts)
    tasks: Sequence[RunTask],
    store: RunStore,
    *,
    secrets: Mapping[str, str],
    options: LocalOptions = LocalOptions(),
    limiter: Limiter | None = None,
    gate: ModelGate | None = None,
    clock: Clock | None = None,
    client: httpx.AsyncClient | None = None,
    on_progress: ProgressCallback | None = None,
    settings: ExecuteSettings = ExecuteSettings(),
) -> ExecutionSummary:
    """Execute ``tasks`` (already filtered to the pending ones) and store every record.

    ``secrets`` maps environment-variable names to API keys; it is read here and handed to the
    providers in memory only. Returns counts per model and outcome.
    """
    limiter = limiter or MemoryLimiter()
    gate = gate or MemoryGate(tasks[0].retry.disable_after_consecutive if tasks else 3)
    tls = make_tls_context() if client is None else None  # one CA bundle load for every client
    providers: dict[str, Provider] = {}
    pooled: list[PooledProvider] = []

    def provider_for(task: RunTask) -> Provider:
        key = task.endpoint.name
        if key not in providers:
            api_key = secrets.get(task.endpoint.api_key_env) if task.endpoint.api_key_env else None
            if client is not None:
                providers[key] = make_provider(task.endpoint, client, api_key)
            else:
                assert tls is not None
                endpoint = task.endpoint
                pool = PooledProvider(
                    lambda c: make_provider(endpoint, c, api_key), tls=tls,
                    connections_per_client=options.connections_per_client, wire_format=endpoint.wire_format,
                )
                pooled.append(pool)
                providers[key] = pool
        return providers[key]

    ctx = RunContext(
        provider_for=provider_for, limiter=limiter, gate=gate, clock=clock or SystemClock(), settings=settings
    )
    queues: dict[str, asyncio.Queue[RunTask]] = defaultdict(asyncio.Queue)
    progress: dict[str, ModelProgress] = {}
    caps: dict[str, int] = {}
    for task in tasks:
        queues[task.model].put_nowait(task)
        caps.setdefault(task.model, task.limits.max_concurrency or options.default_model_concurrency)
        progress.setdefault(task.model, ModelProgress(total=0)).total += 1
    def on_finished(run: FinishedRun) -> None:  # a run the writer process finished, now stored
        log_finished(run.campaign, run.run_id, run.model, run.fields)
        if run.failed:
            state = progress[run.model]
            state.failed += 1
            if on_progress:
                on_progress(run.model, state)

    min_runs = options.writer_process_min_runs
    long_run = min_runs is not None and len(tasks) >= min_runs
    # a long execution runs under the workers' collector policy, set before the writer's fork
    with tuned_collector(options.gc_young_threshold if long_run else 0):
        writer: _BatchWriter | ProcessWriter
        execute: Callable[[RunTask, RunContext], Awaitable[RunRecord | PendingRecord]] = execute_run
        if long_run and hasattr(os, "fork"):
            config = WriterConfig(store, options.flush_interval_s, options.flush_max_records)
            writer = ProcessWriter(store, config, on_finished)
            await writer.start()
            execute = execute_run_deferred
        else:
            writer = _BatchWriter(store, options)
        in_flight = asyncio.Semaphore(options.max_in_flight) if options.max_in_flight else None
        by_model: dict[str, Counter[str]] = defaultdict(Counter)
        retired: list[RunRecord] = []

        async def worker(model: str) -> None:
            queue, state = queues[model], progress[model]
            while True:
                try:
                    task = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                state.in_flight += 1
                if on_progress:
                    on_progress(model, state)
                try:
                    if in_flight is not None:
                        async with in_flight:
                            record = await execute(task, ctx)
                    else:
                        record = await execute(task, ctx)
                finally:
                    state.in_flight -= 1
                writer.add(record)  # type: ignore[arg-type]  # _BatchWriter runs beside execute_run only, which returns RunRecords
                outcome = record.outcome
                if outcome is Outcome.RETIRED:
                    assert isinstance(record, RunRecord)  # no answer, so never a PendingRecord
                    retired.append(record)
                by_model[model][outcome.value] += 1
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
                if on_progress:
                    on_progress(model, state)

        writer_task = asyncio.create_task(writer.run())
        workers = []
        for model, queue in queues.items():
            workers += [asyncio.create_task(worker(model)) for _ in range(min(caps[model], queue.qsize()))]
        interrupted = False
        all_done: asyncio.Future[Any] = asyncio.gather(*workers)
        write_failed = asyncio.create_task(writer.failed.wait())
        try:
            await asyncio.wait([all_done, write_failed], return_when=asyncio.FIRST_COMPLETED)
            if writer.failure is not None:  # nothing more can be stored: stop calling endpoints
                for w in workers:
                    w.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
            await all_done if all_done.done() and not all_done.cancelled() else None
        except (asyncio.CancelledError, KeyboardInterrupt):
            interrupted = True
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        finally:
            write_failed.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await write_failed
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(all_done, return_exceptions=True)
            writer.close()
            await asyncio.shield(writer_task)
            for pool in pooled:
                await pool.aclose()
        log.info("local_execution_finished", executed=writer.written, interrupted=interrupted)
        if writer.failure is not None:
            raise writer.error()
        return ExecutionSummary(
            executed=writer.written,
            by_model={m: dict(c) for m, c in by_model.items()},
            interrupted=interrupted,
            retired=tuple(retired),
        )
