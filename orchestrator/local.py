"""The in-process executor: asyncio, per-model worker pools, one HTTP connection per call in flight.

Each model gets its own pool of ``max_concurrency`` coroutines pulling from its own queue, so a
model waiting on its rate limit never holds up another model. Each endpoint's calls go through a
``PooledProvider``: a call borrows an idle single-connection client of that endpoint (or makes
one), so httpcore's per-request walk over its pool is one connection long (a shared pool of 64
cost more CPU per call at 64 coroutines than the call itself, bench/README.md) and an endpoint
sees no more connections than its peak of concurrent calls. Finished records go to a single
writer that flushes a batch every ``flush_interval_s`` (or ``flush_max_records``): a crash loses
at most the unflushed batch, and those runs simply execute again on the next ``irbench run``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
from workers.providers.pooled import PooledProvider
from workers.providers.registry import make_provider, make_tls_context
from workers.runtask import RunTask

log = structlog.get_logger("irbench.local")
T = TypeVar("T")


def run_event_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh uvloop event loop (asyncio's own when uvloop is not
    installed). uvloop's transports and scheduling cost less CPU per call than asyncio's selector
    loop (0.1-0.3 ms per run in one paired measurement; bench/README.md has the figures)."""
    try:
        import uvloop
    except ImportError:  # e.g. Windows
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


@dataclass(frozen=True)
class LocalOptions:
    """``max_in_flight`` caps concurrent calls over all models (None = sum of model caps).

    ``connections_per_client``: the pool size of each pooled client (one call at a time each,
    so 1 keeps one keep-alive connection per client). An injected ``client`` is shared by every
    call instead.
    """

    max_in_flight: int | None = None
    default_model_concurrency: int = 4
    flush_interval_s: float = 0.25
    flush_max_records: int = 512
    connections_per_client: int = 1


@dataclass
class ModelProgress:
    total: int
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


ProgressCallback = Callable[[str, ModelProgress], None]


@dataclass(frozen=True)
class ExecutionSummary:
    executed: int
    by_model: Mapping[str, Mapping[str, int]]  # model -> outcome -> count
    interrupted: bool = False
    retired: tuple[RunRecord, ...] = ()  # the runs that met a 410 (one per model, usually)


class _BatchWriter:
    """Collects records and writes them to the store in batches from its own background task.

    ``close`` lets a flush already in progress finish (cancelling it would leave its records
    written but not counted), then flushes what is left.
    """

    def __init__(self, store: RunStore, options: LocalOptions) -> None:
        self._store = store
        self._options = options
        self._buffer: list[RunRecord] = []
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self.written = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

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

    async def _run(self) -> None:
        while not self._closing:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._options.flush_interval_s)
            self._wake.clear()
            await self._flush()
        await self._flush()

    async def close(self) -> None:
        """Stop after writing every record added so far; re-raises a failed write."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
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
            if record.outcome is not Outcome.OK or not record.succeeded:
                state.failed += 1
            if on_progress:
                on_progress(model, state)

    writer.start()
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
        for pool in pooled:
            await pool.aclose()
    log.info("local_execution_finished", executed=writer.written, interrupted=interrupted)
    return ExecutionSummary(
        executed=writer.written,
        by_model={m: dict(c) for m, c in by_model.items()},
        interrupted=interrupted,
        retired=tuple(retired),
    )
