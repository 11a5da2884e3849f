"""The run engine (provider clients, limiter contract and in-memory limiter, retry, outcome
classification, IR extraction, the execution loop); ``workers.state``, the Redis state workers and
the orchestrator share; and ``workers.celery``, the Celery adapter (imports ``storage`` only; only
``workers.state`` and ``workers.celery`` import Redis, only ``workers.celery`` imports Celery).

The public surface is these modules; anything named ``_x`` is private to ``workers``.
"""

__all__ = [
    "availability",
    "celery",
    "clock",
    "cpu_policy",
    "errors",
    "execute",
    "gate",
    "gc_policy",
    "ir_extract",
    "ir_validate",
    "limits",
    "logs",
    "loops",
    "providers",
    "retry",
    "runtask",
    "secrets",
    "spend",
    "state",
]
