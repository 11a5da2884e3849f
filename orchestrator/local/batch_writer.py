"""The in-process executor's thread writer: records collected and written in batches from a
background task (``ProcessWriter`` in ``writer`` is the forked alternative with the same surface)."""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from storage.errors import StorageError
from storage.records import RunRecord
from storage.runs import RunStore
from orchestrator.local.writer import write_error

log = structlog.get_logger("irbench.local")


class BatchWriter:
    """Collects records and writes them to the store in batches from a background task.

    A failed write (disk full, permissions) never raises out of the background task: it is kept
    in ``failure``, ``failed`` is set so the executor stops starting runs, and later batches are
    dropped (``lost`` counts the records not stored; they run again on the next resume)."""

    def __init__(self, store: RunStore, flush_interval_s: float, flush_max_records: int) -> None:
        self._store = store
        self._interval_s = flush_interval_s
        self._max_records = flush_max_records
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
        if len(self._buffer) >= self._max_records:
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
                await asyncio.wait_for(self._wake.wait(), self._interval_s)
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
