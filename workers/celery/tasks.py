"""The Celery task: execute one run, store its execution, mark it done — idempotent by run_id.

Arguments are JSON only: ``RunTask.model_dump(mode="json")`` and the store root (never a
secret: the API key is read by the worker from its own environment). Order of effects:

claim (skip if done / live elsewhere; the same script reads the model's gate) → ``execute_run``
on the process's loop → the process's spool (``storage.spool``: group commit, fsynced before we
go on; published as few large Parquet files) → done marker and counters → return (ack). Nothing is acknowledged before it is durable.
A crash between the write and the done marker makes the redelivery execute the run again: both
executions are stored, readers use the latest (``storage.runs.EXECUTION_RULE``).

A permit that is not available within a second or two *defers* the run: it is parked in the
campaign's delayed set in Redis (``CampaignState.defer``) and the message is acknowledged, so no
deferred run waits inside a worker that can die; the orchestrator re-publishes it when due. When
the limiter reserved a rate slot for the run, the delay is exactly the time to that slot;
otherwise it is jittered so deferred runs do not return together. A task that raises is counted
as a failure of the run (with its text) and parked the same way; the orchestrator stores a
``worker_error`` record once a run has failed ``max_task_failures`` times (a poison run).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from typing import Any

import structlog
from celery import Celery

from storage.records import ERROR_TEXT_MAX_CHARS
from workers.celery.campaign_state import BUSY, DONE, CampaignState
from workers.celery.gate import RedisGate
from workers.celery.redis_retry import TRANSIENT, with_retry
from workers.celery.deferring import Deferred, DeferringLimiter
from workers.celery.runtime import RuntimeHolder, WorkerRuntime
from workers.execute import RunContext, execute_run
from workers.limits.base import Permit
from workers.logs import Redactor
from workers.runtask import RunTask

RUN_TASK_NAME = "irbench.run"
RUNS_TASK_NAME = "irbench.runs"  # several runs per message
DEFERRED, FAILED = "deferred", "failed"
log = structlog.get_logger("irbench.task")


def _countdown(rt: WorkerRuntime, exc: Exception) -> float:
    s = rt.settings
    if isinstance(exc, Deferred) and exc.reserved:
        return min(exc.wait_s, s.max_defer_s)  # slots are reserved at most max_defer_s ahead
    wait_s = exc.wait_s if isinstance(exc, Deferred) else s.min_defer_s * 4
    return min(max(wait_s, s.min_defer_s) + random.uniform(0, s.min_defer_s), s.max_defer_s)


def execute_one(rt: WorkerRuntime, state: CampaignState, task: RunTask, data_dir: str | None, owner: str,
                pending: Sequence[str] = ()) -> str:
    """Run ``task`` once for this delivery; returns what happened (for logs/tests): an outcome,
    ``done``/``busy`` (nothing to do) or ``deferred`` (parked in the delayed set). ``pending``:
    the runs after this one in the same message (the claim marks them as in live hands)."""
    s = rt.settings
    claimed = with_retry(lambda: rt.claims.claim(state, task, owner, s.claim_ttl_s, pending),
                         "claiming a run", budget_s=s.redis_retry_s)
    if claimed.status in (DONE, BUSY) or claimed.view is None:
        return claimed.status
    if claimed.permit is not None:
        rt.hold_permit(claimed.permit)  # the heartbeat renews it from now on
    gate = RedisGate(state, disable_after_consecutive=task.retry.disable_after_consecutive, async_client=rt.aredis)
    limiter = DeferringLimiter(rt.limiter, gate, rt, first=claimed.permit, release_later=True)
    ctx = RunContext(provider_for=rt.provider_for, limiter=limiter, gate=gate)
    rt.hold_claim(state, task.run_id, owner)
    try:
        spool = rt.spool(data_dir)
        gate.prime(task.model, claimed.view)  # read with the claim: execute_run's first check is answered off the loop
        record = rt.run(execute_run(task, ctx))
    except (Deferred, *TRANSIENT) as exc:
        _release(rt, limiter.take_unreleased())
        countdown = _countdown(rt, exc)
        rt.drop_claim(task.run_id)
        try:
            with_retry(lambda: state.defer(task.run_id, owner, countdown), "deferring a run", budget_s=s.redis_retry_s)
        except TRANSIENT:
            pass  # the claim expires; the orchestrator's reconciler re-sends the run
        reason = exc.reason if isinstance(exc, Deferred) else "redis unavailable"
        log.info("run_deferred", countdown_s=round(countdown, 3), reason=reason,
                 reserved=isinstance(exc, Deferred) and exc.reserved)
        return DEFERRED
    except BaseException:
        _release(rt, limiter.take_unreleased())
        raise
    finally:
        rt.drop_claim(task.run_id)
    held = limiter.take_unreleased()  # the last attempt's permit: released with the done marker
    try:
        spool.append([record])  # durable (group commit) before the done marker and the ack
    except BaseException:
        _release(rt, held)
        raise
    with_retry(lambda: rt.claims.done_and_release(state, task.run_id, task.model, record.outcome.value,
                                                  record.failed, len(record.attempts), held),
               "marking a run done", budget_s=s.redis_retry_s)
    for permit, _ in held:
        rt.drop_permit(permit)
    return record.outcome.value


def _release(rt: WorkerRuntime, held: Sequence[tuple[Permit, int | None]]) -> None:
    """Best effort: a permit not released here expires with its lease (no heartbeat renews it)."""
    for permit, _ in held:
        rt.drop_permit(permit)
    if held:
        try:
            rt.claims.release(held)
        except Exception as exc:  # noqa: BLE001 - the lease TTL frees it
            log.warning("limiter_release_failed", model=held[0][0].model, error=str(exc))


def _failure_text(exc: BaseException) -> str:
    """What the stored worker_error says: exception type and text, secrets scrubbed, bounded."""
    return Redactor().scrub(f"{type(exc).__name__}: {exc}")[:ERROR_TEXT_MAX_CHARS]


def run_delivered(holder: RuntimeHolder, hostname: str, task_json: dict[str, Any], data_dir: str | None,
                  pending: Sequence[str] = ()) -> str:
    """One run of a delivered message: execute it, or count its task's exception as a failure of
    the run (the orchestrator ends poison runs). Never raises for the run's own sake."""
    task = RunTask.model_validate(task_json)
    owner = f"{hostname}:{uuid.uuid4().hex[:12]}"
    rt = holder.get()
    state = CampaignState(rt.redis, task.campaign, prefix=f"{rt.settings.key_prefix}:camp")
    with structlog.contextvars.bound_contextvars(campaign=task.campaign, run_id=task.run_id, model=task.model):
        try:
            result = execute_one(rt, state, task, data_dir, owner, pending)
        except Exception as exc:  # noqa: BLE001 - counted; the orchestrator ends poison runs
            text = _failure_text(exc)
            try:
                failures = with_retry(lambda: state.defer(task.run_id, owner, rt.settings.failure_backoff_s, text),
                                      "recording a task failure", budget_s=rt.settings.redis_retry_s)
            except TRANSIENT:
                failures = None  # the claim expires; the reconciler counts the loss
            log.warning("run_task_failed", failures=failures, error=text)
            return FAILED
        if result != DEFERRED:
            log.info("run_stored", result=result)
        return result


def register_tasks(app: Celery, holder: RuntimeHolder) -> Any:
    """Register ``irbench.run`` (one run per message) and ``irbench.runs`` (several: the
    orchestrator's ``runs_per_message``) on ``app``; returns the ``irbench.run`` task object."""

    @app.task(name=RUN_TASK_NAME, bind=True, acks_late=True, ignore_result=True)
    def run(self: Any, task_json: dict[str, Any], data_dir: str | None = None) -> str:
        return run_delivered(holder, self.request.hostname, task_json, data_dir)

    @app.task(name=RUNS_TASK_NAME, bind=True, acks_late=True, ignore_result=True)
    def runs(self: Any, task_jsons: list[dict[str, Any]], data_dir: str | None = None) -> list[str]:
        """The runs one after the other in this thread (one run in flight per worker slot, as
        with ``irbench.run``); each is claimed, stored and marked done on its own, and the message
        is acknowledged after the last. A worker that dies part-way leaves the finished runs done,
        the running one's claim to expire and the rest queued: the reconciler re-sends both."""
        ids = [str(t.get("run_id")) for t in task_jsons]
        return [run_delivered(holder, self.request.hostname, t, data_dir, ids[i + 1 :])
                for i, t in enumerate(task_jsons)]

    return run
