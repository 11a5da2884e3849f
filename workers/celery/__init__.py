"""The Celery/Redis adapter of the run engine: app, tasks, worker runtime, campaign state, the
Redis gate and limiter (with its Lua), the availability beat task. Nothing outside this package
in ``workers`` imports Celery or Redis."""

#: The Celery queue workers consume by default (``-Q``); importing it loads no Celery.
DEFAULT_QUEUE = "irbench"
