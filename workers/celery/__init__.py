"""The Celery/Redis adapter of the run engine: the app and its tasks, the worker runtime, the
Redis limiter (Lua scripts in ``lua/``), the Redis gate, campaign state and the availability beat.
Nothing outside ``workers.celery`` and the orchestrator's Celery side imports it."""

__all__ = ["app", "availability_tasks", "campaign_state", "gate", "redis_limiter", "runtime", "tasks"]
