"""In-process limiter: the reference twin of the Redis limiter, and the shared limiter vocabulary.

Semantics (identical in ``redis_limiter``), per model:

* **Concurrency**: at most ``max_concurrency`` leases outstanding. A lease expires ``lease_ttl_s``
  after it was granted or last renewed, so a crashed holder cannot keep a slot. Acquiring again
  with a holder that still has a live lease adopts that lease (a redelivered task) and charges
  nothing.
* **Rate**: GCRA with zero burst tolerance on two keys, requests and tokens. The emission interval
  is ``period_s / limit``; a permit is granted only when the theoretical arrival time (TAT) is not
  in the future, then the TAT moves to ``now + cost * interval``. Zero burst tolerance is the only
  GCRA setting under which no half-open window of ``period_s`` ever holds more than the request
  limit, which is what providers' per-minute windows punish. ``ModelLimits.requests_per_minute``
  and ``tokens_per_minute`` are read as "per ``period_s``" (60 s by default).
* **Tokens**: ``cost_tokens`` is charged at grant; ``release(permit, actual_tokens)`` moves the
  token TAT back by ``cost - actual`` (or forward when the estimate was too low). A refund is only
  applied while the lease is still live, so releasing twice never refunds twice.
* **Cooldown**: ``cooldown(model, s)`` grants nothing for that model for ``s`` seconds.
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

from workers.errors import IrbenchError
from workers.limits.base import Permit
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


class LimiterError(IrbenchError):
    """A limiter could not decide."""


class LimiterUnavailable(LimiterError):
    """The limiter's backend (Redis) cannot be reached; retry the task later."""


class ModelDisabled(LimiterError):
    """The model was disabled (e.g. HTTP 410 Gone); no further calls will be admitted."""

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(
            f"model {model!r} is disabled ({reason}); no further calls are admitted. "
            "Remove it from the campaign, or re-enable it with Limiter.enable() if this was a mistake."
        )
        self.model = model
        self.reason = reason


@dataclass(frozen=True)
class Lease(Permit):
    """A granted permit. ``granted_at_s`` is on the limiter's clock (Redis TIME for Redis)."""

    granted_at_s: float = 0.0


@dataclass(frozen=True)
class LimitDecision:
    """Outcome of one non-blocking admission check.

    ``permit`` is set when granted; otherwise ``wait_s`` is the earliest time worth retrying
    (for ``concurrency`` it is the next lease expiry, an upper bound: a release comes sooner),
    and ``reason`` says which limit denied. ``now_s`` is the decision time on the limiter's clock.
    """

    permit: Lease | None
    wait_s: float
    reason: str
    now_s: float


def check_cost(cost_tokens: int) -> None:
    """Reject a negative token estimate (a caller bug), naming the fix."""
    if cost_tokens < 0:
        raise LimiterError(f"cost_tokens must be >= 0 (got {cost_tokens}); pass the estimated prompt tokens + max_tokens")


def intervals_s(limits: ModelLimits, period_s: float) -> tuple[float, float]:
    """GCRA emission intervals (seconds per request, seconds per token); 0.0 = unlimited."""
    per_request = period_s / limits.requests_per_minute if limits.requests_per_minute else 0.0
    per_token = period_s / limits.tokens_per_minute if limits.tokens_per_minute else 0.0
    return per_request, per_token


@dataclass
class _ModelState:
    leases: dict[str, float] = field(default_factory=dict)  # holder -> expiry (clock seconds)
    tat_requests_s: float = -math.inf
    tat_tokens_s: float = -math.inf
    per_token_s: float = 0.0  # last seen token interval, used by release() refunds
    cooldown_until_s: float = -math.inf
    disabled_reason: str | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class MemoryLimiter:
    """Single-process limiter with an injectable monotonic ``clock`` and ``sleep``.

    ``lease_ttl_s``: lease lifetime without renewal. ``period_s``: the rate window the limits are
    counted over (60 s = "per minute"; tests and benchmarks use shorter windows).
    """

    def __init__(
        self,
        *,
        lease_ttl_s: float = 900.0,
        period_s: float = 60.0,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if lease_ttl_s <= 0 or period_s <= 0:
            raise LimiterError("lease_ttl_s and period_s must be > 0 seconds")
        self._ttl_s = lease_ttl_s
        self._period_s = period_s
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

    async def try_acquire(self, model: str, limits: ModelLimits, holder: str, cost_tokens: int) -> LimitDecision:
        """Grant now or say how long to wait and why. Raises :class:`ModelDisabled`."""
        check_cost(cost_tokens)
        st = self._state(model)
        now = self._clock()
        if st.disabled_reason is not None:
            raise ModelDisabled(model, st.disabled_reason)
        if st.cooldown_until_s > now:
            return LimitDecision(None, st.cooldown_until_s - now, COOLDOWN, now)
        for h in [h for h, exp in st.leases.items() if exp <= now]:
            del st.leases[h]
        if holder in st.leases:
            st.leases[holder] = now + self._ttl_s
            return LimitDecision(Lease(model, holder, cost_tokens, granted_at_s=now), 0.0, ADOPTED, now)
        cap = limits.max_concurrency
        if cap is not None and len(st.leases) >= cap:
            return LimitDecision(None, min(st.leases.values()) - now, CONCURRENCY, now)
        per_request, per_token = intervals_s(limits, self._period_s)
        wait_r = st.tat_requests_s - now if per_request else 0.0
        wait_t = st.tat_tokens_s - now if per_token else 0.0
        if wait_r > 0 or wait_t > 0:
            return LimitDecision(None, max(wait_r, wait_t), REQUESTS if wait_r >= wait_t else TOKENS, now)
        if per_request:
            st.tat_requests_s = now + per_request
        if per_token:
            st.tat_tokens_s = now + cost_tokens * per_token
            st.per_token_s = per_token
        st.leases[holder] = now + self._ttl_s
        return LimitDecision(Lease(model, holder, cost_tokens, granted_at_s=now), 0.0, GRANTED, now)

    async def acquire(self, model: str, limits: ModelLimits, holder: str, cost_tokens: int) -> Lease:
        """Wait (without spinning) until granted; ``waited_ms`` is the time spent waiting."""
        started: float | None = None
        while True:
            changed = self._state(model).changed  # captured before deciding: no lost wake-ups
            d = await self.try_acquire(model, limits, holder, cost_tokens)
            started = d.now_s if started is None else started
            if d.permit is not None:
                return replace(d.permit, waited_ms=(d.now_s - started) * 1000.0)
            await self._wait(changed, d.wait_s)

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
