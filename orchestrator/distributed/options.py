"""Knobs of the distributed executor; each settable by env var (and by ``irbench run`` flags)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from workers.celery import DEFAULT_QUEUE
from workers.errors import ConfigError

#: field -> environment variable. Workers read the same names for their side of a knob
#: (``IRBENCH_CLAIM_TTL_S`` is the claim lifetime on the workers and the grace the reconciler
#: gives a queued or running run here), so one setting in the environment covers both.
ENV_VARS = {
    "claim_ttl_s": "IRBENCH_CLAIM_TTL_S",
    "reconcile_interval_s": "IRBENCH_RECONCILE_INTERVAL_S",
    "max_task_failures": "IRBENCH_MAX_TASK_FAILURES",
    "max_outstanding": "IRBENCH_MAX_OUTSTANDING",
    "poll_interval_s": "IRBENCH_POLL_INTERVAL_S",
    "verify_grace_s": "IRBENCH_VERIFY_GRACE_S",
    "runs_per_message": "IRBENCH_RUNS_PER_MESSAGE",
    "visibility_timeout_s": "IRBENCH_VISIBILITY_TIMEOUT_S",
    "gc_young_threshold": "IRBENCH_GC_YOUNG_THRESHOLD",
}


#: the auto window's floor (runs queued or executing)
AUTO_WINDOW_RUNS = 2000
#: the auto window over the calls the campaign's models allow at once
WINDOW_PER_CALL = 3


def window_runs(max_outstanding: int, allowed_calls: int | None) -> int:
    """Runs that may be queued or executing at once: ``max_outstanding`` when set (> 0); for
    auto (0), ``AUTO_WINDOW_RUNS`` or ``WINDOW_PER_CALL`` x ``allowed_calls`` (the sum of the
    models' ``max_concurrency``; None when a model has none), whichever is more."""
    if max_outstanding > 0:
        return max_outstanding
    return max(AUTO_WINDOW_RUNS, WINDOW_PER_CALL * (allowed_calls or 0))


@dataclass(frozen=True)
class CeleryOptions:
    """``max_outstanding``: runs queued in the broker or executing at most (bounds broker memory
    and the reconciler's broker listing; messages carry the prompt). Default 0, auto
    (:func:`window_runs`): ``AUTO_WINDOW_RUNS``, or three times the calls the campaign's models
    allow at once when that is more, so the workers hold runs of every model beyond its
    permits and a freed permit finds a run waiting (bench/slow_endpoints.py measures it). ``dispatch_batch``:
    messages per producer round. ``claim_ttl_s``: the workers' claim TTL: a running run whose
    claim expired, or a queued run the broker has lost for this long, is re-sent (so
    recovery after a worker SIGKILL or a Redis restart takes ~claim TTL + reconcile interval).
    ``reconcile_interval_s``: how often the reconciler looks (and the store cursor reads the
    files published since its last look, so the check at the end reads only the last ones). ``max_task_failures``: task
    failures or worker deaths after which a run is stored as ``worker_error`` (poison run).
    ``poll_interval_s``: the loop's sleep. ``verify_grace_s``: how long a run marked done may
    take to appear in the store (spool publication, a killed worker's spool) before it is
    considered lost and sent again. ``queue``: the Celery queue workers consume (``-Q``).
    ``runs_per_message``: runs carried by one broker message (``irbench.runs``), taken in
    dispatch order (models interleaved); the worker runs them concurrently in its run slots and
    acknowledges the message after the last. kombu's per-message cost (delivery bookkeeping,
    late ack) and the claim, fsync and done round trips are then shared: on the zero-latency
    simulator 16 runs per message give 1.8x the runs/s of 1 (bench/distributed_throughput.py measures this).
    Default 0, auto (``orchestrator.distributed.message_size``): the outstanding window (or the runs left)
    over twice the live workers' threads, between 1 and 64, so every worker thread holds a
    message and as many wait in the broker for whichever worker is free first. A fixed value
    is for measuring; 1 gives the shortest tail when calls take minutes. Re-sent runs and runs
    with a countdown travel alone. ``visibility_timeout_s``: the broker's redelivery horizon of an
    unacknowledged message; it must cover a whole message (``workers.celery.app``), and workers
    read the same variable; a redelivery inside it is harmless anyway. ``gc_young_threshold``:
    while the campaign runs, the orchestrator's heap (what the imports and the start left) is frozen and
    its young generation collected every this many allocations (``workers.gc_policy``, as the
    workers do; 0 leaves the collector alone).
    """

    max_outstanding: int = 0  # 0: auto (window_runs)
    dispatch_batch: int = 100
    claim_ttl_s: float = 30.0
    reconcile_interval_s: float = 5.0
    max_task_failures: int = 3
    poll_interval_s: float = 0.25
    verify_grace_s: float = 20.0
    queue: str = DEFAULT_QUEUE
    redis_backoff_max_s: float = 5.0
    honour_availability: bool = True  # skip models the availability dataset says are gone
    analyze_on_complete: bool = True  # enqueue the campaign's analysis when every run is stored
    runs_per_message: int = 0  # 0: auto (orchestrator.distributed.message_size); see the docstring
    visibility_timeout_s: float = 10800.0
    gc_young_threshold: int = 10000

    def __post_init__(self) -> None:
        for name in ("claim_ttl_s", "reconcile_interval_s", "poll_interval_s", "verify_grace_s", "visibility_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0 s, got {getattr(self, name)}")
        if min(self.max_task_failures, self.dispatch_batch) < 1:
            raise ConfigError("max_task_failures and dispatch_batch must be >= 1")
        if self.max_outstanding < 0:
            raise ConfigError(f"IRBENCH_MAX_OUTSTANDING / --max-outstanding must be >= 1, or 0 for auto "
                              f"(sized to the calls the models allow), got {self.max_outstanding}")
        if self.runs_per_message < 0:
            raise ConfigError(f"IRBENCH_RUNS_PER_MESSAGE / --runs-per-message must be >= 1, or 0 for auto "
                              f"(sized to the live workers), got {self.runs_per_message}")
        if self.gc_young_threshold < 0:
            raise ConfigError(f"IRBENCH_GC_YOUNG_THRESHOLD must be >= 0 (0: Python's default), got {self.gc_young_threshold}")

    def with_env(self, environ: Mapping[str, str] | None = None) -> CeleryOptions:
        """These options with every knob set in the environment (``ENV_VARS``) applied."""
        env = os.environ if environ is None else environ
        types = {f.name: f.type for f in fields(self)}
        values: dict[str, Any] = {}
        for name, var in ENV_VARS.items():
            raw = env.get(var)
            if raw in (None, ""):
                continue
            try:
                values[name] = int(raw) if types[name] in ("int", int) else float(raw)
            except ValueError:
                raise ConfigError(f"{var}={raw!r} is not a number") from None
        return replace(self, **values)

    def with_values(self, **values: Any) -> CeleryOptions:
        """These options with the given knobs (``None`` values ignored: a flag not given)."""
        return replace(self, **{k: v for k, v in values.items() if v is not None})
