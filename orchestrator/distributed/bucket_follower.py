"""The orchestrator's view of a bucket store while workers upload to it: before each look at
the store, fetch the files the workers announced since the last one (no bucket listing)."""

from __future__ import annotations

from storage.objectstore.session import BucketSession
from workers.state.published_objects import PublishedObjects


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
        paths, self._offset = self.objects.since(self._offset)
        if paths:
            self.files_fetched += self.session.mirror.pull_keys(paths).files_moved
