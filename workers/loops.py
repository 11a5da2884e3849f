"""The event loop irbench runs its calls on: uvloop's where it is installed, else asyncio's.

uvloop's transports and scheduling cost less CPU per call than asyncio's selector loop (0.1-0.3
ms per run in one paired measurement; bench/local_throughput.py measures this),
and on two shared cores CPU per run is the throughput. Both executors use it: the local one for
``irbench run``, a Celery worker for the loop its task threads hand their runs to.
"""

from __future__ import annotations

import asyncio


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new uvloop event loop, or asyncio's default one where uvloop is missing (Windows)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
