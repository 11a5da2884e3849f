"""What every collaborator of one distributed campaign shares: its Redis state, its plan (by
index, ``plan_view.PlanView``), its options, the clock, and Redis calls retried until the
campaign's deadline."""

from __future__ import annotations

from collections.abc import Callable
import uuid
from dataclasses import dataclass, field
from typing import TypeVar

from orchestrator.distributed.options import AUTO_WINDOW_RUNS, CeleryOptions
from orchestrator.distributed.plan_view import PlanView
from workers.state.campaign_state import CampaignState
from workers.state.redis_retry import with_retry

T = TypeVar("T")


@dataclass
class CampaignContext:
    """``state``: the campaign's Redis state; ``plan``: the planned runs by index and those out;
    ``clock``/``sleep``: monotonic seconds and the sleep on them; ``deadline``: the clock
    reading past which Redis calls stop retrying (None: retry forever), set when a run starts;
    ``window_runs``: the outstanding window (``options.window_runs`` of the options and the plan)."""

    campaign: str
    state: CampaignState
    plan: PlanView
    options: CeleryOptions
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    deadline: float | None = None
    window_runs: int = AUTO_WINDOW_RUNS  # runs queued or executing at most (options.window_runs)
    # rides in every message this run sends and counts its executions apart from another orchestrator's
    dispatch: str = field(default_factory=lambda: uuid.uuid4().hex[:16])

    def call(self, fn: Callable[[], T], what: str) -> T:
        """``fn()``, retried with backoff on a transient Redis error until the deadline;
        ``what`` names the step in the retry's log lines and its final error."""
        budget = None if self.deadline is None else max(0.0, self.deadline - self.clock())
        return with_retry(fn, what, budget_s=budget, max_backoff_s=self.options.redis_backoff_max_s,
                          sleep=self.sleep, clock=self.clock)
