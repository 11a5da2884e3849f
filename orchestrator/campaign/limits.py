"""Bounds a campaign must respect before anything is planned (cheap to import: the CLI uses
the defaults for its options)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.campaign.spec import CampaignSpec

DEFAULT_MAX_PLANNED_RUNS = 100_000_000  # 10x the 10M-run yardstick (a plan is axes, its state a bitmap); --max-planned-runs overrides


def check_plan_size(spec: CampaignSpec, prompts: int, max_planned_runs: int | None, source: str | None = None) -> int:
    """The number of runs ``spec`` plans over ``prompts`` prompts; ``ConfigError`` above the bound
    (``source``: the campaign file's name, for the message)."""
    budgets = len(spec.budgets) if spec.budgets else 1
    planned = prompts * len(spec.models) * budgets * spec.runs
    if max_planned_runs is not None and planned > max_planned_runs:
        raise ConfigError(
            f"{source or 'campaign ' + repr(spec.name)}: runs: {spec.runs} plans {planned:.3g} runs ({prompts} prompts x "
            f"{len(spec.models)} models x {budgets} budgets x {spec.runs} runs), above the limit of "
            f"{max_planned_runs}; lower `runs` (or the panel), or pass --max-planned-runs {planned} if you mean it"
        )
    return planned
