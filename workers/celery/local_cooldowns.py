"""Cooldowns this worker process already knows about, before Redis has them.

A run that meets a 429 records the cooldown in Redis (``RedisLimiter.cooldown``); until that
round trip lands (~20 ms under load when the script's first call meets NOSCRIPT, SCRIPT LOAD,
again), Redis still grants and admits permits, also to the other runs of the same process,
which can then send a call into a cooldown the process itself started (the 429-storm test
sees it on the wire). Noting the cooldown here first, synchronously, lets every run of the process see
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
