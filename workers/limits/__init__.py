"""Per-model limits: concurrency leases, GCRA requests/tokens per window (with a jitter allowance,
a grant log and slot reservations), cooldown, disable.

``MemoryLimiter`` (one process, injectable clock) and ``workers.state.redis_limiter.RedisLimiter``
(global, Redis clock) implement the same contract, checked by one shared test suite.
"""

from workers.errors import LimiterError, LimiterUnavailable, ModelDisabled, WaitBudgetExceeded
from workers.limits.base import Limiter, Permit
from workers.limits.memory import Lease, LimitDecision, MemoryLimiter

__all__ = [
    "Lease",
    "LimitDecision",
    "Limiter",
    "LimiterError",
    "LimiterUnavailable",
    "MemoryLimiter",
    "ModelDisabled",
    "Permit",
    "WaitBudgetExceeded",
]
