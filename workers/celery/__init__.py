"""The Celery adapter of the run engine: app, tasks, worker runtime, transport and the availability
beat task. The Redis state they share with the orchestrator lives in ``workers.state``."""

#: The Celery queue workers consume by default (``-Q``); importing it loads no Celery.
DEFAULT_QUEUE = "irbench"
#: A worker's threads (``-c``) by default: the broker messages it holds at once.
DEFAULT_THREADS = 8

__all__ = [
    "DEFAULT_QUEUE",
    "DEFAULT_THREADS",
    "app",
    "availability_tasks",
    "bucket_sink",
    "coalesce",
    "deferring",
    "local_cooldowns",
    "memory_budget",
    "message",
    "runtime",
    "tasks",
    "transport",
]
