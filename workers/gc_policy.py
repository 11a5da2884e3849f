"""The garbage collector of a long-running worker process.

A worker allocates hundreds of short-lived objects per run (requests, replies, records), so
Python's collector runs often, and each run of it walks what is alive: in a Celery worker that
is mostly what the imports left (Celery, kombu, pydantic's schemas, aiohttp), tens of thousands
of objects that live as long as the process. Freezing the start-up heap and collecting the
young generation every 10,000 allocations instead of 700 takes the collector from ~13 % of a
worker's CPU on the zero-latency simulator to under 1 %, and the run path's CPU down by ~15 %
(``bench/worker_path.py --gc 0,10000`` measures this). In the local executor the collector's
cost grows with the runs in flight (it makes 64 coroutines slower than 16 untuned); tuned, 64
is as fast as 16 (bench/local_throughput.py measures this).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["tune_collector", "tuned_collector"]


def tune_collector(young_threshold: int) -> bool:
    """Collect once, freeze every object alive now (never walked again; they live as long as the
    process anyway) and collect the young generation every ``young_threshold`` net allocations
    (older generations every 20 and 10 of those). ``young_threshold`` 0 leaves the collector
    as it is. Returns whether anything changed."""
    if young_threshold <= 0:
        return False
    gc.collect()  # what is garbage now would otherwise be frozen for good
    gc.freeze()
    gc.set_threshold(young_threshold, 20, 10)
    return True


@contextlib.contextmanager
def tuned_collector(young_threshold: int) -> Iterator[None]:
    """:func:`tune_collector` for the duration of a ``with`` block (one long execution in a
    process that may do other things after it): on exit the thresholds are put back and the
    frozen objects thawed, unless something had frozen objects before. Entering costs one full
    collection (15-20 ms with irbench's imports on these machines)."""
    old, frozen_before = gc.get_threshold(), gc.get_freeze_count()
    changed = tune_collector(young_threshold)
    try:
        yield
    finally:
        if changed:
            gc.set_threshold(*old)
            if frozen_before == 0:
                gc.unfreeze()
