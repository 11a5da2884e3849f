"""The in-process executor: asyncio, one shared httpx client, per-model worker pools.

Each model gets its own pool of ``max_concurrency`` coroutines pulling from its own queue, so a
model waiting on its rate limit never holds up another model. Finished records go to a single
writer that flushes a batch every ``flush_interval_s`` (or ``flush_max_records``): a crash loses
at most the unflushed batch, and those runs simply execute again on the next ``irbench run``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import httpx
import structlog

from storage.records import Outcome, RunRecord
from storage.runs import RunStore
from workers.clock import Clock, SystemClock
from workers.execute import ExecuteSettings, RunContext, execute_run
from workers.gate import MemoryGate, ModelGate
from workers.limits.base import Limiter
from workers.limits.memory import MemoryLimiter
from workers.providers.base import Provider
from workers.providers.registry import make_http_client, make_provider
from workers.runtask import RunTask

log = structlog.get_logger("irbench.local")


@dataclass(frozen=True)
class LocalOptions:
    """``max_in_flight`` caps concurrent calls over all models (None = sum of model caps)."""

    max_in_flight: int | None = None
    default_model_concurrency: int = 4
    flush_interval_s: float = 0.25
    flush_max_records: int = 512
    max_connections: int = 128


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
    """Collects records and writes them to the store in batches from a background task."""

    def __init__(self, store: RunStore, options: LocalOptions) -> None:
        self._store = store
        self._options = options
        self._buffer: list[RunRecord] = []
        self._wake = asyncio.Event()
        self._closing = False
        self.written = 0

    def add(self, record: RunRecord) -> None:
        self._buffer.append(record)
        if len(self._buffer) >= self._options.flush_max_records:
            self._wake.set()

    async def _flush(self) -> None:
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        await asyncio.to_thread(self._store.write, batch)
        self.written += len(batch)

    async def run(self) -> None:
        while not self._closing:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._options.flush_interval_s)
            self._wake.clear()
            await self._flush()

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        await self._flush()


async def run_local(
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
    own_client = client is None
    client = client or make_http_client(options.max_connections)
    providers: dict[str, Provider] = {}

    def provider_for(task: RunTask) -> Provider:
        key = task.endpoint.name
        if key not in providers:
            api_key = secrets.get(task.endpoint.api_key_env) if task.endpoint.api_key_env else None
            providers[key] = make_provider(task.endpoint, client, api_key)
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
                        record = await execute_run(task, ctx)
                else:
                    record = await execute_run(task, ctx)
            finally:
                state.in_flight -= 1
            writer.add(record)
            if record.outcome is Outcome.RETIRED:
                retired.append(record)
            by_model[model][record.outcome.value] += 1
            state.done += 1
            state.outcomes[record.outcome.value] += 1
            if record.outcome is Outcome.CANCELLED:
                state.cancelled += 1
            elif record.outcome is not Outcome.OK or not record.succeeded:
                state.failed += 1
            if on_progress:
                on_progress(model, state)

    writer_task = asyncio.create_task(writer.run())
    workers = []
    for model, queue in queues.items():
        workers += [asyncio.create_task(worker(model)) for _ in range(min(caps[model], queue.qsize()))]
    interrupted = False
    try:
        await asyncio.gather(*workers)
    except (asyncio.CancelledError, KeyboardInterrupt):
        interrupted = True
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    finally:
        await writer.close()
        writer_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer_task
        if own_client:
            await client.aclose()
    log.info("local_execution_finished", executed=writer.written, interrupted=interrupted)
    return ExecutionSummary(
        executed=writer.written,
        by_model={m: dict(c) for m, c in by_model.items()},
        interrupted=interrupted,
        retired=tuple(retired),
    )
