"""What Redis already knows of a campaign when an orchestrator starts: the runs queued or running
(an earlier orchestrator's messages, still out), which the dispatch window does not send again.

Read from Redis's side, so the cost is the outstanding window, never the plan nor the done log:
two commands. The dispatcher checks each task of its window against this set as it builds it, so
no run id of the plan is computed ahead of its window. A run done per Redis but not stored is
sent again: its claim finds it done and announces it (``CLAIM`` re-logs it), and completion
verifies it against the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workers.state.campaign_keys import as_text
from workers.state.campaign_state import CampaignState


@dataclass
class KnownRuns:
    """``busy``: run ids queued or running when the orchestrator started."""

    busy: set[str] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.busy)

    def clear(self) -> None:
        """Redis forgot them (a restart): every run is sent as if never seen."""
        self.busy.clear()


def known_runs(state: CampaignState) -> KnownRuns:
    """The queued and running runs of ``state``'s campaign."""
    pipe = state.client.pipeline(transaction=False)
    pipe.zrange(state.key("queued"), 0, -1)
    pipe.hkeys(state.key("running"))
    queued, running = pipe.execute()
    return KnownRuns(busy={as_text(x) for x in [*queued, *running]})
