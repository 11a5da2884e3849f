"""A worker's bucket publisher: the files its spool publishes locally go to the bucket, once.

A worker on a bucket store keeps its spool and the Parquet files the spool publishes on its
own disk (``--spool-dir``); :class:`Uploader` sends each published file to the bucket under the
same path (``If-None-Match: *``: a file already there is left alone — its stem is the spool
segment's, so it is the same rows), tells ``on_uploaded`` (the worker announces it to the
orchestrator), then deletes the local copy. A worker SIGKILLed mid-upload still has the file
and uploads it at its next start; one killed after the upload but before the deletion finds
the object present and only deletes. No rename is needed: a PUT is atomic.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from storage.objectstore.client import ObjectClient, ObjectStoreUnavailable
from storage.objectstore.location import S3Location
from storage.objectstore.mirror import MARKER_NAME, synced


class Uploader:
    """Uploads the visible files under ``root`` (the worker's local store) to ``location``.

    ``interval_s``: seconds between looks while idle; ``on_uploaded(relatives)``: called with the
    paths uploaded in one pass (before their local copies go); ``on_error(exc)``: a pass that
    failed (the files stay and are tried again; ``ObjectStoreUnavailable`` means the store did
    not answer); ``on_recovered()``: the first pass that worked after a failed one.
    """

    def __init__(self, client: ObjectClient, location: S3Location, root: Path, *, interval_s: float = 0.5,
                 on_uploaded: Callable[[Sequence[str]], None] | None = None,
                 on_error: Callable[[Exception], None] | None = None,
                 on_recovered: Callable[[], None] | None = None) -> None:
        self.client = client
        self.location = location
        self.root = Path(root)
        self.interval_s = interval_s
        self._on_uploaded = on_uploaded
        self._on_error = on_error
        self._on_recovered = on_recovered
        self._failing = False
        self._pass_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.files_uploaded = 0
        self.files_present = 0  # found in the bucket already (a re-upload after a crash)

    def pending(self) -> list[str]:
        """Local files still to upload (paths under ``root``), oldest name first."""
        out = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "_"))]
            rel_dir = os.path.relpath(dirpath, self.root)
            for name in filenames:
                rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
                if synced(rel) and rel != MARKER_NAME:
                    out.append(rel)
        return sorted(out)

    def upload_pending(self) -> list[str]:
        """One pass: upload every pending file; returns the paths it moved (raises the
        client's error, with the files left in place, when a request fails)."""
        with self._pass_lock:
            moved = []
            for rel in self.pending():
                path = self.root / rel
                try:
                    etag = self.client.upload(path, self.location.key(rel), if_absent=True)
                except FileNotFoundError:  # another worker on this spool directory took it
                    continue
                if etag is None:
                    self.files_present += 1
                else:
                    self.files_uploaded += 1
                moved.append(rel)
            if moved and self._on_uploaded is not None:
                self._on_uploaded(moved)
            for rel in moved:
                (self.root / rel).unlink(missing_ok=True)
            return moved

    # ----- background ---------------------------------------------------------------------------
    def start(self) -> Uploader:
        self._thread = threading.Thread(target=self._loop, name="irbench-uploader", daemon=True)
        self._thread.start()
        return self

    def wake(self) -> None:
        """Look now (a file was just published)."""
        self._wake.set()

    def _loop(self) -> None:
        backoff_s = self.interval_s
        while not self._stop.is_set():
            self._wake.wait(backoff_s)
            self._wake.clear()
            if self._pass():
                backoff_s = self.interval_s
            else:
                backoff_s = min(backoff_s * 2, 10.0)

    def _pass(self) -> bool:
        try:
            self.upload_pending()
        except Exception as exc:  # every failure is retried; the files stay durable on disk
            if self._on_error is not None and not (self._failing and isinstance(exc, ObjectStoreUnavailable)):
                self._on_error(exc)
            self._failing = True
            return False
        if self._failing and self._on_recovered is not None:
            self._on_recovered()
        self._failing = False
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the thread after one last pass (bounded by ``timeout_s``); what it could not
        upload stays on disk for the next start."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._pass()
