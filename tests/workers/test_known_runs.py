"""``CampaignState.known``: read from Redis's side, the same answer as asking Redis about every id."""

from __future__ import annotations

import redis

from workers.state.campaign_state import CampaignState


def known_by_asking(state: CampaignState, run_ids: list[str]) -> set[str]:
    """The definition: each id queued, running, delayed or with a done marker."""
    c = state.client
    return {r for r in run_ids if c.zscore(state.key("queued"), r) is not None or c.hexists(state.key("running"), r)
            or c.zscore(state.key("delayed"), r) is not None or c.exists(state.key(f"done:{r}"))}


def test_known_is_what_redis_holds_of_the_ids_asked(redis_client: redis.Redis) -> None:
    state = CampaignState(redis_client, "known-runs")
    ids = [f"run-{i:03d}" for i in range(40)]
    assert state.known(ids) == set() and state.known(iter(ids)) == set()
    state.queued.record(ids[0:4] + ["other-q"])
    assert state.claims.claim(ids[4], "m", "owner-1", 60.0) == "ok"  # running
    assert state.claims.claim(ids[5], "m", "owner-1", 60.0) == "ok"
    state.claims.defer(ids[5], "owner-1", 30.0)  # delayed
    for r in ids[10:30] + ["other-d"]:
        state.done.mark(r, "m", "ok", False)
    state.done.undo(ids[12:15])  # markers gone, still in the done log
    state.done.reopen({ids[20]: "m"})
    want = known_by_asking(state, ids)
    assert want == set(ids[0:6] + ids[10:12] + ids[15:20] + ids[21:30])
    for chunk in (1, 3, 5000):
        assert state.known(ids, chunk=chunk) == want
        assert state.known({r: None for r in ids}, chunk=chunk) == want  # a mapping of pending runs
        assert state.known(set(ids[:3]), chunk=chunk) == set(ids[:3])
