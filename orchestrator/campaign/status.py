"""Planned vs stored runs of a campaign, per model and outcome."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.campaign.plan_state import LatestRuns, latest_runs
from orchestrator.campaign.prepared import PreparedCampaign
from storage.runs import RunStore


@dataclass(frozen=True)
class CampaignStatus:
    planned_by_model: Mapping[str, int]
    stored_by_model: Mapping[str, Mapping[str, int]]  # model -> outcome -> count
    skipped_files: tuple[Path, ...] = ()  # unreadable files left out (``skip_corrupt``)
    latest: LatestRuns | None = field(default=None, compare=False, repr=False)

    @property
    def planned(self) -> int:
        return sum(self.planned_by_model.values())

    @property
    def stored(self) -> int:
        return sum(sum(c.values()) for c in self.stored_by_model.values())


def campaign_status(prepared: PreparedCampaign, store: RunStore, *, skip_corrupt: bool = False) -> CampaignStatus:
    """Planned vs stored runs per model, by outcome (counts only runs of the current plan).

    An unreadable Parquet file is a ``StorageError`` naming it, unless ``skip_corrupt``: then
    the other files are counted and the skipped ones listed in ``skipped_files``. The latest
    execution of each stored run rides along (``latest``: what ``--retry-failed`` counts)."""
    plan = prepared.plan
    latest = latest_runs(plan, store, skip_corrupt=skip_corrupt)
    stored: dict[str, dict[str, int]] = {}
    pairs = Counter(zip(plan.model_positions(latest.indices).tolist(), latest.outcomes.tolist()))
    for (model, outcome), n in sorted(pairs.items()):
        stored.setdefault(plan.models[model], {})[outcome] = n
    return CampaignStatus(
        planned_by_model=plan.planned_by_model(),
        stored_by_model=stored,
        skipped_files=latest.skipped_files,
        latest=latest,
    )
