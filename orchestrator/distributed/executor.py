"""Distributed execution: run a campaign's pending runs on Celery workers and see it finish.

``run_campaign_celery`` is the entry point (``irbench run --executor celery``): it builds the
injected bundle (Redis client, Celery app, store, clock) and drives an
``orchestrator.distributed.campaign.DistributedCampaign`` (dispatch, progress, completion,
reconcile, cancel; read its docstring for how each stays O(new work)). Restarting = calling it
again. Redis errors are retried with backoff, never fatal. Duplicated messages are harmless:
workers claim runs, and a run executed twice is stored as two executions (readers use the
latest, ``storage.runs.EXECUTION_RULE``).

Availability, as in the local executor: a model whose latest availability check found
it gone (``AvailabilityStore.unavailable_models``) is closed in the campaign's Redis gate, so a
worker holding one of its queued runs records it ``cancelled`` with the reason and makes no
call, and its never-dispatched runs are recorded ``cancelled`` here. A 410 a worker meets
during the campaign becomes an availability event (``source="campaign"``). When every run is
stored, the campaign's analysis is enqueued on the workers (``orchestrator.jobs.analysis``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow.compute as pc
import structlog
from celery import Celery

from orchestrator.campaign.plan import planned_models
from orchestrator.campaign.plan_state import stored_count
from orchestrator.campaign.status import CampaignStatus, campaign_status

from orchestrator.campaign.prepared import PreparedCampaign, record_campaign
from orchestrator.campaign.spend_cap import spend_plan
from orchestrator.distributed.bucket_follower import BucketFollower
from orchestrator.distributed.options import CeleryOptions
from orchestrator.distributed.campaign import Bundle, DistributedCampaign
from orchestrator.distributed.progress import CeleryModelProgress, CeleryProgressCallback, progress_from_counts
from orchestrator.local.executor import ExecutionSummary
from storage.availability import AvailabilityRecord, AvailabilityStore
from storage.objectstore.session import BucketSession
from storage.records import Outcome, RunRecord
from storage.runs import RunStore
from workers.celery.app import make_celery_app
from workers.state.campaign_state import CampaignState
from workers.state.published_objects import PublishedObjects
from workers.state.redis_retry import with_retry
from workers.state.connect import sync_redis
from workers.clock import SystemClock
from workers.execute import RunContext, execute_run
from workers.gate import MemoryGate
from workers.gc_policy import tuned_collector
from workers.limits.memory import MemoryLimiter
from workers.runtask import RunTask

if TYPE_CHECKING:
    from analysis.options import AnalysisOptions
    from orchestrator.jobs.analysis import AnalysisJob

__all__ = [
    "CeleryCampaignStatus", "CeleryModelProgress", "CeleryOptions", "campaign_status_celery",
    "cancel_campaign", "celery_execute", "run_campaign_celery",
]

log = structlog.get_logger("irbench.celery")


def _cancelled_records(tasks: Sequence[RunTask], reason: str, by_model: dict[str, str] | None = None) -> list[RunRecord]:
    """Records for runs never picked up by a worker: ``execute_run`` behind a closed gate (no call).

    ``reason`` closes every model; ``by_model`` (model -> reason) closes only those models
    (pass ``reason=""`` then)."""
    gate = MemoryGate()
    if reason:
        gate.cancel_all(reason)
    for model, why in (by_model or {}).items():
        gate.close(model, why)

    def no_provider(_: RunTask):  # never called: the gate is closed before the first attempt
        raise AssertionError("cancelled runs make no call")

    ctx = RunContext(provider_for=no_provider, limiter=MemoryLimiter(), gate=gate, clock=SystemClock())

    async def all_() -> list:
        return [await execute_run(t, ctx) for t in tasks]

    return asyncio.run(all_())


AVAILABILITY_MARK = "(availability check "


def _close_unavailable(state: CampaignState, store: RunStore, models: set[str]) -> dict[str, str]:
    """Close, in the campaign's Redis gate, every planned model the availability dataset lists
    as gone; reopen models an earlier call closed for that reason that are available again.
    Returns model -> reason of the models closed for availability."""
    gone = AvailabilityStore(store.root, fsync=False).unavailable_models()
    closed: dict[str, str] = {}
    current = state.flags.closed_models()
    for model in sorted(models):
        timeline = gone.get(model)
        if timeline is not None:
            reason = f"{timeline.latest_status.value} {AVAILABILITY_MARK}{timeline.latest_check})"
            state.flags.close(model, reason)
            closed[model] = current.get(model, reason)
        elif AVAILABILITY_MARK in current.get(model, ""):
            state.flags.open(model)  # found available again since
    if closed:
        log.info("models_closed_for_availability", campaign=state.campaign, models=closed)
    return closed


def _record_retirements(campaign: str, store: RunStore, seen: set[str]) -> int:
    """Write one availability event (``source="campaign"``) per stored run of ``campaign`` that
    met a 410 and is not in ``seen`` (updated). The file stem hashes the run ids, so a repeated
    call (restart) publishes nothing new; readers also dedupe by check id."""
    table = store.read_table(campaigns=[campaign], columns=["run_id", "model", "endpoint", "outcome", "measured_at",
                                                           "status_code", "retired_on"])
    rows = [r for r in table.filter(pc.equal(table.column("outcome"), Outcome.RETIRED.value)).to_pylist()
            if r["run_id"] not in seen]
    if not rows:
        return 0
    events = [
        AvailabilityRecord.from_campaign_410(
            campaign=campaign, endpoint=r["endpoint"], model=r["model"], measured_at=r["measured_at"],
            status_code=r["status_code"], retired_on=r["retired_on"],
        )
        for r in rows
    ]
    ids = sorted(r["run_id"] for r in rows)
    stem = "campaign-" + hashlib.sha256("\x00".join([campaign, *ids]).encode()).hexdigest()[:32]
    AvailabilityStore(store.root).write(events, stem=stem)
    seen.update(ids)
    log.info("retirements_recorded", campaign=campaign, models=sorted({r["model"] for r in rows}), runs=len(rows))
    return len(rows)


@dataclass(frozen=True)
class CeleryRun:
    """How one ``run_campaign_celery`` call runs: the knobs (``options``), how long it waits
    (``timeout_s``, None: until done), which stored runs go again (``retry_outcomes``), the
    callbacks (``on_progress``, ``on_analysis``), the analysis options for the enqueued analysis,
    a Celery ``app`` (None: one made for the broker URL), and for a bucket store the process's
    ``bucket`` session (``store`` is then its mirror)."""

    options: CeleryOptions = CeleryOptions()
    timeout_s: float | None = None
    retry_outcomes: frozenset[Outcome] = frozenset()
    on_progress: CeleryProgressCallback | None = None
    on_analysis: Callable[[AnalysisJob], None] | None = None
    analysis_options: AnalysisOptions | None = None
    app: Celery | None = None
    bucket: BucketSession | None = None


def run_campaign_celery(prepared: PreparedCampaign, store: RunStore, broker_url: str,
                        run_as: CeleryRun = CeleryRun()) -> ExecutionSummary:
    """Dispatch every planned run without a stored record and wait until each has one
    (``run_as``: the options, timeout, retried classes and callbacks, below).

    ``retry_outcomes`` (``--retry-failed``): also dispatch the runs whose latest execution ended
    in one of these classes (their Redis done markers are dropped), and wait for a newer execution.

    ``timeout_s``: give up waiting after this long (returns ``interrupted=True``; the workers
    carry on). The summary counts the runs stored during this call, per model and outcome.

    With ``options.analyze_on_complete`` (default) and every planned run stored, the campaign's
    analysis is enqueued on the workers (not awaited) into ``DATA/analysis/<campaign>/<UTC
    date>/`` with ``analysis_options`` (an ``AnalysisOptions``; default options, restricted to
    this campaign); ``on_analysis`` receives the ``orchestrator.jobs.analysis.AnalysisJob``.
    """
    campaign, options, timeout_s = prepared.spec.name, run_as.options, run_as.timeout_s
    record_campaign(prepared, store.root, fsync=store.dataset.fsync)
    app = run_as.app or make_celery_app(broker_url, visibility_timeout_s=options.visibility_timeout_s)
    client = sync_redis(broker_url)
    try:
        follow = BucketFollower(run_as.bucket, PublishedObjects(client, run_as.bucket.url)) if run_as.bucket else None
        bundle = Bundle(redis=client, broker=app, store=store, clock=time.monotonic, sleep=time.sleep,
                        store_url=run_as.bucket.url if run_as.bucket else None, follow_store=follow)
        budget = timeout_s
        state = CampaignState(client, campaign)
        plan = spend_plan(prepared.spec, prepared.wave.number, store)  # what the store holds: a resume starts there
        with_retry(lambda: state.spend.configure(plan), "writing the spend cap", budget_s=budget)
        models = set(planned_models(prepared.tasks))
        unavailable = (with_retry(lambda: _close_unavailable(state, store, models), "closing unavailable models",
                                  budget_s=budget) if options.honour_availability else {})
        run = DistributedCampaign(prepared, bundle, options, _cancelled_records, unavailable, run_as.on_progress,
                                  frozenset(o.value for o in run_as.retry_outcomes))
        with tuned_collector(options.gc_young_threshold):  # the windows' tasks die young: few collections
            summary = run.run(timeout_s)
        if any(p.outcomes.get(Outcome.RETIRED.value) for p in run.progress.values()):
            _record_retirements(campaign, store, set())  # reads the store: only when a 410 happened
    finally:
        client.close()
    if options.analyze_on_complete and not summary.interrupted:
        try:
            from orchestrator.jobs.analysis import enqueue_campaign_analysis

            job = enqueue_campaign_analysis(campaign, store.root, broker_url, options=run_as.analysis_options,
                                            app=app, queue=options.queue)
        except Exception as exc:
            log.warning("analysis_not_enqueued", campaign=campaign, error=f"{type(exc).__name__}: {exc}")
        else:
            if run_as.on_analysis is not None:
                run_as.on_analysis(job)
    return summary


@dataclass(frozen=True)
class CeleryCampaignStatus:
    """Store truth plus the live view from Redis."""

    stored: CampaignStatus
    progress: dict[str, CeleryModelProgress] = field(default_factory=dict)
    outstanding: int = 0  # dispatched, not yet done
    cancel_reason: str | None = None
    closed_models: dict[str, str] = field(default_factory=dict)  # model -> retired/disabled reason


def campaign_status_celery(
    prepared: PreparedCampaign, store: RunStore, broker_url: str, *, skip_corrupt: bool = False
) -> CeleryCampaignStatus:
    """Planned vs stored (store), and in-flight/outstanding/cancel/closed models (Redis)."""
    stored = campaign_status(prepared, store, skip_corrupt=skip_corrupt)
    client = sync_redis(broker_url)
    try:
        state = CampaignState(client, prepared.spec.name)
        planned = planned_models(prepared.tasks)
        progress = progress_from_counts(planned, state.done.counts(), state.claims.running_by_model(), {}, 0.0)
        closed = state.flags.closed_models()
        return CeleryCampaignStatus(stored, progress, state.outstanding(), state.flags.cancel_reason(), closed)
    finally:
        client.close()


def cancel_campaign(campaign_name: str, broker_url: str, reason: str = "cancelled by user") -> None:
    """Stop the campaign: workers record every run they pick up from now on as ``cancelled``
    (no call), and the orchestrator stops dispatching and records never-dispatched runs."""
    client = sync_redis(broker_url)
    try:
        CampaignState(client, campaign_name).flags.cancel(reason)
    finally:
        client.close()


def celery_execute(
    broker_url: str, *, options: CeleryOptions = CeleryOptions(analyze_on_complete=False),
    timeout_s: float | None = None, app: Celery | None = None,
) -> Callable[..., tuple[int, ExecutionSummary]]:
    """An executor with the signature of ``run_campaign_local`` — ``(prepared, store, secrets,
    on_progress=None) -> (skipped, summary)`` — that runs on the Celery workers (what
    ``orchestrator.jobs.probe.run_probe(execution=ProbeExecution(execute=...))`` takes). ``secrets`` are ignored: workers read
    the keys from their own environment. ``skipped`` = planned runs already stored before.
    ``timeout_s`` and ``app`` go to :func:`run_campaign_celery`."""

    def execute(prepared: PreparedCampaign, store: RunStore, secrets: object = None,
                on_progress: CeleryProgressCallback | None = None,
                retry_outcomes: frozenset[Outcome] = frozenset()) -> tuple[int, ExecutionSummary]:
        from orchestrator.campaign.retry import retryable

        skipped = stored_count(prepared.tasks, store)
        if retry_outcomes:
            skipped -= retryable(prepared, store, retry_outcomes).total
        summary = run_campaign_celery(prepared, store, broker_url,
                                      CeleryRun(options=options, timeout_s=timeout_s, retry_outcomes=retry_outcomes,
                                                on_progress=on_progress, app=app))
        return skipped, summary

    return execute
