"""Distributed execution: dispatch a campaign's pending runs to Celery workers and see it finish.

``run_campaign_celery`` computes pending = planned − stored (the Parquet store is the source of
truth), publishes each pending run as one message (task id = run_id, models interleaved, at most
``max_outstanding`` unfinished at a time), then polls Redis counters for progress and the store
for completion. A reconciler re-dispatches runs with no stored outcome whose last sign of life
(dispatch, start, heartbeat, deferral end; Redis clock) is older than ``reconcile_after_s``:
that covers a worker killed mid-run, a Redis restart that lost queued messages and an
orchestrator killed mid-dispatch. Restarting = calling it again. Redis errors are retried with
backoff, never fatal. Duplicated messages are harmless: workers claim runs, and a run executed
twice is stored as two executions (readers use the latest, ``storage.runs.EXECUTION_RULE``).

Availability (issue 5), as in the local executor: a model whose latest availability check found
it gone (``AvailabilityStore.unavailable_models``) is closed in the campaign's Redis gate, so a
worker holding one of its queued runs records it ``cancelled`` with the reason and makes no
call, and its never-dispatched runs are recorded ``cancelled`` here. A 410 a worker meets
during the campaign becomes an availability event (``source="campaign"``). When every run is
stored, the campaign's analysis is enqueued on the workers (``orchestrator.analysis_jobs``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import pyarrow.compute as pc
import redis
import structlog
from celery import Celery
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import RedisError

from orchestrator.campaign import CampaignStatus, PreparedCampaign, campaign_status
from orchestrator.local import ExecutionSummary, ModelProgress
from storage.availability import AvailabilityRecord, AvailabilityStore
from storage.records import Outcome
from storage.runs import RunStore
from storage.spool import recover_orphans
from workers.celery.campaign_state import FAILED_FIELD, CampaignState, reopen_runs
from workers.celery.app import DEFAULT_QUEUE, make_celery_app
from workers.clock import SystemClock
from workers.execute import RunContext, execute_run
from workers.gate import MemoryGate
from workers.limits.memory import MemoryLimiter
from workers.runtask import RunTask
from workers.celery.tasks import RUN_TASK_NAME
from workers.celery.runtime import sync_redis

log = structlog.get_logger("irbench.celery")
T = TypeVar("T")


@dataclass
class CeleryModelProgress(ModelProgress):
    """``ModelProgress`` plus the completion rate (runs per second, smoothed)."""

    rate_per_s: float = 0.0


CeleryProgressCallback = Callable[[str, ModelProgress], None]


@dataclass(frozen=True)
class CeleryOptions:
    """Knobs of the distributed executor.

    ``max_outstanding``: dispatched-but-unfinished runs at most (bounds broker memory; messages
    carry the prompt). ``reconcile_after_s``: lease horizon of the reconciler; it must exceed the
    queue wait of a dispatched run (workers refresh the sign of life every claim_ttl/3 while a
    run executes, so it need not cover a call's duration). ``store_scan_s``: how often the store
    is read to confirm completion. ``queue``: the Celery queue workers consume (``-Q``).
    """

    max_outstanding: int = 2000
    dispatch_batch: int = 100
    reconcile_after_s: float = 300.0
    store_scan_s: float = 5.0
    queue: str = DEFAULT_QUEUE
    redis_backoff_max_s: float = 5.0
    honour_availability: bool = True  # skip models the availability dataset says are gone
    analyze_on_complete: bool = True  # enqueue the campaign's analysis when every run is stored


def _retrying(fn: Callable[[], T], what: str, max_backoff_s: float, deadline: float | None) -> T:
    """Call ``fn``; on Redis/broker errors back off and retry (until ``deadline`` if given)."""
    wait = 0.1
    while True:
        try:
            return fn()
        except (RedisError, OSError, ConnectionError, KombuOperationalError) as exc:
            if deadline is not None and time.monotonic() + wait > deadline:
                raise
            log.warning("broker_unavailable_retrying", what=what, error=str(exc), retry_in_s=wait)
            time.sleep(wait)
            wait = min(wait * 2, max_backoff_s)


def _payload(task: RunTask) -> dict:
    return task.model_dump(mode="json")


class _Dispatcher:
    def __init__(self, app: Celery, state: CampaignState, store: RunStore, opts: CeleryOptions) -> None:
        self.app, self.state, self.store, self.opts = app, state, store, opts

    def send(self, tasks: Sequence[RunTask]) -> None:
        """Record then publish (a kill between the two leaves entries the reconciler re-sends).

        Each message carries ``measured_on`` = the UTC dispatch date (unless planned), so every
        redelivery or deferral of that message writes to the same partition.
        """
        today = dt.datetime.now(dt.timezone.utc).date()
        stamped = [t if t.measured_on is not None else t.model_copy(update={"measured_on": today}) for t in tasks]
        self.state.record_dispatch(t.run_id for t in stamped)
        with self.app.producer_or_acquire() as producer:
            for t in stamped:
                self.app.send_task(
                    RUN_TASK_NAME,
                    args=(_payload(t), str(self.store.root)),
                    task_id=t.run_id,
                    queue=self.opts.queue,
                    producer=producer,
                )


def _cancelled_records(tasks: Sequence[RunTask], reason: str, by_model: dict[str, str] | None = None) -> list:
    """Records for runs never picked up by a worker: ``execute_run`` behind a closed gate (no call).

    ``reason`` closes every model; ``by_model`` (model -> reason) closes only those models
    (pass ``reason=""`` then)."""
    import asyncio

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


def _progress(
    planned: dict[str, int], counts: dict[str, dict[str, int]], running: dict[str, int], prev: dict[str, CeleryModelProgress], dt_s: float
) -> dict[str, CeleryModelProgress]:
    out = {}
    for model, total in planned.items():
        c = counts.get(model, {})
        done = sum(v for k, v in c.items() if k != FAILED_FIELD)
        old = prev.get(model)
        inst = (done - old.done) / dt_s if old is not None and dt_s > 0 else 0.0
        rate = inst if old is None else 0.7 * old.rate_per_s + 0.3 * inst
        out[model] = CeleryModelProgress(
            total=total,
            done=done,
            failed=max(c.get(FAILED_FIELD, 0) - c.get(Outcome.CANCELLED.value, 0), 0),  # cancelled apart
            cancelled=c.get(Outcome.CANCELLED.value, 0),
            in_flight=running.get(model, 0),
            outcomes=Counter({k: v for k, v in c.items() if k != FAILED_FIELD}),
            rate_per_s=rate,
        )
    return out


def reconcile(
    state: CampaignState,
    dispatcher: _Dispatcher,
    remaining: dict[str, RunTask],
    older_than_s: float,
    limit: int | None = None,
) -> int:
    """Re-dispatch remaining runs whose last sign of life is older than ``older_than_s`` or that
    Redis does not know (lost). Returns how many were re-dispatched."""
    scores = state.dispatched()
    now = state.now_s()
    stale = [t for rid, t in remaining.items() if scores.get(rid, -1.0) < now - older_than_s]
    if stale:
        done = state.done_among(t.run_id for t in stale)  # stored but not yet seen by our scan
        stale = [t for t in stale if t.run_id not in done]
    if limit is not None:
        stale = stale[:limit]
    for i in range(0, len(stale), dispatcher.opts.dispatch_batch):
        dispatcher.send(stale[i : i + dispatcher.opts.dispatch_batch])
    if stale:
        log.info("reconciled", campaign=state.campaign, redispatched=len(stale))
    return len(stale)


AVAILABILITY_MARK = "(availability check "


def _close_unavailable(state: CampaignState, store: RunStore, models: set[str]) -> dict[str, str]:
    """Close, in the campaign's Redis gate, every planned model the availability dataset lists
    as gone; reopen models an earlier call closed for that reason that are available again.
    Returns model -> reason of the models closed for availability."""
    gone = AvailabilityStore(store.root, fsync=False).unavailable_models()
    closed: dict[str, str] = {}
    gate_key = state.key("gate")
    current = {k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
               for k, v in state.client.hgetall(gate_key).items()}
    for model in sorted(models):
        timeline = gone.get(model)
        if timeline is not None:
            reason = f"{timeline.latest_status.value} {AVAILABILITY_MARK}{timeline.latest_check})"
            state.client.hsetnx(gate_key, model, reason)
            closed[model] = current.get(model, reason)
        elif AVAILABILITY_MARK in current.get(model, ""):
            state.client.hdel(gate_key, model)  # found available again since
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


def _planned_ids_stored(prepared: PreparedCampaign, store: RunStore) -> set[str]:
    planned = {t.run_id for t in prepared.tasks}
    return store.completed_run_ids(prepared.spec.name) & planned


def run_campaign_celery(
    prepared: PreparedCampaign,
    store: RunStore,
    broker_url: str,
    *,
    on_progress: CeleryProgressCallback | None = None,
    poll_interval_s: float = 0.5,
    reconcile_after_s: float | None = None,
    timeout_s: float | None = None,
    options: CeleryOptions = CeleryOptions(),
    app: Celery | None = None,
    analysis_options: object | None = None,
    on_analysis: Callable[[object], None] | None = None,
    retry_outcomes: frozenset[Outcome] = frozenset(),
) -> ExecutionSummary:
    """Dispatch every planned run without a stored outcome and wait until each has one.

    ``retry_outcomes`` (``--retry-failed``): also dispatch the runs whose latest execution ended
    in one of these classes (their Redis done markers are dropped), and wait for a newer execution.

    ``reconcile_after_s`` overrides ``options.reconcile_after_s``. ``timeout_s``: give up
    waiting after this long (returns ``interrupted=True``; the workers carry on). The summary
    counts the runs stored during this call, per model and outcome.

    With ``options.analyze_on_complete`` (default) and every planned run stored, the campaign's
    analysis is enqueued on the workers (not awaited) into ``DATA/analysis/<campaign>/<UTC
    date>/`` with ``analysis_options`` (an ``AnalysisOptions``; default options, restricted to
    this campaign); ``on_analysis`` receives the ``orchestrator.analysis_jobs.AnalysisJob``.
    """
    opts = options if reconcile_after_s is None else replace(options, reconcile_after_s=reconcile_after_s)
    campaign = prepared.spec.name
    app = app or make_celery_app(broker_url)
    client = sync_redis(broker_url)
    state = CampaignState(client, campaign)
    dispatcher = _Dispatcher(app, state, store, opts)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    retry = lambda fn, what: _retrying(fn, what, opts.redis_backoff_max_s, deadline)  # noqa: E731

    by_id = {t.run_id: t for t in prepared.tasks}
    executions_at_start = _execution_keys(prepared, store)
    again = _retry_start(prepared, store, retry_outcomes)
    stored_at_start = _planned_ids_stored(prepared, store) - set(again)
    if again:
        retry(lambda: _reopen_for_retry(state, {rid: by_id[rid].model for rid in again}), "reopening retried runs")
    remaining = {rid: t for rid, t in by_id.items() if rid not in stored_at_start}  # planned order
    planned = dict(Counter(t.model for t in prepared.tasks))
    retry(lambda: state.set_planned(planned), "writing the plan")
    unavailable = (retry(lambda: _close_unavailable(state, store, set(planned)), "closing unavailable models")
                   if opts.honour_availability else {})
    retired_seen: set[str] = set()
    log.info("celery_campaign_start", campaign=campaign, planned=len(by_id), pending=len(remaining))

    # Initial dispatch list: pending runs Redis does not know, or whose sign of life is stale
    # (a previous orchestrator may have dispatched the rest: they are queued or running).
    scores = retry(state.dispatched, "reading dispatches")
    now = retry(state.now_s, "reading the clock")
    to_send = [t for rid, t in remaining.items() if scores.get(rid, -1.0) < now - opts.reconcile_after_s]
    last_scan = last_reconcile = last_poll = time.monotonic()
    progress: dict[str, CeleryModelProgress] = {}
    interrupted = False
    cancelled_written: set[str] = set()

    try:
        while remaining:
            if deadline is not None and time.monotonic() > deadline:
                interrupted = True
                break
            cancel = retry(state.cancel_reason, "reading the cancel flag")
            if cancel is not None and to_send:
                # Never dispatched: record them cancelled here so every run has an outcome.
                recs = _cancelled_records(to_send, cancel)
                store.write(recs)
                cancelled_written.update(r.run_id for r in recs)
                for r in recs:
                    remaining.pop(r.run_id, None)
                to_send = []
            if unavailable and to_send:
                # never dispatched either: recorded cancelled with the availability reason, no call
                skip = [t for t in to_send if t.model in unavailable]
                if skip:
                    recs = _cancelled_records(skip, "", {m: unavailable[m] for m in {t.model for t in skip}})
                    store.write(recs)
                    for r in recs:
                        remaining.pop(r.run_id, None)
                        retry(lambda r=r: state.mark_done(r.run_id, r.model, r.outcome.value, True), "marking done")
                    to_send = [t for t in to_send if t.model not in unavailable]
            # dispatch up to the outstanding window
            if to_send:
                room = opts.max_outstanding - retry(state.outstanding, "counting outstanding runs")
                while room > 0 and to_send:
                    batch, to_send = to_send[: min(room, opts.dispatch_batch)], to_send[min(room, opts.dispatch_batch) :]
                    batch = [t for t in batch if t.run_id in remaining]
                    retry(lambda b=batch: dispatcher.send(b), "dispatching")
                    room -= len(batch)
            # progress from Redis counters
            t_now = time.monotonic()
            counts = retry(state.counts, "reading counters")
            running = retry(state.running_by_model, "reading in-flight runs")
            progress = _progress(planned, counts, running, progress, t_now - last_poll)
            last_poll = t_now
            if on_progress:
                for m, p in progress.items():
                    on_progress(m, p)
            # completion from the store (source of truth)
            done_hint = sum(p.done for p in progress.values())
            if t_now - last_scan >= opts.store_scan_s or done_hint >= len(by_id):
                recover_orphans(store.dataset)  # spools of killed workers: durable, acked runs
                stored = _stored_now(prepared, store, again)
                for rid in stored:
                    remaining.pop(rid, None)
                last_scan = t_now
                if any(c.get(Outcome.RETIRED.value) for c in counts.values()):
                    _record_retirements(campaign, store, retired_seen)
                if remaining and not to_send and t_now - last_reconcile >= min(opts.reconcile_after_s / 2, 30.0):
                    retry(
                        lambda: reconcile(state, dispatcher, remaining, opts.reconcile_after_s),
                        "reconciling",
                    )
                    last_reconcile = t_now
            if remaining:
                time.sleep(poll_interval_s)
    except KeyboardInterrupt:
        interrupted = True

    _record_retirements(campaign, store, retired_seen)
    summary = _summary(prepared, store, executions_at_start, interrupted)
    log.info("celery_campaign_end", campaign=campaign, executed=summary.executed, interrupted=interrupted)
    client.close()
    if opts.analyze_on_complete and not remaining and not interrupted:
        try:
            from orchestrator.analysis_jobs import enqueue_campaign_analysis

            job = enqueue_campaign_analysis(campaign, store.root, broker_url, options=analysis_options,
                                            app=app, queue=opts.queue)
        except Exception as exc:  # noqa: BLE001 - the campaign is complete; say why no analysis follows
            log.warning("analysis_not_enqueued", campaign=campaign, error=f"{type(exc).__name__}: {exc}")
        else:
            if on_analysis is not None:
                on_analysis(job)
    return summary


def _reopen_for_retry(state: CampaignState, runs: dict[str, str]) -> None:
    """``--retry-failed`` asks for these runs to be executed again: drop their done markers, and
    the campaign's cancel flag and 'disabled' model closures that would only cancel them again
    (a retired model stays closed: its runs are recorded cancelled without a call)."""
    reopen_runs(state, runs)
    state.clear_cancel()
    gate = state.key("gate")
    for model in set(runs.values()):
        reason = state.client.hget(gate, model)
        if reason is not None and (reason.decode() if isinstance(reason, bytes) else reason).startswith("disabled"):
            state.client.hdel(gate, model)
            state.client.hdel(state.key("streak"), model)


def _execution_keys(prepared: PreparedCampaign, store: RunStore) -> set[tuple[str, str | None]]:
    """(run_id, execution_id) of every stored execution of the campaign."""
    t = store.read_executions(campaigns=[prepared.spec.name], columns=["run_id", "execution_id"])
    return set(zip(t.column("run_id").to_pylist(), t.column("execution_id").to_pylist()))


def _retry_start(prepared: PreparedCampaign, store: RunStore, outcomes: frozenset[Outcome]) -> dict[str, str | None]:
    """run_id -> latest execution_id, for the planned runs whose latest execution ended in ``outcomes``."""
    if not outcomes:
        return {}
    wanted = {o.value for o in outcomes}
    planned = {t.run_id for t in prepared.tasks}
    t = store.read_table(campaigns=[prepared.spec.name], columns=["run_id", "execution_id", "outcome"])
    return {r: e for r, e, o in zip(*(t.column(c).to_pylist() for c in ("run_id", "execution_id", "outcome")))
            if r in planned and o in wanted}


def _stored_now(prepared: PreparedCampaign, store: RunStore, again: dict[str, str | None]) -> set[str]:
    """Planned runs with a stored outcome; a retried run counts once its latest execution is new."""
    if not again:
        return _planned_ids_stored(prepared, store)
    planned = {t.run_id for t in prepared.tasks}
    t = store.read_table(campaigns=[prepared.spec.name], columns=["run_id", "execution_id"])
    return {r for r, e in zip(t.column("run_id").to_pylist(), t.column("execution_id").to_pylist())
            if r in planned and (r not in again or again[r] != e)}


def _summary(
    prepared: PreparedCampaign, store: RunStore, before: set[tuple[str, str | None]], interrupted: bool
) -> ExecutionSummary:
    """The executions stored during this call (whoever dispatched them: an earlier, killed
    orchestrator's runs count too), per model and outcome."""
    planned = {t.run_id for t in prepared.tasks}
    table = store.read_executions(campaigns=[prepared.spec.name], columns=["run_id", "execution_id", "model", "outcome"])
    by_model: dict[str, Counter[str]] = {}
    executed = 0
    for rid, eid, model, outcome in zip(*(table.column(c).to_pylist() for c in ("run_id", "execution_id", "model", "outcome"))):
        if rid in planned and (rid, eid) not in before:
            executed += 1
            by_model.setdefault(model, Counter())[outcome] += 1
    return ExecutionSummary(executed=executed, by_model={m: dict(c) for m, c in by_model.items()}, interrupted=interrupted)


def reconcile_campaign(
    prepared: PreparedCampaign, store: RunStore, broker_url: str, *, older_than_s: float = 300.0, options: CeleryOptions = CeleryOptions()
) -> int:
    """One reconciler pass on its own (e.g. from cron): returns how many runs were re-dispatched."""
    app = make_celery_app(broker_url)
    client = sync_redis(broker_url)
    try:
        state = CampaignState(client, prepared.spec.name)
        stored = _planned_ids_stored(prepared, store)
        remaining = {t.run_id: t for t in prepared.tasks if t.run_id not in stored}
        return reconcile(state, _Dispatcher(app, state, store, options), remaining, older_than_s)
    finally:
        client.close()


@dataclass(frozen=True)
class CeleryCampaignStatus:
    """Store truth plus the live view from Redis."""

    stored: CampaignStatus
    progress: dict[str, CeleryModelProgress] = field(default_factory=dict)
    outstanding: int = 0  # dispatched, not yet done
    cancel_reason: str | None = None
    closed_models: dict[str, str] = field(default_factory=dict)  # model -> retired/disabled reason


def campaign_status_celery(prepared: PreparedCampaign, store: RunStore, broker_url: str) -> CeleryCampaignStatus:
    """Planned vs stored (store), and in-flight/outstanding/cancel/closed models (Redis)."""
    stored = campaign_status(prepared, store)
    client = sync_redis(broker_url)
    try:
        state = CampaignState(client, prepared.spec.name)
        planned = dict(Counter(t.model for t in prepared.tasks))
        progress = _progress(planned, state.counts(), state.running_by_model(), {}, 0.0)
        closed = {k.decode(): v.decode() for k, v in client.hgetall(state.key("gate")).items()}
        return CeleryCampaignStatus(stored, progress, state.outstanding(), state.cancel_reason(), closed)
    finally:
        client.close()


def cancel_campaign(campaign_name: str, broker_url: str, reason: str = "cancelled by user") -> None:
    """Stop the campaign: workers record every run they pick up from now on as ``cancelled``
    (no call), and the orchestrator stops dispatching and records never-dispatched runs."""
    client = sync_redis(broker_url)
    try:
        CampaignState(client, campaign_name).cancel(reason)
    finally:
        client.close()


def make_redis(broker_url: str) -> redis.Redis:
    """The sync client the executor uses (exposed for the CLI's status display)."""
    return sync_redis(broker_url)


def celery_execute(
    broker_url: str, *, options: CeleryOptions = CeleryOptions(analyze_on_complete=False), **kwargs: object
) -> Callable[..., tuple[int, ExecutionSummary]]:
    """An executor with the signature of ``run_campaign_local`` — ``(prepared, store, secrets,
    on_progress=None) -> (skipped, summary)`` — that runs on the Celery workers (what
    ``orchestrator.probe.run_probe(execute=...)`` takes). ``secrets`` are ignored: workers read
    the keys from their own environment. ``skipped`` = planned runs already stored before.
    ``kwargs`` go to :func:`run_campaign_celery` (e.g. ``timeout_s``)."""

    def execute(prepared: PreparedCampaign, store: RunStore, secrets: object = None,
                on_progress: CeleryProgressCallback | None = None,
                retry_outcomes: frozenset[Outcome] = frozenset()) -> tuple[int, ExecutionSummary]:
        skipped = len(_planned_ids_stored(prepared, store) - set(_retry_start(prepared, store, retry_outcomes)))
        summary = run_campaign_celery(prepared, store, broker_url, on_progress=on_progress, options=options,
                                      retry_outcomes=retry_outcomes, **kwargs)  # type: ignore[arg-type]
        return skipped, summary

    return execute
