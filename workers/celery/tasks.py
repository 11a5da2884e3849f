"""The Celery task: execute one run, store its record, mark it done — idempotent by run_id.

Arguments are JSON only: ``RunTask.model_dump(mode="json")`` and the store root (never a
secret: the API key is read by the worker from its own environment). Order of effects:
claim (skip if done / live elsewhere) → already stored? → ``execute_run`` on the process's
loop → the process's spool (``storage.spool``: group commit, fsynced before we go on; published
as few large Parquet files; a new execution of the run, every execution is kept) →
done marker and counters → return (ack). A crash between the write and the done marker makes
the redelivery execute the run again: both executions are stored, readers use the latest. A permit that is not available within a second or two re-publishes
the same run with a countdown (a deferral: no Celery retry, no attempt spent). When the limiter
reserved a rate slot for the run, the countdown is exactly the time to that slot (no jitter:
the slot has one owner); otherwise it is jittered so deferred runs do not return together.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import structlog
from celery import Celery
from redis.exceptions import RedisError

from storage.records import Outcome
from workers.celery.campaign_state import BUSY, DONE, CampaignState
from workers.execute import RunContext, execute_run
from workers.celery.gate import RedisGate
from workers.runtask import RunTask
from workers.celery.runtime import Deferred, DeferringLimiter, RuntimeHolder, WorkerRuntime

RUN_TASK_NAME = "irbench.run"
log = structlog.get_logger("irbench.task")
T = TypeVar("T")


def _with_redis_retry(fn: Callable[[], T], budget_s: float) -> T:
    """Call ``fn`` until it succeeds or ``budget_s`` is spent (Redis restarting), backing off."""
    deadline, wait = time.monotonic() + budget_s, 0.1
    while True:
        try:
            return fn()
        except RedisError:
            if time.monotonic() + wait > deadline:
                raise
            time.sleep(wait)
            wait = min(wait * 2, 2.0)


def execute_one(rt: WorkerRuntime, task: RunTask, data_dir: str | None, owner: str) -> str:
    """Run ``task`` exactly once across deliveries; returns what happened (for logs/tests).

    Raises :class:`Deferred` when the run must be re-published later (claim already released).
    """
    s = rt.settings
    state = CampaignState(rt.redis, task.campaign, prefix=f"{s.key_prefix}:camp")
    claim = _with_redis_retry(lambda: state.claim(task.run_id, task.model, owner, s.claim_ttl_s), s.redis_retry_s)
    if claim in (DONE, BUSY):
        return claim
    gate = RedisGate(state, disable_after_consecutive=task.retry.disable_after_consecutive, async_client=rt.aredis)
    ctx = RunContext(provider_for=rt.provider_for, limiter=DeferringLimiter(rt.limiter, gate, rt), gate=gate)
    rt.hold_claim(state, task.run_id, owner)
    try:
        gate.refresh(task.model)  # here, in the task thread: execute_run's first check is then answered off the loop
        record = rt.run(execute_run(task, ctx))
    except (Deferred, RedisError) as exc:
        if isinstance(exc, Deferred) and exc.reserved:
            countdown = min(exc.wait_s, s.max_defer_s)  # slots are reserved at most max_defer_s ahead
        else:
            wait_s = exc.wait_s if isinstance(exc, Deferred) else s.min_defer_s * 4
            countdown = min(max(wait_s, s.min_defer_s) + random.uniform(0, s.min_defer_s), s.max_defer_s)
        rt.drop_claim(task.run_id)
        try:
            state.release_claim(task.run_id, owner, countdown)
        except RedisError:
            pass  # the claim expires on its own
        reason = exc.reason if isinstance(exc, Deferred) else "redis unavailable"
        raise Deferred(countdown, reason, reserved=isinstance(exc, Deferred) and exc.reserved) from exc
    finally:
        rt.drop_claim(task.run_id)
    rt.spool(data_dir).append([record])  # durable (group commit) before the done marker and the ack
    failed = record.outcome is not Outcome.OK or not record.succeeded
    _with_redis_retry(
        lambda: state.mark_done(task.run_id, task.model, record.outcome.value, failed), s.redis_retry_s
    )
    return record.outcome.value


def register_tasks(app: Celery, holder: RuntimeHolder) -> Any:
    """Register ``irbench.run`` on ``app``; returns the task object."""

    @app.task(name=RUN_TASK_NAME, bind=True, acks_late=True, ignore_result=True)
    def run(self: Any, task_json: dict[str, Any], data_dir: str | None = None) -> str:
        task = RunTask.model_validate(task_json)
        owner = f"{self.request.hostname}:{uuid.uuid4().hex[:12]}"
        with structlog.contextvars.bound_contextvars(campaign=task.campaign, run_id=task.run_id, model=task.model):
            try:
                result = execute_one(holder.get(), task, data_dir, owner)
            except Deferred as d:
                queue = (self.request.delivery_info or {}).get("routing_key") or app.conf.task_default_queue
                # Same task id, new message; NOT self.retry(): deferrals must not spend max_retries.
                self.apply_async(args=(task_json, data_dir), task_id=task.run_id, countdown=d.wait_s, queue=queue)
                log.info("run_deferred", countdown_s=round(d.wait_s, 3), reason=d.reason, reserved=d.reserved)
                return "deferred"
            log.info("run_finished", result=result)
            return result

    return run
