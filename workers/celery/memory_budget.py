"""How many calls a worker process keeps in flight within its memory budget.

A worker's calls are coroutines on one event loop (``workers.celery.runtime``), so what bounds
them is memory, not threads: a worker takes ``BASE_MIB`` before its first call (interpreter,
Celery, pyarrow, its loop and Redis clients) and about ``CALL_KIB`` more per call in flight
(the run's task and coroutine, its one-connection aiohttp client with its socket and buffers,
the request and a typical answer, its claim and permit bookkeeping). Both figures are measured
by ``bench/slow_endpoints.py`` (idle RSS after a warm-up; peak RSS over calls in flight), with
a margin above them.

A budget counts typical answers. Each answer is still bounded by its model's
``max_response_bytes`` (8 MiB by default), so the worst case, every call in flight answering
at that bound at once, is that many bytes per call more: the default budget leaves room
below 1 GiB for some of them, not for all.
"""

from __future__ import annotations

from workers.errors import ConfigError

#: RSS of an idle worker process after its first campaign (bench/slow_endpoints.py: 149 MiB).
BASE_MIB = 160
#: RSS one call in flight adds (bench/slow_endpoints.py measures it; see the module docstring).
CALL_KIB = 256
#: The default budget of a worker process: BASE_MIB plus 2,432 calls of CALL_KIB, with 256 MiB
#: left below 1 GiB for answers larger than typical.
DEFAULT_MEMORY_BUDGET_MIB = 768


def calls_within(budget_mib: int) -> int:
    """Calls in flight a worker process of ``budget_mib`` MiB holds: what is left after
    ``BASE_MIB``, over ``CALL_KIB`` each. Raises ``ConfigError`` when not even one fits."""
    calls = (budget_mib - BASE_MIB) * 1024 // CALL_KIB
    if calls < 1:
        raise ConfigError(f"a memory budget of {budget_mib} MiB holds no call: a worker takes {BASE_MIB} MiB "
                          f"before its first call and about {CALL_KIB} KiB per call in flight "
                          f"(IRBENCH_MEMORY_BUDGET_MIB, irbench worker --memory-budget)")
    return calls
