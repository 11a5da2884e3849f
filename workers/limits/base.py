"""The limiter interface shared by the in-memory and the Redis implementations.

Per model: a concurrency cap (leases that expire), requests per minute and tokens per minute
(cost = estimated prompt tokens + max_tokens, refunded to actual usage on release), and a
cooldown set by a 429's Retry-After. ``acquire`` waits without spinning and without touching the
retry budget; waiting on one model never blocks another model's work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from workers.runtask import ModelLimits


@dataclass(frozen=True)
class Permit:
    """A granted lease. ``granted_mono_s``: this process's monotonic clock just before the call
    that granted it (None when the grant is in-process); the grant-to-send delay is measured
    from it (a permit that waited too long to be used is given back, see the Redis adapter)."""

    model: str
    holder: str
    cost_tokens: int
    waited_ms: float = 0.0
    granted_mono_s: float | None = None


class Limiter(Protocol):
    async def acquire(self, model: str, limits: ModelLimits, holder: str, cost_tokens: int) -> Permit:
        """Block (asynchronously) until the model may be called; return the lease."""
        ...

    async def release(self, permit: Permit, actual_tokens: int | None = None) -> object:
        """Free the concurrency slot; refund ``cost_tokens - actual_tokens`` to the token budget.
        Callers ignore the result (some limiters say whether the lease was still held)."""
        ...

    async def cooldown(self, model: str, seconds: float) -> None:
        """No new permits for ``model`` for ``seconds`` (every worker)."""
        ...


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
    ``reserved_at_s``: the slot (limiter clock) the holder has reserved, if any; when set, coming
    back at ``now_s + wait_s`` is granted without a second rate charge.
    """

    permit: Lease | None
    wait_s: float
    reason: str
    now_s: float
    reserved_at_s: float | None = None
