"""Planned vs stored runs of a campaign, per model and outcome."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator.campaign.prepared import PreparedCampaign
from storage.parquet.unreadable import RowSelection, read_checked
from storage.runs import RunStore


@dataclass(frozen=True)
class CampaignStatus:
    planned_by_model: Mapping[str, int]
    stored_by_model: Mapping[str, Mapping[str, int]]  # model -> outcome -> count
    skipped_files: tuple[Path, ...] = ()  # unreadable files left out (``skip_corrupt``)

    @property
    def planned(self) -> int:
        return sum(self.planned_by_model.values())

    @property
    def stored(self) -> int:
        return sum(sum(c.values()) for c in self.stored_by_model.values())


def campaign_status(prepared: PreparedCampaign, store: RunStore, *, skip_corrupt: bool = False) -> CampaignStatus:
    """Planned vs stored runs per model, by outcome (counts only runs of the current plan).

    An unreadable Parquet file is a ``StorageError`` naming it, unless ``skip_corrupt``: then
    the other files are counted and the skipped ones listed in ``skipped_files``."""
    planned_ids = {t.run_id for t in prepared.tasks}
    table, skipped = read_checked(store.dataset, skip=skip_corrupt, selection=RowSelection(
        filters={"campaign": [prepared.spec.name]}, columns=["run_id", "model", "outcome"],
    ))
    stored: dict[str, Counter[str]] = {}
    for run_id, model, outcome in zip(
        table.column("run_id").to_pylist(), table.column("model").to_pylist(), table.column("outcome").to_pylist()
    ):
        if run_id in planned_ids:
            stored.setdefault(model, Counter())[outcome] += 1
    return CampaignStatus(
        planned_by_model=dict(Counter(t.model for t in prepared.tasks)),
        stored_by_model={m: dict(c) for m, c in stored.items()},
        skipped_files=tuple(skipped),
    )
