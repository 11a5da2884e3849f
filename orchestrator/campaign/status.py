"""Planned vs stored runs of a campaign, per model and outcome."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from orchestrator.campaign.plan import LOCATE_COLUMNS
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
    plan = prepared.plan
    table, skipped = read_checked(store.dataset, skip=skip_corrupt, selection=RowSelection(
        filters={"campaign": [prepared.spec.name]}, columns=[*LOCATE_COLUMNS, "outcome"],
    ))
    table = table.filter(pa.array(plan.locate(table) >= 0)).select(["model", "outcome"])
    stored: dict[str, Counter[str]] = {}
    for row in table.group_by(["model", "outcome"]).aggregate([([], "count_all")]).to_pylist():
        stored.setdefault(row["model"], Counter())[row["outcome"]] = row["count_all"]
    return CampaignStatus(
        planned_by_model=plan.planned_by_model(),
        stored_by_model={m: dict(c) for m, c in stored.items()},
        skipped_files=tuple(skipped),
    )
