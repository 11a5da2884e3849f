"""``RunSlots``: how many runs a worker process executes at once, whatever the messages carry.

A broker message may carry several runs (the orchestrator's ``runs_per_message``), and a
worker's threads each hold one message, so without a bound a worker with 8 threads and 16 runs
per message would call endpoints 128 times at once. Every run takes a slot before its first
permit and gives it back when its call is over; a run without a slot waits on the worker's
event loop, its claim held (and renewed by the heartbeat), so the reconciler sees it in live
hands.

The task thread that claims a message asks :meth:`take_now` how many slots are free right now:
those runs get their first permit with the claim (one round trip, ``claim_permit``) and start at
once; the rest are claimed without one and wait for a slot in :meth:`wait`. Slots are handed to
waiters first (first come, first served), so a burst of new messages cannot starve waiting runs.
"""

from __future__ import annotations

import asyncio
import collections
import threading


class RunSlots:
    """A counting semaphore shared by task threads (:meth:`take_now`) and one event loop
    (:meth:`wait`, :meth:`give_back`). ``size``: runs executing at once in this process."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a worker needs at least one run slot, got {size}")
        self.size = size
        self._free = size
        self._lock = threading.Lock()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def free(self) -> int:
        return self._free

    def take_now(self, wanted: int) -> int:
        """Take up to ``wanted`` free slots without waiting (any thread); returns how many.
        None while runs are waiting: they are served first."""
        with self._lock:
            if self._waiters:
                return 0
            got = min(wanted, self._free)
            self._free -= got
            return got

    async def wait(self) -> None:
        """Take one slot, waiting on the loop until one is given back."""
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            with self._lock:
                if waiter.done() and not waiter.cancelled():
                    self._hand_on()  # it was handed a slot just before the cancel: pass it on
                else:
                    self._waiters.remove(waiter)
            raise

    def give_back(self) -> None:
        """Return one slot (on the loop): to the oldest waiter, else to the free count."""
        with self._lock:
            self._hand_on()

    def _hand_on(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1
