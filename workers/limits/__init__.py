"""Per-model limits: concurrency leases, GCRA requests/tokens per window (with a jitter allowance,
a grant log and slot reservations), cooldown, disable.

``MemoryLimiter`` (one process, injectable clock) and ``workers.state.redis_limiter.RedisLimiter``
(global, Redis clock) implement the same contract, take the same ``RateTiming`` and are checked by one shared test suite. Their errors
live in ``workers.errors``.
"""

from workers.limits.base import Lease, LimitDecision, Limiter, Permit
from workers.limits.memory import MemoryLimiter, RateTiming

__all__ = [
    "Lease",
    "LimitDecision",
    "Limiter",
    "MemoryLimiter",
    "Permit",
    "RateTiming",
]
