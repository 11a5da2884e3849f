"""Group commit of run records: one writer process, many threads, few Parquet files.

A worker acknowledges a run only once its record is durable, but one Parquet file per run is
~30 KiB, and a store of one file per run reads slowly. So each writer process appends records to a spool
*segment* (JSON lines) and acknowledges after the segment is fsynced — concurrent appends share
one fsync (group commit) — and a publisher thread turns each closed segment into one Parquet
file of the runs dataset, then deletes it. Layout (hidden from readers: ``_`` prefix)::

    ROOT/runs/_spool/<writer>.lock                 flock held for the writer's lifetime
    ROOT/runs/_spool/<writer>-<seq:08d>.jsonl      segments, oldest first

A segment is closed when it holds ``max_rows`` records, is ``max_age_s`` old, or has seen no
append for ``idle_s`` (so the last records of a campaign are published promptly). Publishing
is idempotent: the file stem is ``spool-<writer>-<seq>`` with first-writer-wins, so re-running it
after a crash publishes nothing twice (a copy that survives a compaction collapses on read: same
execution id). A writer killed with records in its spool leaves its lock free; any process can
then publish its segments with :func:`recover_orphans` (workers do at start, compaction and the
distributed orchestrator do too). ``flock`` needs a local or flock-honouring filesystem.

Segments also hold *intents* (``storage.parquet.intents``): :meth:`RunSpool.intend` makes the
record an execution is to have if its process dies mid-call durable, group-committed with the
records; a record of the same execution resolves it. A segment's unresolved intents are
copied into the current segment (and fsynced) before the segment is deleted, so every
unresolved intent stays on disk; recovery publishes them under the stem ``spool-<writer>-died``
(first-writer-wins, written before any segment goes: a second recovery duplicates nothing).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from storage.parquet.dataset import ParquetDataset, fsync_dir
from storage.parquet.intents import intent_line, is_intent, read_journal, resolved_line, unresolved
from storage.errors import StorageError
from storage.records import RunRecord
from storage.schema import records_to_table

SPOOL_DIR = "_spool"
SEGMENT_SUFFIX = ".jsonl"
DIED_SUFFIX = "died"  # the stem of a recovered writer's unresolved intents: spool-<writer>-died


@dataclass(frozen=True)
class SpoolConfig:
    """When a segment is closed and published: ``max_rows`` records, ``max_age_s`` seconds
    after its first append, or ``idle_s`` seconds without an append. Bigger segments mean
    fewer, larger files; ``max_age_s`` and ``idle_s`` bound how late a stored run shows up in
    the dataset."""

    max_rows: int = 2000
    max_age_s: float = 5.0
    idle_s: float = 0.5


@dataclass
class _Segment:
    seq: int
    path: Path
    fd: int
    records: list[RunRecord] = field(default_factory=list)
    opened_s: float = 0.0
    last_append_s: float = 0.0
    last_write: int = 0  # write sequence number of the last append into this segment


def spool_dir(dataset: ParquetDataset) -> Path:
    return dataset.path / SPOOL_DIR


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _publish(dataset: ParquetDataset, writer: str, seq: int | str, records: Sequence[RunRecord]) -> int:
    if not records:
        return 0
    table = records_to_table(records)
    part = f"{seq:08d}" if isinstance(seq, int) else seq
    return dataset.write(table, stem=f"spool-{writer}-{part}").rows_written


class RunSpool:
    """The spool of one writer process for ``dataset`` (the runs dataset).

    ``append`` blocks until the records are durable (fsynced); publication happens on a
    background thread. ``writer``: a unique, file-name-safe id (default: ``<pid>-<random>``).
    ``clock``: monotonic seconds. ``on_error`` receives publisher failures (they are retried
    on the next cycle; the records stay durable in their segment meanwhile).
    """

    def __init__(
        self,
        dataset: ParquetDataset,
        *,
        config: SpoolConfig = SpoolConfig(),
        writer: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self.dataset = dataset
        self.config = config
        self.writer = writer or f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._clock = clock
        self._on_error = on_error
        self.dir = spool_dir(dataset)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.dir / f"{self.writer}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours for the process's life
        self._lock = threading.Lock()  # segment list, write counters
        self._sync_lock = threading.Lock()  # one fsync at a time; it covers every earlier write
        self._wake = threading.Condition(self._lock)
        self._seq = 0
        self._current: _Segment | None = None
        self._closed: list[_Segment] = []  # closed, not yet published
        self._unsynced: dict[int, _Segment] = {}
        self._written = 0
        self._synced = 0
        self._intents: dict[str | None, tuple[int, bytes]] = {}  # unresolved: execution -> (segment, line)
        self._stopping = False
        self.files_published = 0
        self.rows_published = 0
        self._thread = threading.Thread(target=self._publisher, name="irbench-spool", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ appending
    def append(self, records: Sequence[RunRecord]) -> None:
        """Make ``records`` durable; returns once they survive a SIGKILL of this process. Each
        resolves the intents of its execution (in the same fsync)."""
        if not records:
            return
        data = b"".join(r.model_dump_json().encode() + b"\n" for r in records)
        with self._lock:
            seg = self._write_locked(data)
            seg.records.extend(records)
            seg.last_append_s = self._clock()
            for r in records:
                self._intents.pop(r.execution_id, None)
            if len(seg.records) >= self.config.max_rows:
                self._wake.notify()
            mine = self._written
        self._sync(mine)

    def intend(self, intents: Sequence[RunRecord]) -> None:
        """Make ``intents`` durable: each is the record its execution gets if this process dies
        before appending a record of that ``execution_id``. Returns once they survive a
        SIGKILL; group-committed with :meth:`append`."""
        if not intents:
            return
        lines = [intent_line(r) for r in intents]
        with self._lock:
            seg = self._write_locked(b"".join(lines))
            for r, line in zip(intents, lines):
                self._intents[r.execution_id] = (seg.seq, line)
            mine = self._written
        self._sync(mine)

    def resolve(self, execution_ids: Sequence[str]) -> None:
        """Resolve the intents of ``execution_ids`` without a record (their executions ended
        with nothing to store); returns once that is durable."""
        with self._lock:
            if not [e for e in execution_ids if self._intents.pop(e, None) is not None]:
                return
            self._write_locked(b"".join(resolved_line(e) for e in execution_ids))
            mine = self._written
        self._sync(mine)

    def _write_locked(self, data: bytes) -> _Segment:
        """Write ``data`` into the current segment, not yet fsynced (caller holds ``_lock``)."""
        if self._stopping:
            raise StorageError("the spool is closed; no record can be stored through it")
        seg = self._segment()
        try:
            _write_all(seg.fd, data)
        except OSError as exc:
            raise StorageError(f"cannot append to {seg.path}: {exc}; check space") from exc
        self._written += 1
        seg.last_write = self._written
        self._unsynced[seg.seq] = seg
        return seg

    def _carry_intents(self, seg: _Segment) -> None:
        """Copy the unresolved intents whose latest copy is in ``seg`` into the current
        segment and fsync them: ``seg`` can then go."""
        with self._lock:
            moved = [(eid, line) for eid, (seq, line) in self._intents.items() if seq == seg.seq]
            if not moved:
                return
            cur = self._segment()
            try:
                _write_all(cur.fd, b"".join(line for _, line in moved))
            except OSError as exc:
                raise StorageError(f"cannot append to {cur.path}: {exc}; check space") from exc
            for eid, line in moved:
                self._intents[eid] = (cur.seq, line)
            self._written += 1
            cur.last_write = mine = self._written
            self._unsynced[cur.seq] = cur
        self._sync(mine)

    @property
    def open_intents(self) -> int:
        """Intents no record has resolved yet (calls in flight, or executions that ended
        without a record)."""
        with self._lock:
            return len(self._intents)

    def _segment(self) -> _Segment:
        if self._current is None:
            self._seq += 1
            path = self.dir / f"{self.writer}-{self._seq:08d}{SEGMENT_SUFFIX}"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            fsync_dir(self.dir)  # the segment's name is durable before anything in it is acked
            now = self._clock()
            self._current = _Segment(self._seq, path, fd, opened_s=now, last_append_s=now)
        return self._current

    def _sync(self, upto: int) -> None:
        """Group commit: one thread fsyncs every segment written since the last fsync."""
        with self._sync_lock:
            if self._synced >= upto:
                return  # another thread's fsync covered our write
            with self._lock:
                target, segs = self._written, list(self._unsynced.values())
                self._unsynced.clear()
            try:
                for seg in segs:
                    os.fsync(seg.fd)
            except OSError as exc:
                raise StorageError(f"cannot fsync the spool under {self.dir}: {exc}") from exc
            self._synced = target

    # ------------------------------------------------------------------ publishing
    def _due(self, seg: _Segment, now: float) -> bool:
        c = self.config
        return bool(seg.records) and (
            len(seg.records) >= c.max_rows
            or now - seg.opened_s >= c.max_age_s
            or now - seg.last_append_s >= c.idle_s
        )

    def _rotate(self, force: bool = False) -> None:
        """Close the current segment if it is due (caller holds ``_lock``)."""
        seg = self._current
        if seg is not None and (self._due(seg, self._clock()) or (force and seg.records)):
            self._closed.append(seg)
            self._current = None

    def _publisher(self) -> None:
        tick = max(0.01, min(self.config.idle_s, self.config.max_age_s) / 4)
        while True:
            with self._lock:
                if not self._stopping:
                    self._wake.wait(tick)
                stopping = self._stopping
                self._rotate(force=stopping)
                todo = list(self._closed)
            for seg in todo:
                try:
                    self._publish_segment(seg)
                except Exception as exc:
                    if self._on_error is not None:
                        self._on_error(exc)
                    if not stopping:
                        time.sleep(tick)
                    break
            if stopping:  # what is left stays durable in its segment: an orphan to recover
                return

    def _publish_segment(self, seg: _Segment) -> None:
        self._sync(seg.last_write)
        rows = _publish(self.dataset, self.writer, seg.seq, seg.records)
        self._carry_intents(seg)
        os.close(seg.fd)
        seg.path.unlink(missing_ok=True)
        with self._lock:
            self._closed.remove(seg)
            self.files_published += 1 if rows else 0
            self.rows_published += rows

    def flush(self, timeout_s: float = 30.0) -> None:
        """Publish everything appended so far (closes the current segment); blocks."""
        with self._lock:
            self._rotate(force=True)
            self._wake.notify()
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if not self._closed:
                    return
            if time.monotonic() > deadline:
                raise StorageError(f"spool {self.writer}: segments not published within {timeout_s} s")
            time.sleep(0.01)

    def close(self, timeout_s: float = 30.0) -> None:
        """Publish what is left, stop the publisher and release the writer lock."""
        with self._lock:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout_s)
        os.close(self._lock_fd)  # unpublished segments (if any) become orphans: recoverable
        try:
            (self.dir / f"{self.writer}.lock").unlink()
        except FileNotFoundError:
            pass


def read_segment(path: Path) -> tuple[list[RunRecord], int]:
    """Records of one segment file (its intents left out) and how many lines were unreadable
    (a torn last line)."""
    journal = read_journal(path)
    return journal.records, journal.bad


def recover_orphans(dataset: ParquetDataset) -> int:
    """Publish the segments of every writer that is gone (its lock is free); returns rows.

    Safe to run from any number of processes at once and next to live writers.
    """
    sdir = spool_dir(dataset)
    if not sdir.is_dir():
        return 0
    rows = 0
    names = sorted(os.listdir(sdir))
    writers = {n[: -len(".lock")] for n in names if n.endswith(".lock")}
    writers |= {n[: -len(SEGMENT_SUFFIX)].rsplit("-", 1)[0] for n in names if n.endswith(SEGMENT_SUFFIX)}
    for writer in sorted(writers):
        lock_path = sdir / f"{writer}.lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live writer (or another recoverer)
            rows += _recover_writer(dataset, sdir, writer)
            lock_path.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return rows


def _recover_writer(dataset: ParquetDataset, sdir: Path, writer: str) -> int:
    """Publish the segments of the dead ``writer`` (its lock held by the caller): first its
    unresolved intents (stem ``spool-<writer>-died``), then each segment's records; returns rows."""
    names = sorted(n for n in os.listdir(sdir) if n.startswith(f"{writer}-") and n.endswith(SEGMENT_SUFFIX))
    segments = [(int(n[len(writer) + 1 : -len(SEGMENT_SUFFIX)]), sdir / n, read_journal(sdir / n)) for n in names]
    records = [r for _, _, j in segments for r in j.records]
    intents = [i for _, _, j in segments for i in j.intents]
    resolved = {e for _, _, j in segments for e in j.resolved}
    rows = _publish(dataset, writer, DIED_SUFFIX, unresolved(records, intents, resolved))
    for seq, path, journal in segments:
        rows += _publish(dataset, writer, seq, journal.records)
        path.unlink(missing_ok=True)
    return rows


def pending_rows(dataset: ParquetDataset) -> int:
    """Records sitting in spool segments (durable, not yet in the dataset): a progress aid."""
    sdir = spool_dir(dataset)
    if not sdir.is_dir():
        return 0
    n = 0
    for name in os.listdir(sdir):
        if name.endswith(SEGMENT_SUFFIX):
            try:
                with open(sdir / name, "rb") as fh:
                    n += sum(1 for line in fh if line.strip() and not is_intent(line))
            except FileNotFoundError:
                pass
    return n
