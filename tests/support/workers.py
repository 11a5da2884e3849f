"""``deploy.celery_workers.CeleryWorkers`` with its workers forked from the suite's zygote
(``tests.support.forked``): the same ``celery worker`` processes, process groups and logs,
without Celery's imports at each start. Tests that measure a worker's memory use the deploy
class itself: a forked worker's resident set counts the zygote's pages too."""

from __future__ import annotations

from typing import Any

from deploy import celery_workers
from deploy.celery_workers import WorkerCommand
from tests.support import forked

__all__ = ["CeleryWorkers", "WorkerCommand"]


class CeleryWorkers(celery_workers.CeleryWorkers):
    def __init__(self, broker_url: str, **kwargs: Any) -> None:
        super().__init__(broker_url, spawn=forked.popen, **kwargs)
