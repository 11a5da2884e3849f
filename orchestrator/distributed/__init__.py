"""The Celery executor: dispatch, completion, message sizing, the store cursor and worker checks."""

__all__ = [
    "campaign",
    "executor",
    "message_size",
    "options",
    "store_cursor",
    "worker_app",
    "worker_checks",
]
