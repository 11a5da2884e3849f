"""The irbench worker app: ``workers.celery.app`` plus the analysis-job tasks.

The analysis tasks import ``analysis`` and so live in ``orchestrator`` (``workers`` may import
only ``storage``); this module composes both. It is the edge of the ``celery -A`` command line::

    celery -A orchestrator.distributed.worker_app worker -P threads -c 16 -Q irbench
    celery -A orchestrator.distributed.worker_app beat

``app`` is built on first access from ``IRBENCH_BROKER_URL`` (nothing is built or connects at
import): Celery registers tasks as *shared* by default, so an app built at import would hand
its task callables (and its runtime: broker, data dir) to every later app of the process.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from celery import Celery

from orchestrator.jobs.analysis_tasks import register_analysis_tasks
from workers.celery.app import make_celery_app, start_worker
from workers.celery.runtime import WorkerSettings

REGISTRARS = (register_analysis_tasks,)


def make_worker_app(broker_url: str, *, environ: Mapping[str, str] | None = None, **kwargs: Any) -> Celery:
    """``make_celery_app`` with every irbench task (runs, availability, analysis jobs)."""
    return make_celery_app(broker_url, environ=environ, registrars=REGISTRARS, **kwargs)


def run_worker(broker_url: str, *, settings: WorkerSettings | None = None, **kwargs: Any) -> None:
    """``irbench worker``: a worker process with every irbench task; blocks until stopped."""
    start_worker(broker_url, settings=settings, registrars=REGISTRARS, **kwargs)


@functools.lru_cache(maxsize=1)
def _module_app() -> Celery:
    return make_worker_app(os.environ.get("IRBENCH_BROKER_URL", "redis://127.0.0.1:6379/0"))


def __getattr__(name: str) -> Any:
    if name == "app":
        return _module_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
