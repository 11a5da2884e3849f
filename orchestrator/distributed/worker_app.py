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
from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery

from orchestrator.jobs.analysis_tasks import register_analysis_tasks
from orchestrator.jobs.wave_schedule import register_wave_schedule
from workers.errors import ConfigError
from workers.celery.app import make_celery_app, start_worker
from workers.celery.runtime import WorkerSettings

def registrars(environ: Mapping[str, str] | None = None) -> tuple[Callable[[Any], None], ...]:
    """The orchestrator's tasks: analysis jobs, and the wave-schedule tick every
    ``IRBENCH_SCHEDULE_TICK_S`` seconds (default 60) in the beat schedule."""
    env = os.environ if environ is None else environ
    try:
        tick_s = float(env.get("IRBENCH_SCHEDULE_TICK_S") or 60.0)
    except ValueError:
        raise ConfigError(f"IRBENCH_SCHEDULE_TICK_S={env['IRBENCH_SCHEDULE_TICK_S']!r} is not seconds") from None
    if tick_s <= 0:
        raise ConfigError(f"IRBENCH_SCHEDULE_TICK_S must be > 0 s, got {tick_s:g}")
    return (register_analysis_tasks, functools.partial(register_wave_schedule, tick_s=tick_s))


def make_worker_app(broker_url: str, *, environ: Mapping[str, str] | None = None, **kwargs: Any) -> Celery:
    """``make_celery_app`` with every irbench task (runs, availability, analysis jobs, wave schedule)."""
    return make_celery_app(broker_url, environ=environ, registrars=registrars(environ), **kwargs)


def run_worker(broker_url: str, *, settings: WorkerSettings | None = None, **kwargs: Any) -> None:
    """``irbench worker``: a worker process with every irbench task; blocks until stopped."""
    start_worker(broker_url, settings=settings, registrars=registrars(), **kwargs)


@functools.lru_cache(maxsize=1)
def _module_app() -> Celery:
    return make_worker_app(os.environ.get("IRBENCH_BROKER_URL", "redis://127.0.0.1:6379/0"))


def __getattr__(name: str) -> Any:
    if name == "app":
        return _module_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
