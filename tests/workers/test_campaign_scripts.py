"""The campaign state's Lua sources and key names are what stored campaigns and running workers
know: a worker calls a script by its SHA, and every key is spelled in the scripts too."""

from __future__ import annotations

import hashlib

import redis

from workers.state import campaign_lua as lua
from workers.state.campaign_state import CampaignState

# sha1 of each source: a changed script is a different script to a live server
PINNED = {
    "CLAIM": "7da27655b636108618be644e11d55ed4ec44a9c2",
    "RENEW": "f32f7327f18943a74868e08eb20c44e745cb7166",
    "REFRESH_QUEUED": "50ac195187ef2ded114e0ed57e83e294de53b3b2",
    "DEFER": "3ef7945c791f9cf5b9ebcb9ca144aa10bcec646e",
    "DONE": "4c61649a2ccc8222b85ca77e2f894e0e64d8b006",  # counts a newly done run for its dispatch token
    "REOPEN": "1ee89026e3f43662d76f23f0ab7918a9df269b00",
    "POP_DUE": "edb7858ead181540b50bd8a7c2e330b2d0ad96d5",
    "LOST": "360eb1cae7e4158683e8bf778e7eb46ac5fb6f73",
}


def test_the_scripts_are_the_pinned_sources() -> None:
    assert {name: hashlib.sha1(getattr(lua, name).encode()).hexdigest() for name in PINNED} == PINNED


def test_every_part_of_the_state_registers_the_same_scripts() -> None:
    client = redis.Redis()  # no connection: registering a script only hashes its source
    st = CampaignState(client, "c")
    shas = {s.sha for part in (st.claims, st.queued, st.delayed, st.done) for s in vars(part).values()
            if isinstance(s, redis.commands.core.Script)}
    assert shas == set(PINNED.values())
    assert {s.sha for s in CampaignState.finish_scripts(client)} == {PINNED["DONE"], PINNED["DEFER"]}


def test_the_keys_are_under_the_campaigns_hash_tag() -> None:
    st = CampaignState(redis.Redis(), "c", prefix="irbench:camp")
    assert st.base == "irbench:camp:{c}"
    assert [st.key(n) for n in ("donelog", "queued", "gate")] == [
        "irbench:camp:{c}:donelog", "irbench:camp:{c}:queued", "irbench:camp:{c}:gate"]
