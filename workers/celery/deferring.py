"""``DeferringLimiter``: the Redis limiter as ``execute_run`` sees it on a Celery worker.

It waits at most ``max_wait_s`` for a permit and otherwise raises :class:`Deferred`
(deliberately NOT an ``IrbenchError``, so it leaves ``execute_run`` without becoming an attempt
or a record); the task then parks the run in the campaign's delayed set. A rate denial reserves
the run's slot in Redis (keyed by run_id), so the countdown is exactly the time to that slot and
the re-sent run is granted without a second rate charge. A Redis outage also becomes a deferral
for the first permit; a retry waits for Redis instead (its earlier attempts must be stored).

Two round trips of a run's usual three limiter calls are made by the task thread instead of the
shared event loop (``workers.state.claim_permit``): the first permit may come with the claim
(``first``), and with ``release_later`` the last permit's release is handed back to the task
thread (:meth:`DeferringLimiter.take_unreleased`), which sends it with the run's done marker.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from typing import Any, Protocol

import structlog
from redis.exceptions import RedisError

from workers.state.gate import RedisGate
from workers.celery.local_cooldowns import LocalCooldowns
from workers.state.redis_limiter import RedisLimiter
from workers.errors import GateClosed, LimiterError, LimiterUnavailable, WaitBudgetExceeded
from workers.limits.base import Permit
from workers.limits.memory import CONCURRENCY, COOLDOWN
from workers.runtask import ModelLimits

log = structlog.get_logger("irbench.worker")


class Deferred(Exception):
    """No permit within the bounded wait: re-publish the run after ``wait_s`` seconds.

    ``reserved``: a rate slot is reserved for the run at exactly ``wait_s`` from now; come back
    then (no jitter needed: the slot has one owner)."""

    def __init__(self, wait_s: float, reason: str, *, reserved: bool = False) -> None:
        super().__init__(f"deferred {wait_s:.2f} s ({reason}{', slot reserved' if reserved else ''})")
        self.wait_s = wait_s
        self.reason = reason
        self.reserved = reserved


class MessageCalls:
    """How many runs of one broker message hold a permit (granted, not yet through
    ``execute_run``). While any does, the message's task thread is held by it anyway, so a
    sibling's wait for a concurrency permit costs no thread and need not defer. Touched only
    on the worker's event loop."""

    def __init__(self) -> None:
        self.calling = 0


class PermitRegistry(Protocol):
    """What the limiter reports held permits to (the worker runtime: its heartbeat renews them)."""

    settings: Any  # WorkerSettings: max_wait_s, min_defer_s, limit_jitter_allowance_s, max_regrants
    cooldowns: LocalCooldowns  # 429 cooldowns this process met, before Redis has them

    def hold_permit(self, permit: Permit) -> None: ...

    def drop_permit(self, permit: Permit) -> None: ...


class DeferringLimiter:
    """``Limiter`` for ``execute_run``: bounded wait, deferral, gate re-check after the grant.

    Only the run's first permit can be deferred; a retry's permit is awaited (bounded by the
    cooldown/rate interval), so attempts already made are never lost. One instance per run.
    A rate denial reserves the run's next slot (``RedisLimiter.acquire``): if it is within
    ``max_wait_s`` the run waits for it here, otherwise :class:`Deferred` carries the exact
    countdown to it. The gate re-check after the grant is async (no blocking Redis call on the
    shared event loop).

    ``first``: a permit granted together with the run's claim (same holder), already held in
    ``runtime``; the first :meth:`acquire` returns it without a round trip of its own — no gate
    re-check either, the claim read the gate in the same atomic step — unless the grant is
    already older than the jitter allowance or this process has noted a cooldown since (then it
    is given back and re-acquired, as any late grant). ``release_later``: :meth:`release` only notes the permit; :meth:`take_unreleased`
    hands it to the caller (the task thread) once ``execute_run`` has returned. If the run goes
    on instead (a retry), the next :meth:`acquire` releases it first, and in any case it is
    released from the loop after ``release_grace_s`` (a retry's backoff never holds a slot).

    Granted permits are registered with the runtime so its heartbeat renews their leases.
    """

    def __init__(self, inner: RedisLimiter, gate: RedisGate, runtime: PermitRegistry, *,
                 first: Permit | None = None, release_later: bool = False, release_grace_s: float = 0.05,
                 message: MessageCalls | None = None) -> None:
        self._inner, self._gate, self._rt = inner, gate, runtime
        self._max_wait_s = runtime.settings.max_wait_s
        self._min_defer_s = runtime.settings.min_defer_s
        self._allowance_s = runtime.settings.limit_jitter_allowance_s
        self._max_regrants = runtime.settings.max_regrants
        self._redis_retry_s = runtime.settings.redis_retry_s
        self._acquisitions = 0  # one instance per run execution
        self._first = first
        self._release_later = release_later
        self._grace_s = release_grace_s
        self._lock = threading.Lock()  # the loop and the task thread both take the noted release
        self._noted: tuple[Permit, int | None] | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        self._message = message
        self._calling = False  # counted in message.calling

    async def acquire(self, model: str, limits: ModelLimits, holder: str, cost_tokens: int) -> Permit:
        self._acquisitions += 1
        await self._release_noted()  # a retry: the last attempt's permit goes back first (no adoption)
        # A retry inside execute_run must not defer: that would drop the attempts already made
        # (every attempt must be stored), so it waits; the wait is a cooldown or rate slot.
        budget_s = self._max_wait_s if self._acquisitions == 1 else None
        first, self._first = self._first, None
        if first is not None:
            # the claim's script read Redis's cooldown, not one this process met since
            cooling_s = self._rt.cooldowns.remaining_s(model)
            if first.model == model and first.holder == holder:
                permit = replace(first, cost_tokens=cost_tokens)  # granted for a model with no token limit
                late_s = self._late_s(permit)
                if late_s is None and cooling_s <= 0:
                    self._rt.hold_permit(permit)
                    return self._granted(permit)
                log.info("permit_regranted", model=model, late_s=round(late_s or 0.0, 3),
                         cooling_s=round(cooling_s, 3), regrant=0)
            await self._release_now(first)
        regrant, outage_since = 0, None  # monotonic time Redis was first found unreachable
        while True:
            # a cooldown this process noted but Redis may not have yet (local_cooldowns)
            budget_s = await self._sit_out_local_cooldown(model, budget_s)
            try:
                permit = await self._inner.acquire(model, limits, holder, cost_tokens, max_wait_s=budget_s)
                permit, cooling_s = await self._admit(permit)
            except WaitBudgetExceeded as exc:
                d = exc.decision
                if d.reason == CONCURRENCY and self._siblings_calling():
                    continue  # the message's thread is held by a sibling's call: waiting costs no thread
                if d.reason == CONCURRENCY:  # the wait is an upper bound: a release comes sooner
                    raise Deferred(self._min_defer_s, d.reason) from None
                raise Deferred(d.wait_s, d.reason, reserved=d.reserved_at_s is not None) from None
            except (LimiterUnavailable, RedisError) as exc:
                outage_since = await self._sit_out_outage(exc, outage_since)
                continue
            # the admission read Redis; a 429 this process met since (its Redis write still in
            # flight) is only here: the send would come after this process knew of the cooldown
            cooling_s = max(cooling_s, self._rt.cooldowns.remaining_s(model))
            late_s = self._late_s(permit)
            if cooling_s <= 0 and (late_s is None or regrant >= self._max_regrants):
                return self._granted(permit)
            # CPU starvation: the grant is older than the limiter's jitter allowance, so sending
            # now could put one request too many into the provider's window; or a 429 started a
            # cooldown after the grant. Give it back (its rate slot stays spent: never a burst)
            # and take a fresh one (which waits out the cooldown). A cooldown is never sent
            # into, even past max_regrants: each round waits it out, so only new 429s repeat it.
            log.info("permit_regranted", model=model, late_s=round(late_s or 0.0, 3),
                     cooling_s=round(cooling_s, 3), regrant=regrant + 1)
            await self._release_now(permit)
            regrant += 1

    def _granted(self, permit: Permit) -> Permit:
        if self._message is not None and not self._calling:
            self._calling = True
            self._message.calling += 1
        return permit

    def _siblings_calling(self) -> bool:
        """Whether another run of this run's message holds a permit (this one holds none while
        it waits for its first)."""
        return self._message is not None and self._message.calling > (1 if self._calling else 0)

    def through(self) -> None:
        """The run is through ``execute_run``: it no longer holds its message's thread."""
        if self._message is not None and self._calling:
            self._calling = False
            self._message.calling -= 1

    async def _sit_out_outage(self, exc: Exception, since: float | None) -> float:
        """Redis could not grant or admit. The first permit defers (nothing called yet: the run
        comes back later). A retry must not (that would drop the attempts already made, which
        the provider saw): it waits for Redis, and past ``redis_retry_s`` the error ends the run
        inside ``execute_run`` (a ``LimiterUnavailable``: its record keeps every attempt).
        ``since``: when this outage was first met (None: now). Returns it."""
        if self._acquisitions == 1:
            raise Deferred(self._min_defer_s * 4, "limiter unavailable") from exc
        now = time.monotonic()
        since = now if since is None else since
        outage_s = now - since  # wall time: each failed attempt itself takes up to a socket timeout
        if outage_s >= self._redis_retry_s:
            if isinstance(exc, LimiterUnavailable):
                raise exc
            raise LimiterUnavailable(f"Redis unreachable for {outage_s:.0f} s during a retry: {type(exc).__name__}") from exc
        await asyncio.sleep(self._min_defer_s)
        return since

    async def _sit_out_local_cooldown(self, model: str, budget_s: float | None) -> float | None:
        """Wait out this process's noted cooldown of ``model`` (or defer the first permit when
        it is longer than the wait budget); return the budget left."""
        wait_s = self._rt.cooldowns.remaining_s(model)
        if wait_s <= 0:
            return budget_s
        if budget_s is not None and wait_s > budget_s:
            raise Deferred(wait_s, COOLDOWN)
        await asyncio.sleep(wait_s)
        return None if budget_s is None else budget_s - wait_s

    def _late_s(self, permit: Permit) -> float | None:
        """How far past the allowance the grant-to-send delay is, or None if within it."""
        if permit.granted_mono_s is None:
            return None
        delay = time.monotonic() - permit.granted_mono_s
        return delay if delay > self._allowance_s else None

    async def _admit(self, permit: Permit) -> tuple[Permit, float]:
        """The gate re-check (a 410 may have closed the model while we waited: don't make the
        call) and the cooldown still to go, in one round trip."""
        try:
            reason, cooling_s = await self._gate.admission_async(permit.model, self._inner.state_key(permit.model))
        except RedisError:
            await self._release_now(permit)
            raise
        if reason is not None:
            await self._release_now(permit)
            raise GateClosed(reason)
        self._rt.hold_permit(permit)
        return permit, cooling_s

    async def release(self, permit: Permit, actual_tokens: int | None = None) -> None:
        if not self._release_later:
            await self._release_now(permit, actual_tokens)
            return
        with self._lock:
            noted, self._noted = self._noted, (permit, actual_tokens)
        if noted is not None:  # not expected (one permit at a time), but never leak one
            await self._release_now(*noted)
        asyncio.get_running_loop().call_later(self._grace_s, self._release_noted_soon)

    def take_unreleased(self) -> list[tuple[Permit, int | None]]:
        """The permits still held for the run — the noted last release, a ``first`` permit
        never used — as ``(permit, actual_tokens)``; the caller releases them (they stay
        registered for the heartbeat until it calls ``drop_permit``). Call after ``execute_run``
        returned or raised."""
        with self._lock:
            noted, self._noted = self._noted, None
        first, self._first = self._first, None
        return [x for x in (noted, None if first is None else (first, None)) if x is not None]

    def _take_noted(self) -> tuple[Permit, int | None] | None:
        with self._lock:
            noted, self._noted = self._noted, None
        return noted

    async def _release_noted(self) -> None:
        noted = self._take_noted()
        if noted is not None:
            await self._release_now(*noted)

    def _release_noted_soon(self) -> None:
        """Loop callback ``release_grace_s`` after a noted release: the run went on (a retry's
        backoff), so release it from here."""
        noted = self._take_noted()
        if noted is not None:
            task = asyncio.ensure_future(self._release_now(*noted))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _release_now(self, permit: Permit, actual_tokens: int | None = None) -> None:
        self._rt.drop_permit(permit)
        try:
            await self._inner.release(permit, actual_tokens)
        except LimiterError as exc:  # the lease expires by itself
            log.warning("limiter_release_failed", model=permit.model, error=str(exc))

    async def cooldown(self, model: str, seconds: float) -> None:
        self._rt.cooldowns.note(model, seconds)  # before any await: this process's other runs see it now
        try:
            await self._inner.cooldown(model, seconds)
        except LimiterError as exc:
            log.warning("limiter_cooldown_failed", model=model, error=str(exc))
