"""How the kernel schedules a worker process: ``batch`` (Linux ``SCHED_BATCH``) or ``normal``.

A worker is a throughput job: an event loop woken by every reply, a few helper threads, and on a
small machine several of them next to the simulator or model server, Redis and the orchestrator.
Under the default policy each wake-up may preempt whatever runs, so four workers on two cores
switch ~6 times per run (the local executor 0.3) and spend 0.94-1.16 ms of CPU on a run that
one or two workers do in 0.68 ms. ``SCHED_BATCH`` tells the scheduler the process is not
interactive: a woken worker thread waits for the running one's slice instead of preempting it.
Same nice level, same share of the CPU; with 4 workers it halves the switches per run and
gives 0.45x instead of 0.39x the local executor's runs/s at 64 runs per message
(bench/distributed_throughput.py measures this). The cost: a reply may wait
up to one scheduler slice (a few ms) longer before its worker notices it *when the machine is
saturated*; measure latency-sensitive things (first-token times on a fast local server) with
``normal``, which leaves the process as it was started (e.g. under ``chrt``).
"""

from __future__ import annotations

import os

__all__ = ["POLICIES", "apply_cpu_policy", "current_policy"]

POLICIES = ("batch", "normal")


def _tids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # no procfs: this thread only
        return [0]


def apply_cpu_policy(policy: str) -> bool:
    """``batch``: put every thread of this process under ``SCHED_BATCH`` (threads started later
    inherit it from the thread that starts them). ``normal``: change nothing. Returns whether
    anything changed (False for ``normal``, and where the platform has no ``SCHED_BATCH``).
    Raises ValueError for an unknown policy."""
    if policy not in POLICIES:
        raise ValueError(f"unknown CPU policy {policy!r}: use one of {', '.join(POLICIES)}")
    if policy == "normal" or not hasattr(os, "SCHED_BATCH"):
        return False
    for tid in _tids():
        try:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
        except (ProcessLookupError, PermissionError):  # ended meanwhile / an administrator's real-time thread
            continue
    return True


def current_policy(tid: int = 0) -> str:
    """``batch``, ``normal`` or ``other`` for thread ``tid`` (0: the calling thread)."""
    policy = os.sched_getscheduler(tid)
    if policy == getattr(os, "SCHED_BATCH", None):
        return "batch"
    return "normal" if policy == os.SCHED_OTHER else "other"
