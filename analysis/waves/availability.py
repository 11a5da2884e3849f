"""What the ``availability/`` dataset says of each model around two waves of a campaign.

A model's status in a wave is the latest availability row (a scheduled check, an imported audit
or a 410 met during a campaign) checked before the wave after it started: rows of wave A's window
``[start A, start B)``, and of wave B's window ``[start B, end)`` (``end``: None = open). A status
carried over from before a wave counts for it when its window holds none, since a model retired
before wave A is still retired during it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pyarrow as pa

__all__ = ["AvailabilityChange", "availability_changes"]


@dataclass(frozen=True)
class AvailabilityChange:
    """One model's availability status in each wave (None: no row up to the wave's end);
    ``changed`` is None unless both are known; ``retired_on`` from the latest 410 body."""

    model: str
    from_status: str | None
    to_status: str | None
    changed: bool | None
    retired_on: str | None

    def to_json(self) -> dict[str, object]:
        return {"from": self.from_status, "to": self.to_status, "changed": self.changed,
                "retired_on": self.retired_on}


def _status_before(rows: list[dict], end: dt.datetime | None) -> dict | None:
    last = None
    for row in rows:  # sorted by checked_at
        if end is None or row["checked_at"] < end:
            last = row
    return last


def availability_changes(table: pa.Table, models: list[str], to_started_at: dt.datetime | None,
                         to_ends_at: dt.datetime | None = None) -> dict[str, AvailabilityChange]:
    """Per model of ``models``, its status in the earlier wave (rows before ``to_started_at``) and
    in the later one (rows before ``to_ends_at``). ``table``: availability rows with ``model``,
    ``checked_at``, ``status`` and ``retired_on``."""
    by_model: dict[str, list[dict]] = {m: [] for m in models}
    if table.num_rows:
        for row in table.sort_by([("checked_at", "ascending")]).to_pylist():
            if row["model"] in by_model:
                by_model[row["model"]].append(row)
    out = {}
    for model, rows in by_model.items():
        before = _status_before(rows, to_started_at) if to_started_at is not None else None
        after = _status_before(rows, to_ends_at)
        a = None if before is None else str(before["status"])
        b = None if after is None else str(after["status"])
        retired = [r["retired_on"] for r in rows if r["status"] == "retired" and r["retired_on"]]
        out[model] = AvailabilityChange(model, a, b, None if a is None or b is None else a != b,
                                        retired[-1] if retired else None)
    return out
