"""The run engine and its Celery edge: provider clients, limiter, retry, outcome classification,
IR extraction, and the Celery app and tasks that run it on workers (imports ``storage`` only).

The public surface is these modules; anything named ``_x`` is private to ``workers``.
"""

__all__ = [
    "analysis_tasks",
    "availability_tasks",
    "campaign_state",
    "celery_app",
    "clock",
    "errors",
    "execute",
    "gate",
    "ir_extract",
    "limits",
    "logs",
    "providers",
    "redis_gate",
    "retry",
    "runtask",
    "tasks",
    "worker_runtime",
]
