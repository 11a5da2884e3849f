"""A plan's spend caps against its bounds: for each cap of a campaign (``max_cost_usd`` /
``max_total_tokens``, campaign-wide and per model, ``orchestrator.campaign.spend_cap``), what
the wave being planned has already spent, the range the still-to-run runs can add to it, and
how many of them fit under the cap.

The range is the preview's own: its lower end is the runs' prompt tokens alone, its upper end
adds every completion token ``max_tokens`` (or the budget) allows. A run's share is the mean
over the runs still to run, so "N runs fit" is about N: runs differ in prompt length and a
capped model's runs interleave with the others'. Retries are not in the bound (each attempt
counts against a cap when it runs), so a campaign that retries much stops earlier.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import BaseModel, computed_field

from orchestrator.campaign.spec import CampaignSpec
from orchestrator.campaign.spend_cap import spend_plan
from storage.runs import RunStore
from workers.spend import SpendCap, Spent

__all__ = ["CapCheck", "ScopeFigures", "cap_checks"]

CAMPAIGN_SCOPE_NAME = "campaign"  # how the campaign-wide scope is named in the preview


class CapCheck(BaseModel):
    """One cap (``limit`` ``max_cost_usd`` in US dollars, or ``max_total_tokens`` in tokens) of one
    ``scope`` (``"campaign"`` or a model id) against what its runs still to run can spend."""

    scope: str
    limit: str
    cap: float
    spent: float  # by the stored executions of the wave planned, retries included
    runs_to_run: int
    to_run_min: float | None  # prompt tokens alone; None: no prices for a cost cap
    to_run_max: float | None  # with every completion token allowed; None: no max_tokens (or no prices)
    runs_fit_min: int | None  # the runs that fit when each reaches the upper bound
    runs_fit_max: int | None  # the runs that fit when none produces a completion token

    @computed_field  # type: ignore[prop-decorator]
    @property
    def within_cap(self) -> bool:
        """True when every run still to run fits even at the upper bound."""
        return self.runs_fit_min is not None and self.runs_fit_min >= self.runs_to_run

    @computed_field  # type: ignore[prop-decorator]
    @property
    def verdict(self) -> str:
        """One phrase: within cap, or after about how many runs it is reached."""
        if self.to_run_min is None:
            return "no prices: `irbench run` refuses this cap until the models have input/output prices"
        if self.spent >= self.cap:
            return "already reached by what is stored: no run will be sent until it is raised"
        if self.runs_to_run == 0:
            return "within cap (nothing left to run)"
        if self.within_cap:
            assert self.to_run_max is not None
            return f"within cap (the upper bound reaches {(self.spent + self.to_run_max) / self.cap:.0%} of it)"
        least = "?" if self.runs_fit_min is None else f"{self.runs_fit_min:,}"
        most = self.runs_fit_max if self.runs_fit_max is not None else 0
        if most >= self.runs_to_run:
            return (f"cap reached after about {least} of the {self.runs_to_run:,} runs still to run if every "
                    "completion reaches max_tokens; within cap if completions stay short")
        return (f"cap reached after about {least} to {most:,} of the {self.runs_to_run:,} runs still to run "
                f"({least} if every completion reaches max_tokens, {most:,} if none has a token)")


@dataclass(frozen=True)
class ScopeFigures:
    """What the preview says of one scope's runs still to run (``orchestrator.campaign.preview``):
    their count, prompt tokens, completion-token upper bound (None: unbounded) and cost range in
    US dollars (None: no prices)."""

    runs: int
    prompt_tokens: int
    completion_tokens_max: int | None
    cost_usd_min: float | None
    cost_usd_max: float | None


def _fit(headroom: float, bound: float | None, runs: int) -> int | None:
    """How many of ``runs`` sharing ``bound`` evenly fit in ``headroom``."""
    if bound is None:
        return None
    if headroom <= 0:
        return 0
    if bound <= 0:
        return runs
    return min(runs, math.floor(headroom / (bound / runs)))


def _check(scope: str, limit: str, cap: float, spent: float, runs: int,
           low: float | None, high: float | None) -> CapCheck:
    return CapCheck(scope=scope, limit=limit, cap=cap, spent=spent, runs_to_run=runs, to_run_min=low,
                    to_run_max=high, runs_fit_min=_fit(cap - spent, high, runs) if low is not None else None,
                    runs_fit_max=_fit(cap - spent, low, runs))


def _scope_checks(scope: str, cap: SpendCap, spent: Spent, figures: ScopeFigures) -> list[CapCheck]:
    name = scope or CAMPAIGN_SCOPE_NAME
    out = []
    if cap.max_cost_usd is not None:
        out.append(_check(name, "max_cost_usd", cap.max_cost_usd, spent.cost_usd, figures.runs,
                          figures.cost_usd_min, figures.cost_usd_max if figures.cost_usd_min is not None else None))
    if cap.max_total_tokens is not None:
        high = figures.prompt_tokens + figures.completion_tokens_max if figures.completion_tokens_max is not None else None
        out.append(_check(name, "max_total_tokens", cap.max_total_tokens, spent.tokens, figures.runs,
                          figures.prompt_tokens, high))
    return out


def cap_checks(spec: CampaignSpec, store: RunStore, wave: int, figures: Mapping[str, ScopeFigures]) -> list[CapCheck]:
    """A check per cap of ``spec``, against what ``wave`` has spent in ``store`` (read only when
    something is capped) and ``figures``: scope (``workers.spend.CAMPAIGN_SCOPE`` or a model id) -> its runs."""
    plan = spend_plan(spec, wave, store)
    checks: list[CapCheck] = []
    for scope, cap in plan.caps.items():
        if scope in figures:
            checks.extend(_scope_checks(scope, cap, plan.spent.get(scope, Spent()), figures[scope]))
    return checks
