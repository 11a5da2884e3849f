"""CLI options of the distributed executor and workers (``irbench run``/``irbench worker``).

Each knob is also an environment variable (named in the help); a flag wins over the variable.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Optional

import typer

from orchestrator.distributed.options import CeleryOptions

ClaimTtlOpt = Annotated[Optional[float], typer.Option(
    "--claim-ttl-s", help="Run claim lifetime without a heartbeat; a dead worker's runs go again after it "
    "(env IRBENCH_CLAIM_TTL_S, default 30). Give workers and orchestrator the same value.")]
ReconcileOpt = Annotated[Optional[float], typer.Option(
    "--reconcile-interval-s", help="How often the orchestrator looks for lost runs (env "
    "IRBENCH_RECONCILE_INTERVAL_S, default 5).")]
MaxFailuresOpt = Annotated[Optional[int], typer.Option(
    "--max-task-failures", help="Task failures / worker deaths after which a run is stored as worker_error "
    "(env IRBENCH_MAX_TASK_FAILURES, default 3).")]
RunsPerMessageOpt = Annotated[Optional[int], typer.Option(
    "--runs-per-message", help="Runs carried by one broker message; a worker runs them concurrently in its run "
    "slots (env IRBENCH_RUNS_PER_MESSAGE, default 0: auto, sized to the live workers' threads and the outstanding "
    "window, 1-64). Bigger divides the broker's per-run cost; a re-sent run goes alone.")]
RunSlotsOpt = Annotated[Optional[int], typer.Option(
    "--run-slots", help="Calls this worker keeps in flight at most, whatever the messages carry, instead of what "
    "--memory-budget holds; a SIGKILL loses at most this many answered calls (env IRBENCH_RUN_SLOTS, default 0: "
    "what the memory budget holds).")]
MemoryBudgetOpt = Annotated[Optional[int], typer.Option(
    "--memory-budget", "--memory-budget-mib", help="MiB this worker process is sized to: it keeps as many calls in "
    "flight as that holds (about 256 KiB each over a 160 MiB base; the models' max_concurrency and rate limits still "
    "bound each endpoint) and claims no more at its budget (env IRBENCH_MEMORY_BUDGET_MIB, default 768).")]
CpuPolicyOpt = Annotated[Optional[str], typer.Option(
    "--cpu-policy", help="How the kernel schedules this worker: batch (SCHED_BATCH: woken threads do not preempt "
    "others; more runs/s when workers share few cores) or normal (env IRBENCH_CPU_POLICY, default batch).")]
VisibilityOpt = Annotated[Optional[float], typer.Option(
    "--visibility-timeout-s", help="The broker redelivers a message left unacknowledged this long (env "
    "IRBENCH_VISIBILITY_TIMEOUT_S, default 10800). It must exceed a message's longest run time: attempts x "
    "total timeout + backoffs, times --runs-per-message. Give workers and orchestrator the same value.")]
LeaseTtlOpt = Annotated[Optional[float], typer.Option(
    "--lease-ttl-s", help="Limiter lease lifetime without a heartbeat (env IRBENCH_LEASE_TTL_S, default 30).")]
SpoolRowsOpt = Annotated[Optional[int], typer.Option(
    "--spool-max-rows", help="Records per published Parquet file at most (env IRBENCH_SPOOL_MAX_ROWS, default 2000).")]
SpoolAgeOpt = Annotated[Optional[float], typer.Option(
    "--spool-max-age-s", help="Publish the spool's file at least this often while busy (env "
    "IRBENCH_SPOOL_MAX_AGE_S, default 5).")]


def celery_options(analyze: bool, claim_ttl_s: float | None, reconcile_interval_s: float | None,
                   max_task_failures: int | None, runs_per_message: int | None = None,
                   visibility_timeout_s: float | None = None) -> CeleryOptions:
    """Defaults, then the environment, then the flags given."""
    return CeleryOptions(analyze_on_complete=analyze).with_env().with_values(
        claim_ttl_s=claim_ttl_s, reconcile_interval_s=reconcile_interval_s, max_task_failures=max_task_failures,
        runs_per_message=runs_per_message, visibility_timeout_s=visibility_timeout_s)


def worker_settings(broker_url: str, **flags: float | int | str | None):
    """The worker's settings: ``IRBENCH_*`` environment, then the flags given."""
    from workers.celery.runtime import WorkerSettings

    given: dict[str, Any] = {k: v for k, v in flags.items() if v is not None}
    return replace(WorkerSettings.from_env(broker_url), **given)
