"""Global per-model limiter on Redis: leases + GCRA + cooldown, one atomic Lua script per decision.

Same semantics as :class:`workers.limits.memory.MemoryLimiter` (read its docstring), with every
time taken from Redis ``TIME`` inside the scripts, so workers' clocks never matter.

Keys (one hash tag per model, so a cluster keeps them on one slot):
``{prefix}:{<model>}:lease`` ZSET holder -> expiry (us); ``{prefix}:{<model>}:state`` HASH with
``tat_r``/``tat_t`` (GCRA theoretical arrival times, us), ``ivt`` (us per token), ``cool``
(cooldown end, us) and ``disabled`` (reason); ``{prefix}:{<model>}:log`` ZSET of the actual grant
times in the last window (expires when idle); ``{prefix}:{<model>}:resv:<holder>`` STRING the
holder's reservation ``'<slot us>:<epoch>'`` (void once a cooldown bumps the state's ``epoch``), with
a TTL of its slot + ``reservation_grace_s``. Releases, cooldowns and disables are published on
``{prefix}:chg:<model>``; one pub/sub connection per limiter wakes the local waiters of that model.

Waiting: a denied acquire sleeps until the computed time (exact for rate and cooldown; the next
lease expiry for concurrency), wakes early on a change message for its model, and never sleeps
longer than ``max_block_s`` so a lost message (Redis restart) only delays, never strands, a waiter.
A release wakes one local waiter for a lease, other changes every waiter of the model
(``workers.state.limiter_waiters``): a saturated model never delays another, and a freed lease
costs one re-check per process, not one per waiting run.

The client must use a connection pool (the default): the pub/sub listener holds one connection.
Redis failures surface as :class:`LimiterUnavailable` (retry the task later), never as redis types.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import replace
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from workers.state.limiter_waiters import Waiters
from workers.errors import LimiterError, LimiterUnavailable, ModelDisabled, WaitBudgetExceeded
from workers.limits.base import Permit
from workers.limits.base import Lease, LimitDecision
from workers.limits.memory import (
    CONCURRENCY,
    RateTiming,
    check_cost,
    intervals_s,
    over_budget,
)
from workers.runtask import ModelLimits

_US = 1_000_000.0
_SCRIPTS = ("acquire", "release", "renew", "cooldown", "outstanding")


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _keys(prefix: str, model: str) -> list[str]:
    """[lease ZSET, state HASH]; the hash tag keeps one model's keys on one cluster slot."""
    return [f"{prefix}:{{{model}}}:lease", f"{prefix}:{{{model}}}:state"]


def _acquire_keys(prefix: str, model: str, holder: str) -> list[str]:
    """[lease ZSET, state HASH, grant log ZSET, the holder's reservation STRING]."""
    return [*_keys(prefix, model), f"{prefix}:{{{model}}}:log", f"{prefix}:{{{model}}}:resv:{holder}"]


def script_source(name: str) -> str:
    """The Lua source of one limiter script (``acquire``, ``release``, …)."""
    return (resources.files("workers.state") / "lua").joinpath(f"{name}.lua").read_text()


def _load_scripts(client: Any) -> dict[str, Any]:
    return {n: client.register_script(script_source(n)) for n in _SCRIPTS}


def _acquire_args(limits: ModelLimits, holder: str, cost_tokens: int, cfg: RateTiming, reserve: bool) -> list[Any]:
    check_cost(cost_tokens)
    per_request, per_token = intervals_s(limits, cfg.period_s, cfg.jitter_allowance_s)
    return [
        holder,
        limits.max_concurrency or 0,
        per_request * _US,
        per_token * _US,
        cost_tokens,
        cfg.lease_ttl_s * _US,
        limits.requests_per_minute or 0,
        (cfg.period_s + cfg.jitter_allowance_s) * _US,
        1 if reserve else 0,
        cfg.reserve_ahead_s * _US,
        cfg.reservation_grace_s * _US,
    ]


def _decision(res: list[Any], model: str, holder: str, cost_tokens: int,
              granted_mono_s: float | None = None) -> LimitDecision:
    code, wait_us, reason, now_us, detail, slot_us = res
    now_s = int(_text(now_us)) / _US
    slot = _text(slot_us)
    reserved_at_s = int(slot) / _US if slot else None
    if int(code) == -1:
        raise ModelDisabled(model, _text(detail))
    if int(code) > 0:
        lease = Lease(model, holder, cost_tokens, granted_mono_s=granted_mono_s, granted_at_s=now_s)
        return LimitDecision(lease, 0.0, _text(reason), now_s, reserved_at_s)
    return LimitDecision(None, int(_text(wait_us)) / _US, _text(reason), now_s, reserved_at_s)


def _release_args(permit: Permit, actual_tokens: int | None, channel: str, wake_window_s: float) -> list[Any]:
    return [permit.holder, permit.cost_tokens, "" if actual_tokens is None else actual_tokens, channel,
            int(wake_window_s * _US)]


def _translate(e: Exception, where: str, what: str) -> LimiterError:
    if isinstance(e, (RedisConnectionError, RedisTimeoutError, OSError)):
        return LimiterUnavailable(
            f"limiter Redis at {where} is unreachable while {what} ({e}); "
            "check that redis-server is running and reachable, then retry the task"
        )
    return LimiterError(f"limiter Redis at {where} refused {what}: {e}")


def _where(client: Any) -> str:
    kw = client.connection_pool.connection_kwargs
    return str(kw.get("path") or f"{kw.get('host', '?')}:{kw.get('port', '?')}")


class RedisLimiter:
    """Limiter shared by every worker that talks to the same Redis.

    ``client``: a ``redis.asyncio.Redis`` (pooled). ``key_prefix``: namespace of all keys.
    ``timing``: lease lifetime (without :meth:`renew`), rate window and reservation times, as in
    :class:`workers.limits.memory.MemoryLimiter` (same defaults).
    ``max_block_s``: longest single wait before re-checking; ``listener_ready_timeout_s``: how
    long the first wait waits for the change listener to subscribe.
    Use as ``async with RedisLimiter(...) as lim`` or call :meth:`aclose` to stop the listener.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        key_prefix: str = "irbench:lim",
        timing: RateTiming = RateTiming(),
        max_block_s: float = 5.0,
        listener_ready_timeout_s: float = 2.0,
    ) -> None:
        if max_block_s <= 0:
            raise LimiterError("max_block_s must be > 0 seconds")
        self._cfg = timing
        self._client = client
        self._prefix = key_prefix
        self._ttl_s = timing.lease_ttl_s
        self._max_block_s = max_block_s
        self._ready_timeout_s = listener_ready_timeout_s
        self._scripts = _load_scripts(client)
        self._chan_head = f"{key_prefix}:chg:"
        self._waiters = Waiters()
        self._listener: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    # ----- keys and errors -------------------------------------------------------------------
    def _keys(self, model: str) -> list[str]:
        return _keys(self._prefix, model)

    def state_key(self, model: str) -> str:
        """The model's state HASH (field ``cool``: cooldown end, us on Redis's clock)."""
        return self._keys(model)[1]

    def _channel(self, model: str) -> str:
        return self._chan_head + model

    async def _run(self, what: str, coro: Any) -> Any:
        try:
            return await coro
        except (RedisError, OSError) as e:
            raise _translate(e, _where(self._client), what) from e

    # ----- one decision or release run by another script or client ------------------------------
    def acquire_call(self, model: str, limits: ModelLimits, holder: str, cost_tokens: int) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of one reserving ``acquire.lua`` decision, for a caller that runs the
        script itself (``workers.state.claim_permit``: inside the run's claim). Read its reply
        with :meth:`decision`."""
        return (_acquire_keys(self._prefix, model, holder),
                _acquire_args(limits, holder, cost_tokens, self._cfg, reserve=True))

    @staticmethod
    def decision(reply: list[Any], model: str, holder: str, cost_tokens: int,
                 granted_mono_s: float | None = None) -> LimitDecision:
        """The ``acquire.lua`` reply as a :class:`LimitDecision` (raises ``ModelDisabled``);
        ``granted_mono_s``: the granted permit's (see ``Permit``)."""
        return _decision(reply, model, holder, cost_tokens, granted_mono_s)

    def release_call(self, permit: Permit, actual_tokens: int | None = None) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of the ``release.lua`` call :meth:`release` makes (for a sync client)."""
        wake_window_s = max(2 * self._max_block_s, 1.0)
        return self._keys(permit.model), _release_args(permit, actual_tokens, self._channel(permit.model), wake_window_s)

    # ----- decisions ---------------------------------------------------------------------------
    async def try_acquire(
        self, model: str, limits: ModelLimits, holder: str, cost_tokens: int, *, reserve: bool = False
    ) -> LimitDecision:
        """One atomic check on Redis's clock: grant now, or say how long to wait and why.
        ``reserve``: a rate denial reserves the holder's next slot (see ``MemoryLimiter``)."""
        args = _acquire_args(limits, holder, cost_tokens, self._cfg, reserve)
        keys = _acquire_keys(self._prefix, model, holder)
        res = await self._run(f"deciding for model {model!r}", self._scripts["acquire"](keys=keys, args=args))
        return _decision(res, model, holder, cost_tokens)

    async def acquire(
        self, model: str, limits: ModelLimits, holder: str, cost_tokens: int, *, max_wait_s: float | None = None
    ) -> Lease:
        """Wait (without spinning) until granted; ``waited_ms`` is measured on Redis's clock.

        A rate denial reserves the holder's slot, so waiters are served in order. ``max_wait_s``:
        raise :class:`WaitBudgetExceeded` instead of waiting past it (the reservation stays).
        """
        await self._ensure_listener()
        started: float | None = None
        while True:
            waiter = self._waiters.register(model)  # before deciding: no lost wake-up
            try:
                asked_at = time.monotonic()  # the grant happens after this: the grant-to-send delay's origin
                d = await self.try_acquire(model, limits, holder, cost_tokens, reserve=True)
                started = d.now_s if started is None else started
                if d.permit is not None:
                    return replace(d.permit, waited_ms=(d.now_s - started) * 1000.0, granted_mono_s=asked_at)
                waited_s = d.now_s - started
                if over_budget(d, waited_s, max_wait_s):
                    raise WaitBudgetExceeded(model, d)
                wait_s = min(d.wait_s, self._max_block_s)
                if max_wait_s is not None:
                    wait_s = min(wait_s, max_wait_s - waited_s)
                if d.reason != CONCURRENCY:
                    waiter.for_lease = False  # a release cannot help it; a cooldown or disable still wakes it
                    wait_s = max(wait_s, 0.0005)  # TAT rounding to whole us must not cause a re-check storm
                try:
                    await asyncio.wait_for(waiter.woken, timeout=wait_s)
                except asyncio.TimeoutError:
                    pass
            finally:
                self._waiters.drop(model, waiter)

    async def release(self, permit: Permit, actual_tokens: int | None = None) -> bool:
        """Free the lease, settle tokens, wake waiters. False if the lease had already expired."""
        # a waiter re-checks at least every max_block_s, re-stamping its denial: 2x that is recent
        keys, args = self.release_call(permit, actual_tokens)
        removed, _ = await self._run(
            f"releasing {permit.holder!r} on {permit.model!r}", self._scripts["release"](keys=keys, args=args)
        )
        return int(removed) == 1

    async def renew(self, permit: Permit) -> bool:
        """Extend a live lease by ``lease_ttl_s`` (call every TTL/3 during long calls); False = lost."""
        res = await self._run(
            f"renewing {permit.holder!r} on {permit.model!r}",
            self._scripts["renew"](keys=self._keys(permit.model)[:1], args=[permit.holder, self._ttl_s * _US]),
        )
        return int(res) == 1

    async def cooldown(self, model: str, seconds: float) -> None:
        """No permits for ``model`` for ``seconds`` on Redis's clock, across all workers."""
        await self._run(
            f"setting a cooldown on {model!r}",
            self._scripts["cooldown"](keys=self._keys(model)[1:], args=[max(seconds, 0.0) * _US, self._channel(model)]),
        )

    async def disable(self, model: str, reason: str) -> None:
        """Stop all further calls to ``model`` (e.g. HTTP 410); waiting acquirers raise too."""
        pipe = self._client.pipeline(transaction=True)
        pipe.hset(self._keys(model)[1], "disabled", reason or "disabled")
        pipe.publish(self._channel(model), "disabled")
        await self._run(f"disabling {model!r}", pipe.execute())

    async def enable(self, model: str) -> None:
        await self._run(f"enabling {model!r}", self._client.hdel(self._keys(model)[1], "disabled"))

    async def disabled_reason(self, model: str) -> str | None:
        r = await self._run(f"reading {model!r}", self._client.hget(self._keys(model)[1], "disabled"))
        return None if r is None else _text(r)

    async def is_disabled(self, model: str) -> bool:
        return await self.disabled_reason(model) is not None

    async def outstanding(self, model: str) -> int:
        """Number of live leases for ``model`` on Redis's clock."""
        n = await self._run(f"counting leases of {model!r}", self._scripts["outstanding"](keys=self._keys(model)[:1], args=[]))
        return int(n)

    # ----- change notifications ----------------------------------------------------------------
    async def _ensure_listener(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._listen(), name=f"limiter-listener:{self._prefix}")
        if not self._ready.is_set():
            # If Redis is down the decision itself reports it; waits stay bounded by max_block_s.
            try:
                await asyncio.wait_for(self._ready.wait(), timeout=self._ready_timeout_s)
            except asyncio.TimeoutError:
                pass

    def _wake(self, model: str | None, change: str = "") -> None:
        """A change message for ``model`` (None: any model, e.g. after a reconnect)."""
        if model is not None and change == "release":
            self._waiters.lease_freed(model)
        else:
            self._waiters.wake_all(model)

    async def _listen(self) -> None:
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self._chan_head) + "*"
        backoff_s = 0.05
        while True:
            ps = self._client.pubsub()
            try:
                await ps.psubscribe(pattern)
                while True:
                    msg = await ps.get_message(timeout=None)
                    if msg is None:
                        continue
                    if msg["type"] == "psubscribe":
                        self._ready.set()
                        self._wake(None)  # messages may have been missed while (re)connecting
                        backoff_s = 0.05
                    elif msg["type"] == "pmessage":
                        self._wake(_text(msg["channel"])[len(self._chan_head) :], _text(msg["data"]))
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError):
                self._ready.clear()
                self._wake(None)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, self._max_block_s)
            finally:
                try:
                    await ps.aclose()
                except (RedisError, OSError):
                    pass

    async def aclose(self) -> None:
        """Stop the listener (the client stays open: the caller owns it)."""
        if self._listener is not None:
            self._listener.cancel()
            try:
                await self._listener
            except (asyncio.CancelledError, RedisError, OSError):
                pass
            self._listener = None

    async def __aenter__(self) -> RedisLimiter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
