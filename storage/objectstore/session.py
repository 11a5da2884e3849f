"""One process's use of a bucket store: the mirror pulled at start, pushed in the background
and at the end, and followed (for a long-running reader) while it runs."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from storage.objectstore.client import ObjectClient, ObjectStoreConfig, S3Client
from storage.objectstore.location import S3Location
from storage.objectstore.mirror import Mirror, SyncReport


@dataclass(frozen=True)
class BucketOptions:
    """``cache_dir``: where mirrors live (one folder per store and endpoint); ``push_interval_s``:
    how often what this process wrote goes to the bucket while it runs (0: only at the end);
    ``client``: timeouts and retries of each request."""

    cache_dir: Path
    push_interval_s: float = 5.0
    client: ObjectStoreConfig = ObjectStoreConfig()


def mirror_dir(cache_dir: Path, location: S3Location, endpoint: str) -> Path:
    """The mirror folder of ``location`` on ``endpoint``: readable, and distinct per endpoint."""
    tag = hashlib.sha256(f"{endpoint}|{location.url}".encode()).hexdigest()[:10]
    name = (location.prefix.replace("/", "_") or "_") + f"@{tag}"
    return cache_dir / location.bucket / name


class BucketSession:
    """The mirror of ``location`` for this process. ``open()`` pulls; ``close()`` stops the
    background threads and pushes once more. ``on_sync(kind, report)`` hears of each transfer
    that moved something."""

    def __init__(self, location: S3Location, options: BucketOptions, *, client: ObjectClient | None = None,
                 on_sync: Callable[[str, SyncReport], None] | None = None,
                 on_error: Callable[[Exception], None] | None = None) -> None:
        self.location = location
        self.options = options
        s3 = client or S3Client(location, options.client)
        endpoint = getattr(s3, "endpoint", "") or ""
        self.mirror = Mirror(s3, location, mirror_dir(options.cache_dir, location, endpoint))
        self._on_sync = on_sync
        self._on_error = on_error
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    @property
    def root(self) -> Path:
        return self.mirror.root

    @property
    def url(self) -> str:
        return self.location.url

    def open(self) -> BucketSession:
        self._report("pulled", self.mirror.pull())
        if self.options.push_interval_s > 0:
            self._every(self.options.push_interval_s, self.push, "irbench-push")
        return self

    def follow(self, interval_s: float) -> None:
        """Pull every ``interval_s`` seconds until closed (a viewer sees new runs)."""
        self._every(interval_s, self.pull, "irbench-pull")

    def pull(self) -> SyncReport:
        with self._lock:
            report = self.mirror.pull()
        self._report("pulled", report)
        return report

    def push(self) -> SyncReport:
        with self._lock:
            report = self.mirror.push()
        self._report("pushed", report)
        return report

    def _report(self, kind: str, report: SyncReport) -> None:
        if self._on_sync is not None and (report.files_moved or report.files_deleted):
            self._on_sync(kind, report)

    def _every(self, interval_s: float, fn: Callable[[], object], name: str) -> None:
        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    fn()
                except Exception as exc:  # retried at the next tick; the mirror keeps every file
                    if self._on_error is not None:
                        self._on_error(exc)

        thread = threading.Thread(target=loop, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def close(self) -> SyncReport:
        """Stop the background threads, then push what is left (raises if the bucket refuses:
        the files stay in the mirror and go with the next command on it)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(30.0)
        return self.push()
