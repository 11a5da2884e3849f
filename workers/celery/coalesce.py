"""``Coalescer``: what many coroutines submit while one flush is under way goes out in the next.

A worker's runs finish on one event loop, each wanting its record made durable (an fsync) and
its done marker and permit releases sent to Redis (a round trip). One flush per run costs as
much CPU as the run's own work on a fast endpoint (bench/worker_path.py measures this); so the first run to finish
flushes at once, and every run finishing meanwhile waits for that flush to end and goes out with
the others in the next one: no timer, no added latency when the worker is idle, batches as large
as the load makes them (group commit).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[T, R]):
    """Batches :meth:`submit` calls into ``flush(items) -> results`` (one result per item, in
    order). A flush that raises fails every submission of its batch with that exception. Use
    from one event loop only."""

    def __init__(self, flush: Callable[[list[T]], Awaitable[Sequence[R]]]) -> None:
        self._flush = flush
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self.flushes = 0  # how many flushes ran (tests, benchmarks)

    async def submit(self, item: T) -> R:
        """Queue ``item`` and wait for the flush that carries it; returns its result."""
        return await self.enqueue(item)

    def enqueue(self, item: T) -> asyncio.Future[R]:
        """Queue ``item`` now, without suspending; the future gets its result. Whatever else is
        queued before the caller next suspends goes out in the same flush: the flush starts at
        the earliest on the loop's next turn."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._drainer is None:
            self._drainer = asyncio.ensure_future(self._drain())
        return future

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                self.flushes += 1
                try:
                    results = await self._flush([item for item, _ in batch])
                except BaseException as exc:  # handed to every waiter of the batch
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        for _, future in self._pending:  # the loop is going away: nobody flushes these
                            future.cancel()
                        raise
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._drainer = None
