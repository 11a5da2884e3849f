"""The local executor's writer process: IR extraction, record validation and Parquet writes off
the event loop's process.

On the zero-latency simulator the event loop spent about a quarter of its CPU per run on work a
bare HTTP loop does not do: extracting and validating the IR, validating the ``RunRecord``, and
(in a thread, under the same GIL) turning records into Arrow and Parquet. A thread cannot take
CPU work off the loop, a process can. ``ProcessWriter`` forks a child once per ``run_local``
call and streams it the finished runs (``PendingRecord``s: the answered runs, to be finished
there; ``RunRecord``s: the rest) as pickled frames over a pipe. The child finishes them, writes
a batch every ``flush_interval_s`` (or ``flush_max_records``) with the store's own ``write``
(atomic publish, fsync), and only then acknowledges the batch on a second pipe.

Why fork and not a fresh interpreter: a fresh one spends ~0.65 s of CPU (1.3-1.6 s at load 8)
importing pyarrow, pydantic and the storage modules, as much as 600 runs' worth of the work it
takes over; a fork has them already. The child closes every descriptor it inherited but its two
pipe ends (sockets of the parent's connections would otherwise stay open in it), touches neither
the event loop nor the parent's threads, and leaves with ``os._exit``. Where ``os.fork`` does not
exist the executor keeps its in-process writer.

Durability is what the in-process writer gave: a run counts as stored (``written``, the
summary's ``executed``) only once the child has acknowledged it, and the store is what resume
reads. If the child dies, the parent sees its ack pipe close early, stops starting runs and
raises one ``StorageError`` (like a full disk): runs sent but not acknowledged were either
published before the death (resume skips them) or not (resume runs them again). If the parent
dies, the child reads end-of-file, writes every record it had received and exits; it ignores
SIGINT (a Ctrl-C reaches the whole process group) for the same reason: the parent closes the
pipe on its way out and the child drains it. Frames are two 4-byte big-endian integers (the
body's length, the runs in it; 0 in acknowledgements) and a pickle.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno as errno_codes
import gc
import itertools
import os
import pickle
import select
import signal
import struct
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from storage.errors import StorageError
from storage.records import Outcome, RunRecord
from storage.runs import RunStore
from workers.execute import PendingRecord, finished_fields

log = structlog.get_logger("irbench.local")
_HEADER = struct.Struct("!II")  # body length, runs in it (0 in acknowledgements)


@dataclass(frozen=True)
class WriterConfig:
    """What the child needs (it inherits the objects through the fork): the store and the batching."""

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


def _frame(obj: object, runs: int = 0) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body), runs) + body


class ProcessWriter:
    """The parent side; the same surface as ``batch_writer.BatchWriter`` (``add``, ``run``, ``close``,
    ``failed``, ``failure``, ``written``, ``lost``, ``error``). ``on_finished`` is called on the
    event loop for each acknowledged run that the child finished (so it is logged once, stored)."""

    def __init__(
        self, store: RunStore, config: WriterConfig, on_finished: Callable[[FinishedRun], None],
        send_interval_s: float = 0.01,
    ) -> None:
        self._store = store
        self._config = config
        self._on_finished = on_finished
        self._send_interval_s = send_interval_s  # a few runs per frame: one pickle + one write each
        self._buffer: list[RunRecord | PendingRecord] = []
        self._wake = asyncio.Event()
        self._closing = False
        self._sent = 0
        self._pid: int | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.written = 0
        self.lost = 0
        self.failure: Exception | None = None
        self.failed = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self._pid

    async def start(self) -> None:
        """Fork the child (before any record is added)."""
        loop = asyncio.get_running_loop()
        records_r, records_w = os.pipe()
        acks_r, acks_w = os.pipe()
        # The child's garbage collections would walk every object it inherited, and so copy
        # (copy-on-write) most of the parent's heap: ~5 page faults per run over 1,000 runs,
        # 0.05-0.1 ms of the child's CPU per run (bench/writer_cpu.py measures this).
        # Frozen, the inherited objects are never walked there; the parent unfreezes them at
        # once (unless something else of this process had frozen objects: then they stay).
        thaw = gc.get_freeze_count() == 0
        gc.freeze()
        try:
            pid = os.fork()
        except BaseException:
            if thaw:
                gc.unfreeze()
            raise
        if pid != 0 and thaw:
            gc.unfreeze()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                code = _child(self._config, records_r, acks_w)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        self._pid = pid
        os.close(records_r)
        os.close(acks_w)
        reader = self._reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(acks_r, "rb", 0))
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(records_w, "wb", 0)
        )
        self._writer = asyncio.StreamWriter(transport, protocol, None, loop)

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
        stream = self._writer
        assert stream is not None
        while True:
            if not self._closing:
                await self._wake.wait()
                self._wake.clear()
                await asyncio.sleep(self._send_interval_s)
            batch, self._buffer = self._buffer, []
            if batch and self.failure is None:
                try:
                    stream.write(_frame(batch, len(batch)))
                    await stream.drain()
                    self._sent += len(batch)
                except (BrokenPipeError, ConnectionResetError):
                    self.lost += len(batch)
                    self._fail(StorageError("the writer process exited unexpectedly"))
            elif batch:
                self.lost += len(batch)
            if self._closing and not self._buffer:
                break
        stream.close()  # after the drain above: nothing left in its buffer; the child reads EOF

    async def _read_loop(self) -> None:
        stream = self._reader
        assert stream is not None
        while True:
            try:
                head = await stream.readexactly(_HEADER.size)
                message = pickle.loads(await stream.readexactly(_HEADER.unpack(head)[0]))
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
        assert self._pid is not None, "start() first"
        await asyncio.gather(self._send_loop(), self._read_loop())
        # the ack pipe is closed: the child has exited or is about to
        _, status = await asyncio.to_thread(os.waitpid, self._pid, 0)
        code = os.waitstatus_to_exitcode(status)
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
        if self._pid is not None:
            os.kill(self._pid, signal.SIGKILL)

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


def _read_frame(fd: int) -> tuple[int, bytes] | None:
    """``(runs, pickled body)`` of the next frame, or None at end of file (unpickled when its
    batch is written: see ``_Child``)."""
    head = _read_exactly(fd, _HEADER.size)
    if head is None:
        return None
    length, runs = _HEADER.unpack(head)
    body = _read_exactly(fd, length)
    return None if body is None else (runs, body)


class _Child:
    """Runs arrive a frame (a few runs) every ``send_interval_s``; they are unpickled and finished
    (IR extraction, record validation) only when their batch is written. Doing a batch in one
    go keeps the code and data it touches in the CPU's caches: done as each frame arrived,
    between the parent's and the simulator's turns on the same cores, the same work cost
    ~25 % more CPU (bench/writer_cpu.py measures this)."""

    def __init__(self, config: WriterConfig, ack_fd: int) -> None:
        self.config = config
        self.ack_fd = ack_fd
        self.parent_gone = False
        self.failed = False
        self.frames: list[bytes] = []  # pickled lists of RunRecord | PendingRecord
        self.runs = 0  # in ``frames``
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

    def take(self, runs: int, frame: bytes) -> None:
        if self.failed:
            return
        self.frames.append(frame)
        self.runs += runs
        if self.deadline is None:
            self.deadline = time.monotonic() + self.config.flush_interval_s
        if self.runs >= self.config.flush_max_records:
            self.flush()

    def flush(self) -> None:
        frames, self.frames, self.runs, self.deadline = self.frames, [], 0, None
        if not frames or self.failed:
            return
        batch: list[RunRecord] = []
        finished: list[FinishedRun] = []
        for item in itertools.chain.from_iterable(map(pickle.loads, frames)):
            if isinstance(item, PendingRecord):
                record = item.finish()
                finished.append(FinishedRun(
                    record.campaign, record.run_id, record.model, finished_fields(record),
                    record.failed and record.outcome is Outcome.OK,  # other outcomes were counted there
                ))
            else:
                record = item
            batch.append(record)
        try:
            self.config.store.write(batch)
        except (StorageError, OSError) as exc:
            self.failed = True
            cause = exc.__cause__ if isinstance(exc, StorageError) else exc
            self.send(("failed", cause.errno if isinstance(cause, OSError) else None, str(exc)))
            return
        self.send(("stored", len(batch), finished))


def _close_inherited(keep: set[int]) -> None:
    """Close every descriptor but 0-2 and ``keep``: the parent's sockets, listening sockets and
    event-loop descriptors must not live on in the child (a connection the parent closes would
    stay open here)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: every number up to the limit
        fds = list(range(3, os.sysconf("SC_OPEN_MAX")))
    for fd in fds:
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _child(config: WriterConfig, records_fd: int, acks_fd: int) -> int:
    """The forked child: serve one ``run_local`` call, then return 0."""
    with contextlib.suppress(ValueError):  # forked from a thread other than the main one
        signal.set_wakeup_fd(-1)  # the parent's loop's, about to be closed
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _close_inherited({records_fd, acks_fd})
    child = _Child(config, acks_fd)
    try:
        while True:
            timeout = None if child.deadline is None else max(0.0, child.deadline - time.monotonic())
            ready, _, _ = select.select([records_fd], [], [], timeout)
            if not ready:
                child.flush()
                continue
            frame = _read_frame(records_fd)
            if frame is None:
                break
            child.take(*frame)
        child.flush()
    except Exception as exc:  # a bug: say it to the parent (it raises), then fail loudly here too
        child.send(("failed", None, f"the writer process failed: {type(exc).__name__}: {exc}"))
        raise
    return 0
