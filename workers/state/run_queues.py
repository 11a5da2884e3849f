"""Where a campaign's unclaimed runs wait: published to the broker (``P:queued``), or deferred
until a due time (``P:delayed``), both ZSETs on Redis's clock (``workers.state.campaign_state``
lists every key). Deferred runs are never parked as countdown messages inside a worker that
can die: the orchestrator moves due runs back to the broker (:meth:`DelayedRuns.pop_due`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

from workers.state import campaign_lua as lua
from workers.state.campaign_keys import CampaignKeys, as_text

#: run_ids per script call (bounded script arguments)
_CHUNK = 500


class QueuedRuns:
    """Runs published to the broker and not claimed yet: run_id -> dispatch time."""

    def __init__(self, keys: CampaignKeys) -> None:
        self._keys = keys
        self._refresh = keys.client.register_script(lua.REFRESH_QUEUED)

    def record(self, run_ids: Iterable[str]) -> None:
        """``run_ids`` are being published now (the orchestrator, before it publishes them)."""
        ids = list(run_ids)
        if ids:
            now = self._keys.now_s()
            self._keys.client.zadd(self._keys.key("queued"), {r: now for r in ids})

    def refresh(self, run_ids: Sequence[str]) -> None:
        """Runs delivered to a live worker, waiting there for a slot: still queued, not lost."""
        for i in range(0, len(run_ids), _CHUNK):
            self._refresh(keys=[self._keys.base], args=list(run_ids[i : i + _CHUNK]))

    def dispatched_at(self) -> dict[str, float]:
        """run_id -> dispatch time (Redis seconds) of every published, unclaimed run."""
        # withscores: (member, score) pairs, the scores cast by float
        scored = cast("list[tuple[bytes | str, float]]",
                      self._keys.client.zrange(self._keys.key("queued"), 0, -1, withscores=True))
        return {as_text(m): float(s) for m, s in scored}


class DelayedRuns:
    """Deferred runs (rate limit, cooldown, a task failure): run_id -> due time."""

    def __init__(self, keys: CampaignKeys) -> None:
        self._keys = keys
        self._pop_due = keys.client.register_script(lua.POP_DUE)

    def pop_due(self, limit: int, ahead_s: float = 0.0) -> dict[str, float]:
        """Move up to ``limit`` deferred runs due within ``ahead_s`` to ``queued``; returns
        run_id -> seconds until due (<= 0: overdue), to publish with that countdown."""
        res = self._pop_due(keys=[self._keys.base], args=[int(limit), max(ahead_s, 0.0)])
        return {as_text(res[i]): float(res[i + 1]) for i in range(0, len(res), 2)}

    def next_due_in_s(self) -> float | None:
        """Seconds until the earliest deferred run is due (<= 0: due now), None if none."""
        pipe = self._keys.client.pipeline(transaction=False)
        pipe.zrange(self._keys.key("delayed"), 0, 0, withscores=True)
        pipe.time()
        first, (sec, usec) = pipe.execute()
        if not first:
            return None
        return float(first[0][1]) - (float(sec) + float(usec) / 1e6)

    def count(self) -> int:
        """Deferred runs, due or not."""
        return int(self._keys.client.zcard(self._keys.key("delayed")))
