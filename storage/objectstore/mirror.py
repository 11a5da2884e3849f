"""A local mirror of a bucket store: every verb works on a directory, the bucket is the truth.

``Mirror.pull()`` brings the bucket's files into the mirror directory (a cache; only what
changed is downloaded), ``push()`` sends what this process added, rewrote or removed there back
(uploads first, deletions after, so a reader never misses a run: the compacted file is in
the bucket before its inputs go). Object stores have no rename, but a PUT is atomic: a reader
sees a whole object or none, and readers deduplicate executions, so a file uploaded twice or a
compaction killed between its upload and its deletions duplicates nothing in analysis.

A deletion propagates only for a file this process saw in the mirror and then removed
(compaction's inputs); a file missing from a mirror for another reason is downloaded again.
What is synced: every file under the root except hidden names (temporary files, this
mirror's own state) and each writer's ``_spool`` — the store's marker ``.irbench-store``
excepted, so every machine agrees on the store's identity.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable, Iterator
import threading
from collections.abc import Callable
from typing import TypeVar, cast
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from storage.errors import StorageError
from storage.objectstore.client import ObjectClient, ObjectInfo
from storage.objectstore.location import S3Location

T = TypeVar("T")
R = TypeVar("R")

STATE_NAME = ".irbench-mirror.json"
LOCK_NAME = ".irbench-mirror.lock"
MARKER_NAME = ".irbench-store"  # storage.parquet.store_marker's file: synced like data
_LOCAL_ONLY_DIRS = frozenset({"_spool"})


def synced(relative: str) -> bool:
    """True when the file at ``relative`` (POSIX, under the store root) belongs in the bucket."""
    if relative == MARKER_NAME:
        return True
    parts = relative.split("/")
    return not any(p.startswith(".") or p in _LOCAL_ONLY_DIRS for p in parts) and not relative.endswith(".lock")


@dataclass(frozen=True)
class SyncReport:
    """What one pull or push moved: files and bytes transferred, files deleted."""

    files_moved: int = 0
    bytes_moved: int = 0
    files_deleted: int = 0


@dataclass
class _Entry:
    etag: str
    size_bytes: int
    mtime_ns: int


class Mirror:
    """The store at ``location`` mirrored in the directory ``root``.

    ``client``: the bucket (:class:`storage.objectstore.client.S3Client`); ``parallel``: the
    transfers in flight at once (small files dominate: the latency of a request, not bandwidth,
    sets the pace); ``list_retries``: fresh listings after an object vanished between listing
    and reading (a concurrent compaction).
    """

    def __init__(self, client: ObjectClient, location: S3Location, root: Path, *,
                 parallel: int = 16, list_retries: int = 5) -> None:
        self.client = client
        self.location = location
        self.root = Path(root)
        self.parallel = parallel
        self.list_retries = list_retries
        self.root.mkdir(parents=True, exist_ok=True)
        self._seen: set[str] = set()  # files present after this process's last pull or push

    # ----- state ----------------------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[dict[str, _Entry]]:
        """The mirror's state (relative path -> what the bucket holds), under an exclusive lock
        shared by every process using this mirror; saved on exit."""
        fd = os.open(self.root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            state = self._load()
            yield state
            self._save(state)
        finally:
            os.close(fd)

    def _load(self) -> dict[str, _Entry]:
        try:
            raw = json.loads((self.root / STATE_NAME).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise StorageError(f"the mirror state {self.root / STATE_NAME} is unreadable ({exc}); delete it to re-sync") from None
        return {k: _Entry(*v) for k, v in raw.items()}

    def _save(self, state: dict[str, _Entry]) -> None:
        tmp = self.root / f".{STATE_NAME}.tmp"
        tmp.write_text(json.dumps({k: [e.etag, e.size_bytes, e.mtime_ns] for k, e in state.items()}), encoding="utf-8")
        os.replace(tmp, self.root / STATE_NAME)

    def _local_files(self) -> dict[str, os.stat_result]:
        out: dict[str, os.stat_result] = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel_dir = os.path.relpath(dirpath, self.root)
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in _LOCAL_ONLY_DIRS]
            for name in filenames:
                rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
                if synced(rel):
                    out[rel] = os.stat(os.path.join(dirpath, name))
        return out

    # ----- pull -----------------------------------------------------------------------------------
    def pull(self) -> SyncReport:
        """Bring the mirror up to the bucket: download new and rewritten objects, drop local
        copies of objects deleted there (unless changed here since). Lists the whole prefix."""
        for _ in range(self.list_retries + 1):
            remote = self._remote()
            try:
                return self._pull(remote)
            except FileNotFoundError:
                continue  # an object vanished between listing and reading: list again
        raise StorageError(f"{self.location.url} kept changing while it was read; try again")

    def _remote(self) -> dict[str, ObjectInfo]:
        head = self.location.key("")
        return {rel: info for key, info in self.client.list(head).items()
                if synced(rel := self.location.relative(key))}

    def _pull(self, remote: dict[str, ObjectInfo]) -> SyncReport:
        with self._locked() as state:
            local = self._local_files()
            wanted = [rel for rel, info in remote.items()
                      if not _matches(state.get(rel), info.etag, local.get(rel))]
            moved = self._download(wanted, state, remote)
            deleted = 0
            for rel in [r for r in state if r not in remote]:
                entry, st = state.pop(rel), local.get(rel)
                if st is not None and (st.st_size, st.st_mtime_ns) == (entry.size_bytes, entry.mtime_ns):
                    (self.root / rel).unlink(missing_ok=True)
                    deleted += 1
            self._seen = set(self._local_files())
        return SyncReport(len(wanted), moved, deleted)

    def pull_keys(self, relatives: Iterable[str]) -> SyncReport:
        """Download the named files (paths under the store root) unless the mirror has them:
        what a follower does with the files it is told were published, without a listing."""
        with self._locked() as state:
            wanted = [r for r in dict.fromkeys(relatives) if synced(r) and (r not in state or not (self.root / r).exists())]
            moved = self._download(wanted, state, None, missing_ok=True)
            self._seen.update(r for r in wanted if r in state)
        return SyncReport(len(wanted), moved, 0)

    def _download(self, rels: list[str], state: dict[str, _Entry], remote: dict[str, ObjectInfo] | None,
                  missing_ok: bool = False) -> int:
        def fetch(rel: str) -> tuple[str, ObjectInfo | None]:
            try:
                return rel, self.client.download(self.location.key(rel), self.root / rel)
            except FileNotFoundError:
                if missing_ok:
                    return rel, None
                raise

        moved = 0
        for rel, info in parallel_map(fetch, rels, self.parallel):
            if info is None:
                continue
            st = os.stat(self.root / rel)
            etag = remote[rel].etag if remote is not None and rel in remote else info.etag
            state[rel] = _Entry(etag, st.st_size, st.st_mtime_ns)
            moved += st.st_size
        return moved

    # ----- push -----------------------------------------------------------------------------------
    def push(self) -> SyncReport:
        """Send this mirror's changes to the bucket: new and rewritten files, then the removal
        of files this process saw and then removed (see the module docstring)."""
        with self._locked() as state:
            local = self._local_files()
            changed = [rel for rel, st in local.items() if not _matches(state.get(rel), None, st)]

            def put(rel: str) -> tuple[str, str]:
                return rel, self.client.upload(self.root / rel, self.location.key(rel)) or ""

            moved = 0
            for rel, etag in parallel_map(put, changed, self.parallel):
                st = local[rel]
                state[rel] = _Entry(etag, st.st_size, st.st_mtime_ns)
                moved += st.st_size
            gone = [rel for rel in self._seen if rel not in local and rel in state]
            if gone:
                self.client.delete(self.location.key(rel) for rel in gone)
                for rel in gone:
                    state.pop(rel, None)
            self._seen = set(local)
        return SyncReport(len(changed), moved, len(gone))


def parallel_map(fn: Callable[[T], R], items: list[T], threads: int) -> list[R]:
    """``[fn(x) for x in items]`` on up to ``threads`` threads, in order; the first error is
    raised once all are done. Plain threads, not an executor: the CLI's last push runs at
    interpreter exit, when ``concurrent.futures`` accepts no more work."""
    results: list[R | None] = [None] * len(items)
    errors: list[BaseException] = []
    cursor = iter(range(len(items)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(cursor, None)
            if i is None or errors:
                return
            try:
                results[i] = fn(items[i])
            except BaseException as exc:  # handed to the caller below
                errors.append(exc)

    pool = [threading.Thread(target=work, daemon=True) for _ in range(min(threads, len(items)))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return cast("list[R]", results)  # every slot is filled when no error was raised


def _matches(entry: _Entry | None, etag: str | None, st: os.stat_result | None) -> bool:
    """True when the local file is the synced copy (same size and mtime as recorded) and, when
    ``etag`` is given, the bucket's object is still the one it was synced from."""
    if entry is None or st is None:
        return False
    if (st.st_size, st.st_mtime_ns) != (entry.size_bytes, entry.mtime_ns):
        return False
    return etag is None or etag == entry.etag
