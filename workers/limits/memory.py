"""In-process limiter: the reference twin of the Redis limiter, and the shared limiter vocabulary.

Semantics (identical in ``redis_limiter``), per model:

* **Concurrency**: at most ``max_concurrency`` leases outstanding. A lease expires ``lease_ttl_s``
  after it was granted or last renewed, so a crashed holder cannot keep a slot. Acquiring again
  with a holder that still has a live lease adopts that lease (a redelivered task) and charges
  nothing.
* **Rate**: GCRA with zero burst tolerance on two keys, requests and tokens. The emission interval
  is ``(period_s + jitter_allowance_s) / limit``; a permit is granted only when the theoretical
  arrival time (TAT) is not in the future, then the TAT moves to ``now + cost * interval``. Zero
  burst tolerance is the only GCRA setting under which no half-open window of the period ever
  holds more than the request limit, which is what providers' per-minute windows punish.
  ``ModelLimits.requests_per_minute`` and ``tokens_per_minute`` are read as "per ``period_s``"
  (60 s by default).
* **Jitter allowance**: grants are decided on the limiter's clock but requests reach the provider
  after a variable delay (event loop, GIL, network; 50 ms typical, 250 ms measured on a saturated
  2-core box; ``bench/rate_limits.py`` measures it). With an interval of exactly ``period_s / limit``,
  ``limit + 1`` grants span exactly one period, so any spread in that delay puts one request too
  many into some provider window. The window the limiter enforces is therefore
  ``window_s = period_s + jitter_allowance_s`` (default 0.25 s: 0.4 % of a 60 s window), which
  keeps provider windows within the limit as long as delays vary by less than the allowance.
* **Grant log**: the times of the last ``limit`` actual grants; a grant (fresh or a claimed
  reservation) is refused while ``limit`` grants lie within the last ``window_s``. GCRA already
  spaces fresh grants; the log is what keeps the guarantee when reservations are claimed late.
* **Reservations**: ``try_acquire(..., reserve=True)`` denied by the rate (requests, tokens or the
  log) reserves the next slot for ``holder`` instead of only reporting the wait: the TATs move as
  if the grant happened at the slot, the decision carries ``reserved_at_s``, and a later acquire
  by the same holder at or after the slot is granted (reason ``claimed``) without a second rate
  charge (concurrency, cooldown and the grant log are still checked). Each slot has exactly one
  owner, so waiters never race for it, and a deferred run can come back exactly on time. Slots
  further than ``reserve_ahead_s`` away are not reserved (only reported). A reservation not
  claimed within ``reservation_grace_s`` after its slot is abandoned: it expires, its slot is
  simply unused, and the grant log still bounds every window.
* **Tokens**: ``cost_tokens`` is charged at grant; ``release(permit, actual_tokens)`` moves the
  token TAT back by ``cost - actual`` (or forward when the estimate was too low). A refund is only
  applied while the lease is still live, so releasing twice never refunds twice.
* **Cooldown**: ``cooldown(model, s)`` grants nothing for that model for ``s`` seconds, and
  restarts the rate schedule at the cooldown's end: reservations made before it are void (their
  holders reserve again when they come back) and the request TAT moves to the cooldown's end, so
  permits resume one interval apart rather than every overdue reservation at once (a 429 burst).
  Token charges of voided reservations are not refunded (conservative).
* **Disable**: ``disable(model, reason)`` (an HTTP 410) makes every acquire raise
  :class:`ModelDisabled`, including callers already waiting.

Waiting never spins: a waiter sleeps exactly until the computed earliest time (rate, cooldown),
or until the next lease expiry (concurrency), and wakes early when the model's state changes
(release, cooldown, disable). Each model has its own state, so waiting on one never delays another.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from workers.errors import LimiterError, ModelDisabled, WaitBudgetExceeded
from workers.limits.base import Lease, LimitDecision, Permit
from workers.runtask import ModelLimits

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

# Reasons a decision can carry (closed vocabulary, shared with the Lua scripts).
GRANTED = "granted"
ADOPTED = "adopted"
COOLDOWN = "cooldown"
CONCURRENCY = "concurrency"
REQUESTS = "requests"
TOKENS = "tokens"
WINDOW = "window"  # the grant log: `limit` grants already in the last window
RESERVED = "reserved"  # the holder's reserved slot is not due yet
CLAIMED = "claimed"  # granted on the holder's reservation (no second rate charge)


def check_cost(cost_tokens: int) -> None:
    """Reject a negative token estimate (a caller bug), naming the fix."""
    if cost_tokens < 0:
        raise LimiterError(f"cost_tokens must be >= 0 (got {cost_tokens}); pass the estimated prompt tokens + max_tokens")


def intervals_s(limits: ModelLimits, period_s: float, jitter_allowance_s: float = 0.0) -> tuple[float, float]:
    """GCRA emission intervals (seconds per request, seconds per token); 0.0 = unlimited.

    Both are ``(period_s + jitter_allowance_s) / limit``: see the module docstring.
    """
    window_s = period_s + jitter_allowance_s
    per_request = window_s / limits.requests_per_minute if limits.requests_per_minute else 0.0
    per_token = window_s / limits.tokens_per_minute if limits.tokens_per_minute else 0.0
    return per_request, per_token


def log_limit(requests_per_window: float) -> int:
    """Grants the log allows per window: a whole number, at least 1 (2.5/window allows 2)."""
    return max(1, math.floor(requests_per_window))


def check_config(lease_ttl_s: float, period_s: float, jitter_allowance_s: float, reserve_ahead_s: float, reservation_grace_s: float) -> None:
    """Reject settings that cannot work, naming the fix."""
    if lease_ttl_s <= 0 or period_s <= 0:
        raise LimiterError("lease_ttl_s and period_s must be > 0 seconds")
    if jitter_allowance_s < 0 or reserve_ahead_s < 0 or reservation_grace_s <= 0:
        raise LimiterError(
            "jitter_allowance_s and reserve_ahead_s must be >= 0 and reservation_grace_s > 0 seconds "
            f"(got {jitter_allowance_s}, {reserve_ahead_s}, {reservation_grace_s})"
        )


@dataclass(frozen=True)
class RateTiming:
    """The times a limiter keeps leases and rate windows by, in seconds: ``lease_ttl_s`` (lease
    lifetime without renewal), ``period_s`` (the window the limits are counted over),
    ``jitter_allowance_s`` (added to that window), ``reserve_ahead_s`` (farthest slot a rate
    denial reserves), ``reservation_grace_s`` (how long after its slot an unclaimed reservation
    is kept). Invalid values raise ``LimiterError``."""

    lease_ttl_s: float = 900.0
    period_s: float = 60.0
    jitter_allowance_s: float = 0.25
    reserve_ahead_s: float = 30.0
    reservation_grace_s: float = 30.0

    def __post_init__(self) -> None:
        check_config(self.lease_ttl_s, self.period_s, self.jitter_allowance_s, self.reserve_ahead_s, self.reservation_grace_s)


def over_budget(d: LimitDecision, waited_s: float, max_wait_s: float | None) -> bool:
    """True when a denied ``acquire`` must give up now rather than wait (bounded waits).

    Rate, cooldown and reservation waits are exact, so they give up at once when they would end
    past the budget; a concurrency wait is an upper bound (a release comes sooner), so it waits
    until the budget is spent.
    """
    if max_wait_s is None:
        return False
    if d.reason == CONCURRENCY:
        return waited_s >= max_wait_s
    return waited_s + d.wait_s > max_wait_s


@dataclass
class _ModelState:
    leases: dict[str, float] = field(default_factory=dict)  # holder -> expiry (clock seconds)
    tat_requests_s: float = -math.inf
    tat_tokens_s: float = -math.inf
    per_token_s: float = 0.0  # last seen token interval, used by release() refunds
    cooldown_until_s: float = -math.inf
    disabled_reason: str | None = None
    grant_log_s: list[float] = field(default_factory=list)  # actual grant times within the window
    reservations: dict[str, tuple[float, float]] = field(default_factory=dict)  # holder -> (slot, expiry)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class MemoryLimiter:
    """Single-process limiter with an injectable monotonic ``clock`` and ``sleep``.

    ``timing``: its lease lifetime, rate window (60 s = "per minute"; tests and benchmarks use
    shorter windows), jitter allowance (module docstring) and reservation bounds, as the Redis
    limiter takes them (:class:`RateTiming`).
    """

    def __init__(
        self,
        timing: RateTiming | None = None,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        timing = timing or RateTiming()
        self._ttl_s = timing.lease_ttl_s
        self._period_s = timing.period_s
        self._allowance_s = timing.jitter_allowance_s
        self._window_s = timing.period_s + timing.jitter_allowance_s
        self._ahead_s = timing.reserve_ahead_s
        self._grace_s = timing.reservation_grace_s
        self._clock = clock
        self._sleep = sleep
        self._models: dict[str, _ModelState] = {}

    def _state(self, model: str) -> _ModelState:
        st = self._models.get(model)
        if st is None:
            st = self._models[model] = _ModelState()
        return st

    def _notify(self, st: _ModelState) -> None:
        # Broadcast: wake every waiter on this model, then hand out a fresh event for the next wait.
        st.changed.set()
        st.changed = asyncio.Event()

    def _log_free_at(self, st: _ModelState, rpm: float | None, now: float) -> float:
        """Earliest time the grant log allows one more grant (``now`` when it does)."""
        if not rpm:
            return now
        limit = log_limit(rpm)
        st.grant_log_s = [g for g in st.grant_log_s if g > now - self._window_s]
        n = len(st.grant_log_s)
        return st.grant_log_s[n - limit] + self._window_s if n >= limit else now

    def _grant(self, st: _ModelState, model: str, limits: ModelLimits, holder: str, cost_tokens: int, now: float, reason: str) -> LimitDecision:
        if limits.requests_per_minute:
            st.grant_log_s.append(now)
        st.leases[holder] = now + self._ttl_s
        return LimitDecision(Lease(model, holder, cost_tokens, granted_at_s=now), 0.0, reason, now)

    async def try_acquire(  # noqa: C901  (mirrors the Lua script's checks one for one: see redis_limiter)
        self, model: str, limits: ModelLimits, holder: str, cost_tokens: int, *, reserve: bool = False
    ) -> LimitDecision:
        """Grant now or say how long to wait and why (``reserve``: see the module docstring).
        Raises :class:`ModelDisabled`."""
        check_cost(cost_tokens)
        st = self._state(model)
        now = self._clock()
        if st.disabled_reason is not None:
            raise ModelDisabled(model, st.disabled_reason)
        for h in [h for h, (_, exp) in st.reservations.items() if exp <= now]:
            del st.reservations[h]  # abandoned: its slot stays unused
        resv = st.reservations.get(holder)
        slot = None if resv is None else resv[0]
        if st.cooldown_until_s > now:
            return LimitDecision(None, st.cooldown_until_s - now, COOLDOWN, now, slot)
        for h in [h for h, exp in st.leases.items() if exp <= now]:
            del st.leases[h]
        if holder in st.leases:
            st.leases[holder] = now + self._ttl_s
            return LimitDecision(Lease(model, holder, cost_tokens, granted_at_s=now), 0.0, ADOPTED, now, slot)
        cap = limits.max_concurrency
        if cap is not None and len(st.leases) >= cap:
            return LimitDecision(None, min(st.leases.values()) - now, CONCURRENCY, now, slot)
        free = self._log_free_at(st, limits.requests_per_minute, now)
        if resv is not None:
            assert slot is not None
            if slot > now:
                return LimitDecision(None, slot - now, RESERVED, now, slot)
            if free > now:
                st.reservations[holder] = (slot, free + self._grace_s)
                return LimitDecision(None, free - now, WINDOW, now, slot)
            del st.reservations[holder]
            return self._grant(st, model, limits, holder, cost_tokens, now, CLAIMED)
        per_request, per_token = intervals_s(limits, self._period_s, self._allowance_s)
        wait_r = st.tat_requests_s - now if per_request else 0.0
        wait_t = st.tat_tokens_s - now if per_token else 0.0
        wait_w = free - now
        if wait_r > 0 or wait_t > 0 or wait_w > 0:
            wait, reason = wait_r, REQUESTS
            if wait_t > wait:
                wait, reason = wait_t, TOKENS
            if wait_w > wait:
                wait, reason = wait_w, WINDOW
            if not (reserve and wait <= self._ahead_s):
                return LimitDecision(None, wait, reason, now)
            slot = now + wait  # a grant scheduled at the slot: charge it now, claim it then
            if per_request:
                st.tat_requests_s = slot + per_request
            if per_token:
                st.tat_tokens_s = slot + cost_tokens * per_token
                st.per_token_s = per_token
            st.reservations[holder] = (slot, slot + self._grace_s)
            return LimitDecision(None, wait, reason, now, slot)
        if per_request:
            st.tat_requests_s = now + per_request
        if per_token:
            st.tat_tokens_s = now + cost_tokens * per_token
            st.per_token_s = per_token
        return self._grant(st, model, limits, holder, cost_tokens, now, GRANTED)

    async def acquire(
        self, model: str, limits: ModelLimits, holder: str, cost_tokens: int, *, max_wait_s: float | None = None
    ) -> Lease:
        """Wait (without spinning) until granted; ``waited_ms`` is the time spent waiting.

        A rate denial reserves the holder's slot, so waiters are served in order. ``max_wait_s``:
        raise :class:`WaitBudgetExceeded` instead of waiting past it (the reservation stays).
        """
        started: float | None = None
        while True:
            changed = self._state(model).changed  # captured before deciding: no lost wake-ups
            d = await self.try_acquire(model, limits, holder, cost_tokens, reserve=True)
            started = d.now_s if started is None else started
            if d.permit is not None:
                return replace(d.permit, waited_ms=(d.now_s - started) * 1000.0)
            waited_s = d.now_s - started
            if over_budget(d, waited_s, max_wait_s):
                raise WaitBudgetExceeded(model, d)
            wait_s = d.wait_s if max_wait_s is None else min(d.wait_s, max_wait_s - waited_s)
            await self._wait(changed, wait_s)

    async def _wait(self, changed: asyncio.Event, wait_s: float) -> None:
        if changed.is_set():
            return
        ev = asyncio.ensure_future(changed.wait())
        nap = asyncio.ensure_future(self._sleep(max(wait_s, 0.0)))
        try:
            await asyncio.wait({ev, nap}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ev.cancel()
            nap.cancel()

    async def release(self, permit: Permit, actual_tokens: int | None = None) -> bool:
        """Free the lease and settle tokens. Returns False if the lease had already gone."""
        st = self._state(permit.model)
        now = self._clock()
        live = st.leases.pop(permit.holder, None)
        removed = live is not None and live > now
        if actual_tokens is not None and st.per_token_s:
            delta = actual_tokens - permit.cost_tokens
            if delta > 0:  # under-estimate: charge the difference
                st.tat_tokens_s = max(st.tat_tokens_s, now) + delta * st.per_token_s
            elif delta < 0 and removed:  # refund once, and never into the past
                st.tat_tokens_s = max(now, st.tat_tokens_s + delta * st.per_token_s)
        self._notify(st)
        return removed

    async def renew(self, permit: Permit) -> bool:
        """Extend a live lease by ``lease_ttl_s`` from now; False if it had expired (slot lost)."""
        st = self._state(permit.model)
        now = self._clock()
        exp = st.leases.get(permit.holder)
        if exp is None or exp <= now:
            st.leases.pop(permit.holder, None)
            return False
        st.leases[permit.holder] = now + self._ttl_s
        return True

    async def cooldown(self, model: str, seconds: float) -> None:
        st = self._state(model)
        st.cooldown_until_s = max(st.cooldown_until_s, self._clock() + seconds)
        st.tat_requests_s = st.cooldown_until_s  # restart the schedule (module docstring)
        st.reservations.clear()
        self._notify(st)

    async def disable(self, model: str, reason: str) -> None:
        st = self._state(model)
        st.disabled_reason = reason or "disabled"
        self._notify(st)

    async def enable(self, model: str) -> None:
        self._state(model).disabled_reason = None

    async def is_disabled(self, model: str) -> bool:
        return self._state(model).disabled_reason is not None

    async def disabled_reason(self, model: str) -> str | None:
        return self._state(model).disabled_reason

    async def outstanding(self, model: str) -> int:
        """Number of live (unexpired) leases for ``model``."""
        now = self._clock()
        return sum(1 for exp in self._state(model).leases.values() if exp > now)

    async def aclose(self) -> None:
        """Nothing to close; present so both backends can be used the same way."""
