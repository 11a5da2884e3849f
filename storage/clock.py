"""The wall clock every layer reads: timezone-aware UTC instants (the store keeps only UTC).

Functions that stamp times take a ``now: WallClock = utc_now`` parameter, so tests inject a
fixed clock instead of patching; ``workers.clock.SystemClock`` (wall + monotonic + sleep) reads
its wall time here too.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

__all__ = ["WallClock", "utc_now"]

WallClock = Callable[[], dt.datetime]  # timezone-aware UTC now


def utc_now() -> dt.datetime:
    """Now, as a timezone-aware UTC datetime."""
    return dt.datetime.now(dt.UTC)
