"""The local executor's writer process: IR extraction, record validation and Parquet writes off
the event loop's process.

On the zero-latency simulator the event loop spent about a quarter of its CPU per run on work a
bare HTTP loop does not do: extracting and validating the IR, validating the ``RunRecord``, and
(in a thread, under the same GIL) turning records into Arrow and Parquet. A thread cannot take
CPU work off the loop, a process can. ``ProcessWriter`` starts
``child_main`` in a new interpreter once per ``run_local`` call and streams it the finished runs
(``PendingRecord``s: the answered runs, to be finished there; ``RunRecord``s: the rest) as
pickled frames over its stdin. The child finishes them, writes a batch every
``flush_interval_s`` (or ``flush_max_records``) with the store's own ``write`` (atomic publish,
fsync), and only then acknowledges the batch on its ack pipe.

Durability is what the in-process writer gave: a run counts as stored (``written``, the
summary's ``executed``) only once the child has acknowledged it, and the store is what resume
reads. If the child dies, the parent sees its ack pipe close early, stops starting runs and
raises one ``StorageError`` (like a full disk): runs sent but not acknowledged were either
published before the death (resume skips them) or not (resume runs them again). If the parent
dies, the child reads end-of-file on its stdin, writes every record it had received and exits;
it ignores SIGINT (a Ctrl-C reaches the whole process group) for the same reason: the parent
closes its stdin on the way out and the child drains it.

Frames are a 4-byte big-endian length and a pickle, both ways; the child moves its stdout out
of the way (to stderr) at start so that nothing a library prints can corrupt the ack stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno as errno_codes
import os
import pickle
import select
import signal
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from storage.errors import StorageError
from storage.records import Outcome, RunRecord
from storage.runs import RunStore
from workers.execute import PendingRecord, finished_fields

log = structlog.get_logger("irbench.local")
_HEADER = struct.Struct("!I")
_CHILD = "import sys; sys.path[:0] = sys.argv[1:]; from orchestrator.local_writer import child_main; sys.exit(child_main())"


@dataclass(frozen=True)
class WriterConfig:
    """What the child needs: the store (pickled whole, so a subclass works too) and the batching."""

    store: RunStore
    flush_interval_s: float
    flush_max_records: int


@dataclass(frozen=True)
class FinishedRun:
    """An acknowledged run that was finished in the child: what the parent logs and counts."""

    campaign: str
    run_id: str
    model: str
    fields: dict[str, Any]  # ``finished_fields`` of its record
    failed: bool


def write_error(root: object, failure: Exception | None, written: int, lost: int) -> StorageError:
    """A write failure as one actionable ``StorageError`` (both writers)."""
    cause = failure.__cause__ if isinstance(failure, StorageError) else failure
    if isinstance(cause, OSError) and cause.errno == errno_codes.ENOSPC:
        what = f"no space left on the device holding {root}"
    else:
        what = f"cannot write to {root} ({failure})"
    return StorageError(
        f"{what}: {written} runs stored, {lost} executed but not stored; free space (or fix "
        "the permissions) and run the same command again: stored runs are kept, the rest resume"
    )


def _frame(obj: object) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


class ProcessWriter:
    """The parent side; the same surface as ``local._BatchWriter`` (``add``, ``run``, ``close``,
    ``failed``, ``failure``, ``written``, ``lost``, ``error``). ``on_finished`` is called on the
    event loop for each acknowledged run that the child finished (so it is logged once, stored)."""

    def __init__(
        self, store: RunStore, config: WriterConfig, on_finished: Callable[[FinishedRun], None],
        send_interval_s: float = 0.005,
    ) -> None:
        self._store = store
        self._config = config
        self._on_finished = on_finished
        self._send_interval_s = send_interval_s  # a few runs per frame: one pickle + one write each
        self._buffer: list[RunRecord | PendingRecord] = []
        self._wake = asyncio.Event()
        self._closing = False
        self._sent = 0
        self._proc: asyncio.subprocess.Process | None = None
        self.written = 0
        self.lost = 0
        self.failure: Exception | None = None
        self.failed = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        """Start the child and hand it its configuration (before any record is added)."""
        # The child imports what this process imported: its sys.path, in front (``-m`` would put
        # the working directory first, which may hold another checkout of irbench).
        paths = [p or os.getcwd() for p in sys.path]
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _CHILD, *paths, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        assert self._proc.stdin is not None
        self._proc.stdin.write(_frame(self._config))

    def add(self, record: RunRecord | PendingRecord) -> None:
        if self.failure is not None:
            self.lost += 1
            return
        self._buffer.append(record)
        self._wake.set()

    def _fail(self, failure: Exception) -> None:
        if self.failure is None:
            self.failure = failure
            self.failed.set()
            log.info("store_write_failed", error=str(failure))  # the raised error says it

    async def _send_loop(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        while True:
            if not self._closing:
                await self._wake.wait()
                self._wake.clear()
                await asyncio.sleep(self._send_interval_s)
            batch, self._buffer = self._buffer, []
            if batch and self.failure is None:
                try:
                    proc.stdin.write(_frame(batch))
                    await proc.stdin.drain()
                    self._sent += len(batch)
                except (BrokenPipeError, ConnectionResetError):
                    self.lost += len(batch)
                    self._fail(StorageError("the writer process exited unexpectedly"))
            elif batch:
                self.lost += len(batch)
            if self._closing and not self._buffer:
                break
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.close()
            await proc.stdin.wait_closed()

    async def _read_loop(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        while True:
            try:
                head = await proc.stdout.readexactly(_HEADER.size)
                message = pickle.loads(await proc.stdout.readexactly(_HEADER.unpack(head)[0]))
            except asyncio.IncompleteReadError:
                if not self._closing:  # killed, or crashed: stop starting runs now
                    self._fail(StorageError("the writer process exited unexpectedly"))
                return
            kind = message[0]
            if kind == "stored":
                _, count, finished = message
                self.written += count
                for run in finished:
                    self._on_finished(run)
            elif kind == "failed":
                _, code, text = message
                failure = StorageError(text)
                if code is not None:
                    failure.__cause__ = OSError(code, os.strerror(code))
                self._fail(failure)

    async def run(self) -> None:
        """Stream records to the child until ``close()``, then wait for its last acknowledgement
        and its exit; a child that exits before acknowledging everything sent is a failure."""
        assert self._proc is not None, "start() first"
        await asyncio.gather(self._send_loop(), self._read_loop())
        code = await self._proc.wait()
        unacked = self._sent - self.written
        if self.failure is None and (code != 0 or unacked):
            self._fail(StorageError(f"the writer process exited with code {code} before storing {unacked} runs"))
        if self.failure is not None:
            self.lost += max(0, unacked)

    def close(self) -> None:
        """Ask ``run()`` to send what is left, close the child's stdin and wait for it."""
        self._closing = True
        self._wake.set()

    def kill(self) -> None:
        """Tests: SIGKILL the child."""
        if self._proc is not None:
            self._proc.kill()

    def error(self) -> StorageError:
        return write_error(self._store.root, self.failure, self.written, self.lost)


# --- the child ---------------------------------------------------------------------------------


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None  # end of file (a frame cut short: the parent died mid-write)
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int) -> Any:
    head = _read_exactly(fd, _HEADER.size)
    if head is None:
        return None
    body = _read_exactly(fd, _HEADER.unpack(head)[0])
    return None if body is None else pickle.loads(body)


class _Child:
    def __init__(self, config: WriterConfig, ack_fd: int) -> None:
        self.config = config
        self.ack_fd = ack_fd
        self.parent_gone = False
        self.failed = False
        self.pending: list[RunRecord] = []
        self.finished: list[FinishedRun] = []
        self.deadline: float | None = None

    def send(self, message: object) -> None:
        if self.parent_gone:
            return
        data = memoryview(_frame(message))
        try:
            while data:
                data = data[os.write(self.ack_fd, data):]
        except OSError:  # the parent is gone: keep storing what it sent
            self.parent_gone = True

    def take(self, items: list[RunRecord | PendingRecord]) -> None:
        if self.failed:
            return
        for item in items:
            if isinstance(item, PendingRecord):
                record = item.finish()
                self.finished.append(FinishedRun(
                    record.campaign, record.run_id, record.model, finished_fields(record),
                    record.failed and record.outcome is Outcome.OK,  # other outcomes were counted there
                ))
            else:
                record = item
            self.pending.append(record)
        if self.deadline is None and self.pending:
            self.deadline = time.monotonic() + self.config.flush_interval_s
        if len(self.pending) >= self.config.flush_max_records:
            self.flush()

    def flush(self) -> None:
        batch, finished, self.pending, self.finished, self.deadline = self.pending, self.finished, [], [], None
        if not batch or self.failed:
            return
        try:
            self.config.store.write(batch)
        except (StorageError, OSError) as exc:
            self.failed = True
            cause = exc.__cause__ if isinstance(exc, StorageError) else exc
            self.send(("failed", cause.errno if isinstance(cause, OSError) else None, str(exc)))
            return
        self.send(("stored", len(batch), finished))


def child_main() -> int:
    """The child (``ProcessWriter.start``): serve one ``run_local`` call, then exit 0."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ack_fd = os.dup(1)
    os.dup2(2, 1)  # a stray print goes to stderr, not into the ack stream
    config = _read_frame(0)
    if config is None:
        return 0
    child = _Child(config, ack_fd)
    try:
        while True:
            timeout = None if child.deadline is None else max(0.0, child.deadline - time.monotonic())
            ready, _, _ = select.select([0], [], [], timeout)
            if not ready:
                child.flush()
                continue
            items = _read_frame(0)
            if items is None:
                break
            child.take(items)
        child.flush()
    except Exception as exc:  # a bug: say it to the parent (it raises), then fail loudly here too
        child.send(("failed", None, f"the writer process failed: {type(exc).__name__}: {exc}"))
        raise
    return 0


