"""The run engine: provider clients, limiter, retry, outcome classification, IR extraction, the
availability check (imports ``storage`` only, and no Celery or Redis), plus its Celery/Redis
adapter in ``workers.celery``.

The public surface is these modules; anything named ``_x`` is private to ``workers``.
"""

__all__ = [
    "availability",
    "celery",
    "clock",
    "errors",
    "execute",
    "gate",
    "ir_extract",
    "limits",
    "logs",
    "providers",
    "retry",
    "runtask",
]
