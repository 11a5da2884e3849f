"""Time as an injected dependency, so tests control it without patching."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Protocol

from storage.clock import utc_now


class Clock(Protocol):
    def now(self) -> dt.datetime:
        """Current UTC wall-clock time (timestamps and partition dates)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a monotonic clock (durations)."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> dt.datetime:
        return utc_now()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
