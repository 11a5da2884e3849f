"""Completion rate and ETA per model from the store, for ``irbench status --broker``.

The rate is measured, not smoothed guesswork: executions of the campaign that *finished* in the
last ``window_s`` seconds (``finished_at``, stamped by whichever worker ran them), divided by the
time from the first of them to now. That works from any machine that sees the dataset, for
campaigns driven by any orchestrator, and survives orchestrator restarts.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from rich.table import Table

from storage.runs import RunStore

DEFAULT_WINDOW_S = 120.0


@dataclass(frozen=True)
class ModelRate:
    """``runs_per_s`` over ``window_s`` seconds; ``eta_s`` for ``remaining`` runs (None: no rate)."""

    model: str
    finished_in_window: int
    window_s: float
    runs_per_s: float
    remaining: int

    @property
    def eta_s(self) -> float | None:
        if self.remaining == 0:
            return 0.0
        return self.remaining / self.runs_per_s if self.runs_per_s > 0 else None


def model_rates(
    store: RunStore,
    campaign: str,
    remaining_by_model: Mapping[str, int],
    *,
    now: dt.datetime | None = None,
    window_s: float = DEFAULT_WINDOW_S,
) -> list[ModelRate]:
    """One :class:`ModelRate` per model of ``remaining_by_model`` (sorted by model)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    since = now - dt.timedelta(seconds=window_s)
    table = store.read_executions(campaigns=[campaign], columns=["model", "finished_at"])
    finished = table.column("finished_at")
    recent = table.filter(pc.and_(pc.is_valid(finished), pc.greater_equal(finished, pa.scalar(since, finished.type))))
    out = []
    for model in sorted(remaining_by_model):
        rows = recent.filter(pc.equal(recent.column("model"), model))
        n = rows.num_rows
        span_s = 0.0
        if n:
            first = pc.min(rows.column("finished_at")).as_py()
            span_s = max((now - first).total_seconds(), 1.0)
        out.append(ModelRate(model, n, window_s, n / span_s if n else 0.0, int(remaining_by_model[model])))
    return out


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "– (nothing finished lately)"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


def rates_table(rates: list[ModelRate], in_flight: Mapping[str, int]) -> Table:
    t = Table(title=f"live: runs finished in the last {rates[0].window_s:g} s, and ETA" if rates else "live")
    for col in ("model", "in flight", "finished", "runs/s", "remaining", "ETA"):
        t.add_column(col, justify="left" if col == "model" else "right")
    for r in rates:
        t.add_row(r.model, str(in_flight.get(r.model, 0)), str(r.finished_in_window), f"{r.runs_per_s:.2f}",
                  str(r.remaining), _eta(r.eta_s))
    return t
