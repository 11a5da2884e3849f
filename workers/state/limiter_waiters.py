"""``Waiters``: a process's limiter waiters per model, woken one per freed lease.

A release frees one lease. Waking every local waiter of the model on it would make each of them
run its acquire script again, and all but one lose: with 64 run slots, 4 workers and a model
capped at 4 calls, ~250 runs wait, and each release would cost ~60 script calls per worker. So a
``release`` message wakes the oldest waiter still waiting for a lease (FIFO), one per message per process; the first process to ask wins the
lease, the others' woken waiter waits again. Everything else — a cooldown, a disable, a
reconnect of the listener (messages may have been lost) — wakes every waiter of the model (or
of all models), as a rate or cooldown wait must re-check. A waiter whose decision is still
under way counts as waiting for a lease, so a release in that window is never lost: it
re-checks at once. Waits stay bounded by the limiter's ``max_block_s`` whatever is published.

Use from one event loop only.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field


@dataclass
class Waiter:
    """One registered wait: ``woken`` completes when it should re-check. ``for_lease``: whether
    it waits for a lease (a concurrency denial; True until its decision says otherwise)."""

    woken: asyncio.Future[None]
    for_lease: bool = True
    key: int = 0


@dataclass
class Waiters:
    """Waiters per model, in arrival order."""

    _by_model: dict[str, dict[int, Waiter]] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=itertools.count)

    def register(self, model: str) -> Waiter:
        """A new waiter of ``model``; register before deciding, so no wake-up is lost."""
        w = Waiter(asyncio.get_running_loop().create_future(), key=next(self._ids))
        self._by_model.setdefault(model, {})[w.key] = w
        return w

    def drop(self, model: str, waiter: Waiter) -> None:
        """Forget ``waiter`` (granted, timed out, cancelled)."""
        waiters = self._by_model.get(model)
        if waiters is not None:
            waiters.pop(waiter.key, None)
            if not waiters:
                del self._by_model[model]

    def lease_freed(self, model: str) -> bool:
        """Wake the oldest waiter of ``model`` waiting for a lease; whether there was one."""
        waiters = self._by_model.get(model)
        if not waiters:
            return False
        for key, w in waiters.items():
            if w.for_lease and not w.woken.done():
                del waiters[key]
                w.woken.set_result(None)
                return True
        return False

    def wake_all(self, model: str | None) -> int:
        """Wake every waiter of ``model`` (None: of every model); how many were woken."""
        models = list(self._by_model) if model is None else [model]
        n = 0
        for m in models:
            for w in self._by_model.pop(m, {}).values():
                if not w.woken.done():
                    w.woken.set_result(None)
                    n += 1
        return n

    def count(self, model: str) -> int:
        """Waiters of ``model`` not woken yet (tests, benchmarks)."""
        return sum(1 for w in self._by_model.get(model, {}).values() if not w.woken.done())
