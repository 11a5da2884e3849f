"""A run's claim and its first permit in one Redis call; its last permit's release with its done marker.

Every Redis round trip costs a worker ~0.1–0.5 ms of CPU (redis-py's command packing and reply
parsing, more on the async client), and on two shared cores CPU per run is the throughput. A
run with one call per step would make six: claim, acquire, the gate re-check after the grant,
release, done marker, plus the broker's. Here:

* :meth:`ClaimPermits.claim` runs one script that is the claim script (``CampaignState``'s,
  reading the model's gate) followed, only when the run is claimed and its model's gate is open,
  by the limiter's reserving ``acquire.lua`` decision. The grant happens in the same atomic step
  as the gate read, so the separate re-check after the grant (``DeferringLimiter._admit``: a
  410 or a cooldown that landed while the run waited) has nothing to add: nothing waited. A
  denial changes nothing for the run: ``execute_run``'s acquire meets the same limiter state
  (and the holder's reservation, if one was made) and waits or defers as before.
* :meth:`ClaimPermits.done_and_release` sends the done marker and the release of the run's last
  permit in one call. A worker's runs go through :meth:`ClaimPermits.arun_calls` instead: the
  claims and finishes of a whole batch as one ``EVALSHA`` (``workers.state.script_batch``) on
  the loop's async client; with one command per batch, the async client's higher cost per
  command does not matter. The lease is thus held until the record is durable (a few ms of fsync longer than the
  call itself): never more calls in flight than the cap, only a slightly later free slot.

Models with a request or token limit skip the combined acquire: their first permit comes the
usual way, with the gate and cooldown re-check right before the send (a 429 cooldown another run
starts between the claim and the send must still be seen; the task thread also does not know
``execute_run``'s token estimate). The combined path is for models with a concurrency cap only.

The scripts touch campaign keys and limiter keys together (different hash tags), so they need a
single Redis, not a cluster — as does kombu's Redis transport the workers consume from.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.exceptions import NoScriptError

from workers.state.campaign_keys import Call
from workers.state.campaign_state import CampaignState
from workers.state.run_claims import CLAIM_LUA, CLAIMED, GateView, claim_args, parse_claim
from workers.state.redis_limiter import RedisLimiter, script_source
from workers.state.script_batch import ScriptBatch
from workers.errors import ModelDisabled
from workers.limits.base import Permit
from workers.limits.base import Lease
from workers.runtask import RunTask

# KEYS: campaign base, then the limiter's lease, state, log and reservation keys.
# ARGV: n = how many claim arguments follow, the claim's ARGV, then acquire.lua's ARGV (none:
# claim only). Reply: the claim's, with acquire.lua's reply appended when it ran.
_CLAIM_ACQUIRE = f"""
local function claim(KEYS, ARGV)
{CLAIM_LUA}
end
local function acquire(KEYS, ARGV)
{script_source("acquire")}
end
local n = tonumber(ARGV[1])
local c_args, a_args = {{}}, {{}}
for i = 2, n + 1 do c_args[#c_args + 1] = ARGV[i] end
for i = n + 2, #ARGV do a_args[#a_args + 1] = ARGV[i] end
local c = claim({{KEYS[1]}}, c_args)
if #a_args == 0 or type(c) ~= 'table' or c[2] ~= '-' or c[3] ~= '-' then return c end
c[5] = acquire({{KEYS[2], KEYS[3], KEYS[4], KEYS[5]}}, a_args)
return c
"""


@dataclass(frozen=True)
class Claimed:
    """What :meth:`ClaimPermits.claim` found: ``status`` (``CLAIMED``, ``DONE`` or ``BUSY``),
    the model's gate when claimed, and the first permit when one was granted with the claim
    (``granted_mono_s``: this process's monotonic clock just before the call)."""

    status: str
    view: GateView | None
    permit: Lease | None = None


class ClaimPermits:
    """Claims with a first permit, and done markers with a last release: :meth:`run_calls` on
    the sync client, :meth:`arun_calls` on the async one.

    ``client``: the worker's sync ``redis.Redis`` (the same Redis as ``limiter``'s client).
    ``limiter``: the process's ``RedisLimiter`` (its key prefix and rate configuration).
    ``async_client``: the worker loop's ``redis.asyncio.Redis``, for :meth:`arun_calls`.
    """

    def __init__(self, client: redis.Redis, limiter: RedisLimiter, async_client: Any = None) -> None:
        self._client = client
        self._limiter = limiter
        self._claim = client.register_script(_CLAIM_ACQUIRE)
        self._release = client.register_script(script_source("release"))
        # a worker's Redis batch: claims, done markers, deferrals and releases in one EVALSHA
        self._batch = ScriptBatch(client, [self._claim, self._release, *CampaignState.finish_scripts(client)],
                                  async_client=async_client)

    def claim_call(self, state: CampaignState, task: RunTask, owner: str, ttl_s: float) -> tuple[Call, bool]:
        """The claim script's call for ``task`` (to pipeline it), and whether it asks for a first
        permit; :meth:`claimed_from` reads its reply."""
        c_args = claim_args(task.run_id, task.model, owner, ttl_s)
        keys = [state.base]
        a_args: list[Any] = []
        ask = not (task.limits.tokens_per_minute or task.limits.requests_per_minute)
        if ask:
            a_keys, a_args = self._limiter.acquire_call(task.model, task.limits, task.run_id, 0)
            keys += a_keys
        return (self._claim, keys, [len(c_args), *c_args, *a_args]), ask

    def claim(self, state: CampaignState, task: RunTask, owner: str, ttl_s: float) -> Claimed:
        """Claim ``task``'s run for ``owner`` (``ttl_s`` seconds), read its model's gate and,
        if claimed with the gate open and no request or token limit, decide its first permit (holder =
        run_id, as ``execute_run`` asks)."""
        (script, keys, args), _ = self.claim_call(state, task, owner, ttl_s)
        asked_at = time.monotonic()  # the grant happens after this: the grant-to-send delay's origin
        return self.claimed_from(script(keys=keys, args=args), task, asked_at)

    def claimed_from(self, reply: Any, task: RunTask, asked_at: float) -> Claimed:
        """What a claim call's ``reply`` says; ``asked_at``: this process's monotonic clock just
        before the call was sent (the origin of its permit's grant-to-send delay)."""
        status, view = parse_claim(reply)
        if status != CLAIMED or not isinstance(reply, list) or len(reply) < 5:
            return Claimed(status, view)
        try:
            decision = self._limiter.decision(reply[4], task.model, task.run_id, 0, granted_mono_s=asked_at)
        except ModelDisabled:
            return Claimed(status, view)  # execute_run's own acquire meets it and records why
        return Claimed(status, view, decision.permit)

    def release(self, permits: Sequence[tuple[Permit, int | None]]) -> None:
        """Release ``(permit, actual_tokens)`` pairs now, one pipeline."""
        self.run_calls(self.release_calls(permits))

    def done_and_release(self, state: CampaignState, run_id: str, model: str, outcome: str, failed: bool,
                         attempts: int, permits: Sequence[tuple[Permit, int | None]] = ()) -> bool:
        """``DoneRuns.mark`` and the release of ``permits`` in one pipeline; True if
        the run is newly done."""
        calls = self.release_calls(permits)
        return int(self.run_calls([state.done.mark_call(run_id, model, outcome, failed, attempts), *calls])[0]) == 1

    async def arun_calls(self, calls: Sequence[Call]) -> list[Any]:
        """:meth:`run_calls` from the worker's event loop, on the async client (no thread
        hand-off); calls of other scripts go through :meth:`run_calls` in a thread."""
        if not calls:
            return []
        if not self._batch.covers(calls):
            return await asyncio.to_thread(self.run_calls, calls)
        return _raise_first_error(await self._batch.arun(calls))

    def release_calls(self, permits: Sequence[tuple[Permit, int | None]]) -> list[Call]:
        """The release of each ``(permit, actual_tokens)`` as a ``(script, keys, args)`` call."""
        return [(self._release, *self._limiter.release_call(p, t)) for p, t in permits]

    def run_calls(self, calls: Sequence[Call]) -> list[Any]:
        """Run each ``(script, keys, args)``, in order, in one round trip; returns their replies
        (raises the first call's error, if one failed). Claims, done markers, deferrals and
        releases go as one ``EVALSHA`` (``ScriptBatch``); other scripts in a non-transactional
        pipeline, where a script the server does not know (flushed by a restart) is loaded and
        run again on its own, so no call that did run is repeated."""
        if not calls:
            return []
        if self._batch.covers(calls):
            return _raise_first_error(self._batch.run(calls))
        pipe = self._client.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        results = pipe.execute(raise_on_error=False)
        out = []
        for (script, keys, args), res in zip(calls, results):
            if isinstance(res, NoScriptError):
                res = script(keys=keys, args=args)  # loads it, then runs it
            elif isinstance(res, Exception):
                raise res
            out.append(res)
        return out


def _raise_first_error(replies: list[Any]) -> list[Any]:
    for res in replies:
        if isinstance(res, Exception):
            raise res
    return replies
