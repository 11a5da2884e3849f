"""The Celery executor: dispatch, completion, reconcile, progress, publishing and message sizing, the store cursor, worker checks."""

__all__ = [
    "bucket_follower",
    "campaign",
    "completion",
    "context",
    "dispatcher",
    "executor",
    "message_size",
    "options",
    "progress",
    "publisher",
    "reconciler",
    "store_cursor",
    "worker_app",
    "worker_checks",
]
