"""The Celery/Redis adapter of the run engine: app, tasks, worker runtime, campaign state, the
Redis gate and limiter (with its Lua), the availability beat task, the broker view and the one
Redis retry loop. Nothing outside this package in ``workers`` imports Celery or Redis."""

#: The Celery queue workers consume by default (``-Q``); importing it loads no Celery.
DEFAULT_QUEUE = "irbench"
#: A worker's threads (``-c``) by default: the broker messages it holds at once.
DEFAULT_THREADS = 8

__all__ = [
    "DEFAULT_QUEUE",
    "DEFAULT_THREADS",
    "app",
    "availability_tasks",
    "broker_view",
    "campaign_state",
    "claim_permit",
    "coalesce",
    "deferring",
    "gate",
    "limiter_waiters",
    "local_cooldowns",
    "message",
    "presence",
    "redis_limiter",
    "redis_retry",
    "runtime",
    "script_batch",
    "tasks",
    "transport",
]
