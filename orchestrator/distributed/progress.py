"""Per-model progress of a distributed campaign, from its Redis counters (O(models) a look)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.distributed.context import CampaignContext
from orchestrator.local.executor import ModelProgress
from workers.state.done_runs import META_FIELDS


@dataclass
class CeleryModelProgress(ModelProgress):
    """``ModelProgress`` plus the completion rate (runs per second, smoothed)."""

    rate_per_s: float = 0.0


CeleryProgressCallback = Callable[[str, ModelProgress], None]


def progress_from_counts(
    planned: dict[str, int], counts: dict[str, dict[str, int]], running: dict[str, int],
    prev: dict[str, CeleryModelProgress], dt_s: float,
) -> dict[str, CeleryModelProgress]:
    """Per-model progress from the campaign's counters (``DoneRuns.counts``)."""
    out = {}
    for model, total in planned.items():
        c = counts.get(model, {})
        done = sum(v for k, v in c.items() if k not in META_FIELDS)
        old = prev.get(model)
        inst = (done - old.done) / dt_s if old is not None and dt_s > 0 else 0.0
        rate = inst if old is None else 0.7 * old.rate_per_s + 0.3 * inst
        out[model] = CeleryModelProgress(
            total=total, done=done, in_flight=running.get(model, 0),
            failed=max(c.get("_failed", 0) - c.get("cancelled", 0), 0), cancelled=c.get("cancelled", 0),
            outcomes=Counter({k: v for k, v in c.items() if k not in META_FIELDS}), rate_per_s=rate,
        )
    return out


class ProgressView:
    """The campaign's per-model progress (``progress``), refreshed by :meth:`show` and handed to
    ``on_progress``; ``planned``: model -> planned runs."""

    def __init__(self, ctx: CampaignContext, planned: dict[str, int],
                 on_progress: CeleryProgressCallback | None = None) -> None:
        self._ctx = ctx
        self._planned = planned
        self._on_progress = on_progress
        self._shown_at = 0.0
        self.progress: dict[str, CeleryModelProgress] = {}

    def show(self) -> None:
        """Per-model progress from the Redis counters, to ``on_progress``."""
        ctx = self._ctx
        now = ctx.clock()
        counts = ctx.call(ctx.state.done.counts, "reading counters")
        running = ctx.call(ctx.state.claims.running_by_model, "reading in-flight runs")
        self.progress = progress_from_counts(self._planned, counts, running, self.progress, now - self._shown_at)
        self._shown_at = now
        if self._on_progress:
            for m, p in self.progress.items():
                self._on_progress(m, p)
