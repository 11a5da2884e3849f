"""The orchestrator's view of a bucket store while workers upload to it: before each look at
the store, fetch the files the workers announced since the last one (no bucket listing)."""

from __future__ import annotations

import structlog

from storage.errors import StorageError
from storage.objectstore.session import BucketSession
from workers.state.published_objects import PublishedObjects


log = structlog.get_logger("irbench.celery")


class BucketFollower:
    """Keeps ``session``'s mirror up with the upload log ``objects``. Start it before any worker
    can upload for this command: it reads the log's length, then pulls the whole bucket once
    (what was uploaded before), then follows the log from that length."""

    def __init__(self, session: BucketSession, objects: PublishedObjects) -> None:
        self.session = session
        self.objects = objects
        self._offset = objects.length()
        session.pull()
        self.files_fetched = 0

    def __call__(self) -> None:
        paths, offset = self.objects.since(self._offset)
        if not paths:
            return
        try:
            self.files_fetched += self.session.mirror.pull_keys(paths).files_moved
        except StorageError as exc:  # the object store is down or restarting: the next look tries again
            log.warning("bucket_fetch_failed", store=self.session.url, files=len(paths), error=str(exc))
            return
        self._offset = offset
