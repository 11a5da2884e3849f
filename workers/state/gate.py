"""``ModelGate`` shared by every worker of a campaign, in Redis (the twin of ``workers.gate.MemoryGate``).

A 410 retires the model for the campaign on every worker; ``disable_after_consecutive``
auth/not-found/client errors in a row (counted across workers) disable it; ``cancel_all`` closes
every model (``irbench cancel``). Its keys are the campaign's ``flags``
(``workers.state.gate_flags.GateFlags``: ``P:gate``, ``P:streak``, ``P:cancel``).

The protocol methods are synchronous because ``execute_run`` calls them synchronously; each is
one round trip on a sync client with short socket timeouts. ``closed_reason`` lets a Redis error
propagate (the caller defers the run: an unknown gate must not be read as "open"), while
``observe`` retries briefly and then logs, since losing a streak increment only delays a disable.

``execute_run`` runs on the worker's shared event loop, where a sync round trip stalls every
other run of the process. So: ``closed_reason_async`` (the check right after a permit is
granted) uses the async client, and ``closed_reason`` answers from the last check made less than
``fresh_s`` ago — the task thread primes it just before handing the run to the loop — and only
goes to Redis (blocking) when that answer is older. An "open" answer at most ``fresh_s`` old
is safe because every grant is followed by the async re-check before the call is made.

The claim script reads the gate and the streak with the claim (``prime``), so a run's first
check costs no round trip of its own, and a success resets a streak (HDEL) only when one existed
at the claim or this run made one: a streak another worker starts while this run is in flight is
not reset by this run's success. Runs in flight on several workers have no order anyway, so
"consecutive" is counted in the order Redis sees the outcomes, give or take those.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis
import structlog

from storage.records import Outcome
from workers.state.campaign_state import CampaignState
from workers.state.run_claims import GateView
from workers.state.redis_retry import TRANSIENT, with_retry
from workers.retry import DISABLING

log = structlog.get_logger("irbench.gate")


def _reason(cancel: Any, closed: Any) -> str | None:
    value = cancel if cancel is not None else closed
    return None if value is None else (value.decode() if isinstance(value, bytes) else str(value))


class RedisGate:
    """Gate of one campaign. ``observe_budget_s``: how long ``observe`` retries Redis (best effort).
    ``async_client``: used by :meth:`closed_reason_async` (else it runs the sync check in a
    thread). ``fresh_s``: how old a remembered answer :meth:`closed_reason` may return.
    ``clock``: monotonic seconds (injectable)."""

    def __init__(
        self,
        state: CampaignState,
        *,
        disable_after_consecutive: int = 3,
        observe_budget_s: float = 0.3,
        async_client: aioredis.Redis | None = None,
        fresh_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._flags = state.flags  # the owner of the keys this gate reads and writes
        self._client: redis.Redis = state.client
        self._aclient = async_client
        self._limit = disable_after_consecutive
        self._observe_budget_s = observe_budget_s
        self._fresh_s = fresh_s
        self._clock = clock
        self._known: dict[str, tuple[float, str | None]] = {}  # model -> (checked at, answer)
        self._streak: dict[str, bool] = {}  # model -> a streak may exist (unknown: True)

    def _remember(self, model: str, reason: str | None, checked_at: float) -> str | None:
        self._known[model] = (checked_at, reason)
        return reason

    def closed_reason(self, model: str) -> str | None:
        """The gate's answer, from a check less than ``fresh_s`` old or else from Redis."""
        now = self._clock()
        known = self._known.get(model)
        if known is not None and now - known[0] < self._fresh_s:
            return known[1]
        pipe = self._client.pipeline(transaction=False)
        pipe.get(self._flags.cancel_key)
        pipe.hget(self._flags.gate_key, model)
        return self._remember(model, _reason(*pipe.execute()), now)

    def prime(self, model: str, view: GateView) -> str | None:
        """Remember what the claim script read (``RunClaims.claim_with_gate``): the answer
        :meth:`refresh` would give, with no round trip of its own; and whether a disabling streak
        exists. Without one a success has nothing to reset, so :meth:`observe` skips its HDEL."""
        self._streak[model] = view.streak
        return self._remember(model, view.reason, self._clock())

    def refresh(self, model: str) -> str | None:
        """Check Redis now (sync; call it off the event loop) and remember the answer."""
        self._known.pop(model, None)
        return self.closed_reason(model)

    async def closed_reason_async(self, model: str) -> str | None:
        """Check Redis now without blocking the event loop; remembers the answer."""
        now = self._clock()
        if self._aclient is None:
            return await asyncio.to_thread(self.refresh, model)
        pipe = self._aclient.pipeline(transaction=False)
        pipe.get(self._flags.cancel_key)
        pipe.hget(self._flags.gate_key, model)
        return self._remember(model, _reason(*await pipe.execute()), now)

    async def admission_async(self, model: str, limiter_state_key: str) -> tuple[str | None, float]:
        """The check right before a call is sent, in one round trip: the gate's answer, and how
        long a cooldown (a 429 another run met after our permit was granted) still has to go, in
        seconds on Redis's clock (0 if none). ``limiter_state_key``: the limiter's model HASH."""
        now = self._clock()
        if self._aclient is None:
            return await asyncio.to_thread(self.refresh, model), 0.0
        pipe = self._aclient.pipeline(transaction=False)
        pipe.get(self._flags.cancel_key)
        pipe.hget(self._flags.gate_key, model)
        pipe.hget(limiter_state_key, "cool")
        pipe.time()
        cancel, closed, cool, (sec, usec) = await pipe.execute()
        reason = self._remember(model, _reason(cancel, closed), now)
        cooling_s = (float(cool) - (int(sec) * 1_000_000 + int(usec))) / 1e6 if cool is not None else 0.0
        return reason, max(cooling_s, 0.0)

    def _observe_once(self, model: str, outcome: Outcome, detail: str | None) -> None:
        gate, streak = self._flags.gate_key, self._flags.streak_key
        if outcome is Outcome.RETIRED:
            self._client.hsetnx(gate, model, "retired" + (f": {detail}" if detail else ""))
        elif outcome in DISABLING:
            self._streak[model] = True
            n = int(self._client.hincrby(streak, model, 1))
            if n >= self._limit:
                self._client.hsetnx(
                    gate,
                    model,
                    f"disabled after {n} consecutive {outcome.value} outcomes" + (f" (last: {detail})" if detail else ""),
                )
        elif self._streak.get(model, True):  # no streak when primed, none of ours since: nothing to reset
            self._client.hdel(streak, model)
            self._streak[model] = False

    def observe(self, model: str, outcome: Outcome, detail: str | None = None) -> None:
        try:
            with_retry(lambda: self._observe_once(model, outcome, detail), "gate observe",
                       budget_s=self._observe_budget_s, max_backoff_s=0.2)
        except TRANSIENT as exc:
            log.warning("gate_observe_lost", model=model, outcome=outcome.value, error=str(exc))

    def cancel_all(self, reason: str) -> None:
        self._flags.cancel(reason)

    def close(self, model: str, reason: str) -> None:
        """Close ``model`` for the campaign on every worker; a reason already set is kept."""
        self._flags.close(model, reason)
        self._known.pop(model, None)

    def reopen(self, model: str) -> None:
        """Undo a retirement/disable for this campaign (operator decision)."""
        pipe = self._client.pipeline(transaction=True)
        pipe.hdel(self._flags.gate_key, model)
        pipe.hdel(self._flags.streak_key, model)
        pipe.execute()
