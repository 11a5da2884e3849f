"""Cooldowns this worker process already knows about, before Redis has them.

A run that meets a 429 records the cooldown in Redis (``RedisLimiter.cooldown``); until that
round trip lands, Redis still grants and admits permits, also to the other runs of the same
process. Measured in the 429-storm test at load ~9 (wire times, Redis MONITOR): the worker
read the 429, its cooldown reached Redis 20 ms later (the script's first call: NOSCRIPT,
SCRIPT LOAD, again), and meanwhile another run of the same process was granted, admitted, and
sent its request 28 ms after Redis had the cooldown: a call into a cooldown the process itself
had started. Noting the cooldown here first, synchronously, lets every run of the process see
it at once (``DeferringLimiter`` checks it before asking Redis and after the admission check).

One instance per worker process (``WorkerRuntime.cooldowns``); times on this process's
monotonic clock. Redis stays the authority across processes: a note ends no later than the
Redis cooldown it precedes (it starts earlier, with the same length).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class LocalCooldowns:
    """``note(model, s)``: no call to ``model`` from this process for ``s`` seconds from now;
    ``remaining_s(model)``: how long the longest noted cooldown still has to go (0 if none)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()  # the event loop notes, task threads may read

    def note(self, model: str, seconds: float) -> None:
        until = self._clock() + max(seconds, 0.0)
        with self._lock:
            if until > self._until.get(model, 0.0):  # never shortens one already noted
                self._until[model] = until

    def remaining_s(self, model: str) -> float:
        now = self._clock()
        with self._lock:
            until = self._until.get(model)
            if until is not None and until <= now:
                del self._until[model]  # ended: keep the map as small as the live cooldowns
                return 0.0
        return 0.0 if until is None else until - now
