"""The Celery/Redis adapter of the run engine: the app and its tasks, the worker runtime, the
Redis limiter (Lua scripts in ``lua/``) and gate, campaign state, the availability beat task.
Nothing outside this package in ``workers`` imports it, or Celery, or Redis
(``tests/test_layering.py``)."""

#: The Celery queue workers consume by default (``-Q``); importing it loads no Celery.
DEFAULT_QUEUE = "irbench"

__all__ = [
    "DEFAULT_QUEUE",
    "app",
    "availability_tasks",
    "broker_view",
    "campaign_state",
    "gate",
    "redis_limiter",
    "redis_retry",
    "runtime",
    "tasks",
]
