"""The permit registry ``DeferringLimiter`` reports to, for tests that build one without a
worker runtime: what the runtime's heartbeat would renew (``held``) and the process's noted
429 cooldowns (``WorkerRuntime.cooldowns``)."""

from __future__ import annotations

from workers.celery.local_cooldowns import LocalCooldowns
from workers.celery.runtime import WorkerSettings
from workers.limits.base import Permit


class PermitHolds:
    """``settings``: the worker settings the limiter reads (waits, allowance, retries)."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.held: set[str] = set()
        self.cooldowns = LocalCooldowns()

    def hold_permit(self, p: Permit) -> None:
        self.held.add(p.holder)

    def drop_permit(self, p: Permit) -> None:
        self.held.discard(p.holder)
