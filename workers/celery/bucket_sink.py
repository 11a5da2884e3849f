"""A worker on a bucket store (``--data s3://…``): its spool and the files the spool publishes
stay on its own disk (``--spool-dir``) until the uploader has them in the bucket.

A run is acknowledged once its record is fsynced in the local spool, as on a shared disk; the
uploader then sends each published file to the bucket, announces it to the orchestrator
(``workers.state.published_objects``) and deletes the local copy. A worker restarted on the
same spool directory publishes and uploads what its predecessor left.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import redis
import structlog

from storage.objectstore.client import S3Client
from storage.objectstore.location import parse_store_url
from storage.objectstore.uploader import Uploader
from workers.state.published_objects import PublishedObjects

log = structlog.get_logger("irbench.worker")


def default_spool_dir(store_url: str) -> Path:
    """Where a worker keeps its spool for ``store_url`` when ``--spool-dir`` is not given: one
    folder per store under ``$XDG_STATE_HOME`` (``~/.local/state``), kept across restarts."""
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "irbench" / "spool" / hashlib.sha256(store_url.encode()).hexdigest()[:12]


class BucketSink:
    """The uploader of one worker process for the bucket store ``store_url``; ``root`` is the
    local directory its RunStore (and spool) use."""

    def __init__(self, store_url: str, spool_dir: str | None, client: redis.Redis, key_prefix: str) -> None:
        location = parse_store_url(store_url)
        self.root = Path(spool_dir) if spool_dir else default_spool_dir(store_url)
        self.root.mkdir(parents=True, exist_ok=True)
        log_ = PublishedObjects(client, store_url, key_prefix)
        self.uploader = Uploader(
            S3Client(location), location, self.root, on_uploaded=log_.announce,
            on_error=lambda exc: log.warning("bucket_upload_failed", store=store_url, error=str(exc),
                                             pending=len(self.uploader.pending())),
            on_recovered=lambda: log.info("bucket_upload_recovered", store=store_url),
        ).start()

    def close(self) -> None:
        self.uploader.close()
