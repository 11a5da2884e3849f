"""The run engine (provider clients, limiter contract and in-memory limiter, retry, outcome
classification, IR extraction, the execution loop) and, in ``workers.celery``, its Celery/Redis
adapter (imports ``storage`` only; only ``workers.celery`` imports Celery or Redis).

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
]
