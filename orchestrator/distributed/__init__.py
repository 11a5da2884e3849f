"""The Celery executor: the plan by index, dispatch, completion, reconcile, progress, publishing and message sizing,
the store cursor and the per-run tally, worker checks."""

__all__ = [
    "bucket_follower",
    "campaign",
    "completion",
    "context",
    "dispatcher",
    "executed_tally",
    "executor",
    "known_runs",
    "message_size",
    "options",
    "plan_view",
    "progress",
    "publisher",
    "reconciler",
    "store_cursor",
    "worker_app",
    "worker_checks",
]
