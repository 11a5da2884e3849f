"""What Redis already knows of a campaign when an orchestrator starts: runs queued or running (an
earlier orchestrator's messages, still out) and runs marked done that the store does not show.

Read from Redis's side (``workers.state.campaign_state.CampaignState.known`` without a list of
run ids to ask about), so the cost is what Redis holds, never the plan: the queued and running
runs, then the done log in chunks. The dispatcher checks each task of its window against these
sets as it builds it, so no run id of the plan is computed ahead of its window.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from workers.state.campaign_keys import as_text
from workers.state.campaign_state import CampaignState


@dataclass
class KnownRuns:
    """``busy``: run ids queued or running; ``done``: run ids with a done marker, not stored."""

    busy: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.busy) + len(self.done)

    def clear(self) -> None:
        """Redis forgot them (a restart): every run is sent as if never seen."""
        self.busy.clear()
        self.done.clear()


def known_runs(state: CampaignState, stored: Container[str], chunk: int = 5000) -> KnownRuns:
    """The queued and running runs, and the done-marked runs not in ``stored`` (run ids in the
    store), of ``state``'s campaign. Four commands for a fresh campaign."""
    client = state.client
    pipe = client.pipeline(transaction=False)
    pipe.zrange(state.key("queued"), 0, -1)
    pipe.hkeys(state.key("running"))
    pipe.llen(state.key("donelog"))
    queued, running, logged = pipe.execute()
    out = KnownRuns(busy={as_text(x) for x in [*queued, *running]})
    for start in range(0, int(logged), chunk):
        ids = {as_text(x) for x in client.lrange(state.key("donelog"), start, start + chunk - 1)}
        candidates = [r for r in ids if r not in stored and r not in out.done]
        if candidates:
            check = client.pipeline(transaction=False)
            for r in candidates:
                check.exists(state.key(f"done:{r}"))
            out.done |= {r for r, hit in zip(candidates, check.execute()) if hit}
    out.busy -= out.done
    return out
