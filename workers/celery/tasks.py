"""The Celery tasks: execute the runs of one message, store them, mark them done — idempotent by run_id.

Arguments are JSON only: ``RunTask.model_dump(mode="json")`` per run and the store root (never
a secret: the API key is read by the worker from its own environment). ``irbench.run`` carries
one run, ``irbench.runs`` several (the orchestrator's ``runs_per_message``); both go through
:func:`run_message`. The runs of a message execute concurrently on the process's event loop,
each in this order:

a run slot of the worker (``run_slots``, 64 by default: however many runs the messages
carry, no more calls than that are in flight) → the claim (skip if done / live
elsewhere; it reads the model's gate and decides the first permit in the same script) →
``execute_run`` → the slot handed on (to a run that cannot call before the next step is
through) → the record into the process's spool (``storage.parquet.spool``: fsynced before we go on),
then the done marker and the permit releases → when every run of the message is through:
return (ack). Nothing is acknowledged before it is durable. A crash
between the write and the done marker makes the redelivery execute the run again: both
executions are stored, readers use the latest (``storage.runs.EXECUTION_RULE``). A run waiting
for a slot is not claimed yet; the heartbeat keeps its queued time fresh, so the reconciler
does not take it for lost, and if the worker is stopped long enough for the run to be re-sent,
its claim here finds it done or busy and steps aside.

Before each call, the run's intent (``workers.execute.died_record``: the record it gets if the
worker dies mid-call) goes into the same spool, durable before the send (``intent_journal``);
the intents of the runs that call together share one fsync, and so do they with the records of
the runs finishing meanwhile. A worker SIGKILLed mid-call leaves them in its spool; whoever
recovers it (the worker restarted on it, the orchestrator, compaction) stores them as
``worker_died`` executions: every call the endpoint received is a stored attempt. A kill
between an intent's fsync and its send stores a ``worker_died`` attempt the endpoint never saw.
A run whose execution raises (a task failure) resolves its intents without a record: its calls,
if the exception came after a send, are not stored.

Why whole messages on one loop: a run's own work on a fast endpoint is ~0.5 ms of CPU, and each
per-run Redis round trip, thread hand-off and fsync cost about as much again (bench/worker_path.py measures this).
The claims of the runs that get a slot together, and the appends and done markers of the runs
that finish together, go out together (``workers.celery.coalesce``): under load, one fsync (in
a thread) and one ``EVALSHA`` (on the loop's async client) for many runs.

A permit that is not available within a second or two (``max_wait_s``; for a concurrency
permit, that long after the last of the message's other calls is through: until then the
message holds its thread anyway) *defers* the run: it is parked in the
campaign's delayed set in Redis and its claim dropped (the message is still acknowledged, so no
deferred run waits inside a worker that can die); the orchestrator re-publishes it when due.
When the limiter reserved a rate slot for the run, the delay is exactly the time to that slot;
otherwise it is jittered so deferred runs do not return together. A run whose execution raises
is counted as a failure of the run (with its text) and parked the same way; the orchestrator
stores a ``worker_error`` record once a run has failed ``max_task_failures`` times (a poison
run), and re-sends a failed or lost run alone, so a poison run cannot take its message-mates
with it more than once.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from celery import Celery

from storage.records import ERROR_TEXT_MAX_CHARS, RunRecord
from workers.state.campaign_keys import Call
from workers.state.campaign_state import CampaignState
from workers.state.run_claims import CLAIMED
from workers.state.claim_permit import Claimed
from workers.celery.coalesce import Coalescer
from workers.celery.deferring import Deferred, DeferringLimiter, MessageCalls
from workers.state.gate import RedisGate
from workers.state.spend_counters import RedisSpendMeter
from workers.celery.message import decode_runs
from workers.state.redis_retry import TRANSIENT, awith_retry
from workers.celery.runtime import RuntimeHolder, WorkerRuntime
from workers.execute import RunContext, execute_run
from workers.limits.base import Permit
from workers.logs import Redactor
from workers.runtask import RunTask

RUN_TASK_NAME = "irbench.run"
RUNS_TASK_NAME = "irbench.runs"  # several runs per message
DEFERRED, FAILED, UNCLAIMED = "deferred", "failed", "unclaimed"
log = structlog.get_logger("irbench.task")


@dataclass
class _Run:
    """One run of the message and what became of it on this delivery."""

    task: RunTask
    state: CampaignState
    owner: str
    status: str | None = None  # DONE / BUSY: the claim found nothing to do
    record: RunRecord | None = None
    countdown_s: float | None = None  # deferred: due again in this many seconds
    defer_reason: str = ""
    reserved: bool = False  # deferred to a rate slot reserved for it
    failure: str | None = None  # the execution raised: the failure's text
    held: list[tuple[Permit, int | None]] = field(default_factory=list)  # permits still to release
    dispatch: str = ""  # the token of the orchestrator run that sent the message
    message: MessageCalls | None = None  # shared by the runs of one delivered message

    @property
    def result(self) -> str:
        if self.status is not None:
            return self.status
        if self.record is not None:
            return self.record.outcome.value
        return DEFERRED if self.countdown_s is not None else FAILED


def _countdown(rt: WorkerRuntime, exc: Exception) -> float:
    s = rt.settings
    if isinstance(exc, Deferred) and exc.reserved:
        return min(exc.wait_s, s.max_defer_s)  # slots are reserved at most max_defer_s ahead
    wait_s = exc.wait_s if isinstance(exc, Deferred) else s.min_defer_s * 4
    return min(max(wait_s, s.min_defer_s) + random.uniform(0, s.min_defer_s), s.max_defer_s)


def _failure_text(exc: BaseException) -> str:
    """What the stored worker_error says: exception type and text, secrets scrubbed, bounded."""
    return Redactor().scrub(f"{type(exc).__name__}: {exc}")[:ERROR_TEXT_MAX_CHARS]


@dataclass(frozen=True)
class _Claim:
    """A run asking for its claim (and first permit) in the next Redis batch."""

    run: _Run


@dataclass(frozen=True)
class _Finish:
    """A run whose record is to be made durable and whose done marker (or deferral or failure)
    and permit releases go out in the next batch."""

    run: _Run
    data_dir: str | None


async def _execute(rt: WorkerRuntime, run: _Run, data_dir: str | None) -> None:
    """One run on the loop: a run slot, then its claim (with its first permit), ``execute_run``,
    then its record made durable and its done marker — or deferral or failure — and its permits'
    releases sent. Claims and finishes of the runs that reach them together share one fsync and
    one ``EVALSHA`` (:func:`_flush`).

    The slot is handed on as the finish is queued, in the same step: the run waiting for it
    queues its claim before the flush starts, so a finish and the next run's claim share a
    batch (one round trip for both instead of one each). That next run cannot call before the
    batch is through, and the batch makes the finish durable before its ``EVALSHA``: a SIGKILL
    still loses at most ``run_slots`` answered calls, and never more than ``run_slots`` calls
    are in flight."""
    task = run.task
    batcher = rt.batcher("redis", lambda: Coalescer(lambda items: _flush(rt, items)))
    waits = rt.slots.locked()  # a free slot is taken without suspending: nothing to keep fresh
    if waits:
        rt.hold_waiting(run.state, task.run_id)
    reply = None
    holding = False
    try:
        await rt.slots.acquire()
        holding = True
        if waits:
            rt.drop_waiting(task.run_id)
        claimed = await batcher.submit(_Claim(run))
        if isinstance(claimed, Exception):  # Redis away past redis_retry_s: still queued, reconciled
            log.warning("run_not_claimed", run_id=task.run_id, error=str(claimed))
            run.status = UNCLAIMED
            return
        if claimed.status != CLAIMED or claimed.view is None:
            run.status = claimed.status
            return
        rt.hold_claim(run.state, task.run_id, run.owner)
        if claimed.permit is not None:
            rt.hold_permit(claimed.permit)  # the heartbeat renews it from now on
        await _call(rt, run, claimed, data_dir)
        holding = False
        rt.slots.release()  # first: the waiter's wake-up is queued ahead of the flush's start
        reply = await batcher.enqueue(_Finish(run, data_dir))
    finally:
        if holding:
            rt.slots.release()
        if waits:
            rt.drop_waiting(task.run_id)  # cancelled while waiting
        _drop_permits(rt, run)
        rt.drop_claim(task.run_id)
    _log_end(run, reply)


class _RunJournal:
    """One run's intents into the spool of its store (``intend``: what ``execute_run`` awaits
    before each call, durable on return; the intents of the runs calling together share one
    fsync, through a ``Coalescer`` writing in a thread) and, when its execution raises
    (``forget``), their resolution: a failed task stores no ``worker_died`` for calls that
    may never have been sent."""

    def __init__(self, rt: WorkerRuntime, data_dir: str | None) -> None:
        self.spool = spool = rt.spool(data_dir)
        self.execution_ids: set[str] = set()

        def write(intents: Sequence[RunRecord]) -> list[None]:
            spool.intend(intents)
            return [None] * len(intents)

        self._batcher = rt.batcher(f"intents:{spool.dir}",
                                   lambda: Coalescer(lambda items: asyncio.to_thread(write, items)))

    async def intend(self, record: RunRecord) -> None:
        self.execution_ids.add(record.execution_id or "")
        await self._batcher.submit(record)

    async def forget(self) -> None:
        if not self.execution_ids:
            return
        try:
            await asyncio.to_thread(self.spool.resolve, sorted(self.execution_ids))
        except Exception as exc:  # the spool is closing or its disk full: its recovery stores worker_died
            log.warning("intents_not_resolved", executions=len(self.execution_ids), error=str(exc))


async def _call(rt: WorkerRuntime, run: _Run, claimed: Claimed, data_dir: str | None) -> None:
    """``execute_run`` under the run's claim; fills in its record, deferral or failure and the
    permits it still holds."""
    task = run.task
    assert claimed.view is not None
    gate = RedisGate(run.state, disable_after_consecutive=task.retry.disable_after_consecutive, async_client=rt.aredis)
    gate.prime(task.model, claimed.view)  # read with the claim: execute_run's first check is answered here
    limiter = DeferringLimiter(rt.limiter, gate, rt, first=claimed.permit, release_later=True, message=run.message)
    journal = _RunJournal(rt, data_dir) if rt.settings.intent_journal else None
    try:
        spend = RedisSpendMeter(run.state.base, rt.aredis) if task.spend_capped else None
        run.record = await execute_run(task, RunContext(provider_for=rt.provider_for, limiter=limiter, gate=gate,
                                                        spend=spend, intent=None if journal is None else journal.intend))
    except (Deferred, *TRANSIENT) as exc:
        run.countdown_s = _countdown(rt, exc)
        run.defer_reason = exc.reason if isinstance(exc, Deferred) else "redis unavailable"
        run.reserved = isinstance(exc, Deferred) and exc.reserved
    except Exception as exc:
        run.failure = _failure_text(exc)
        if journal is not None:
            await journal.forget()
    finally:
        limiter.through()
        run.held = limiter.take_unreleased()


async def _flush(rt: WorkerRuntime, items: Sequence[_Claim | _Finish]) -> list[Any]:
    """On the loop: the records of the finishing runs into the spool, durable (in a thread: the
    fsync), then one ``EVALSHA`` on the loop's async client (``ScriptBatch``): every finishing
    run's done marker, deferral or failure and permit releases first (so a permit freed here
    can go to a claim of the same batch), then the claims. Returns per item: a finish's first
    reply (done flag or failure count), a claim's ``Claimed``; if Redis stays away past
    ``redis_retry_s``, None for a finish (its claim expires and the reconciler re-sends the
    run) and the error for a claim. A batch of claims only needs no thread at all."""
    finishes = [it for it in items if isinstance(it, _Finish)]
    if any(f.run.record is not None for f in finishes):  # failures and deferrals write nothing
        await asyncio.to_thread(_append, rt, finishes)
    calls, first = _batch_calls(rt, items)
    asked_at = time.monotonic()  # every grant happens after this
    try:
        replies = await awith_retry(lambda: rt.claims.arun_calls(calls), "claiming and marking runs done",
                                    budget_s=rt.settings.redis_retry_s)
    except TRANSIENT as exc:
        return _unreplied(items, finishes, exc)
    return _batch_replies(rt, items, replies, first, asked_at)


def _batch_calls(rt: WorkerRuntime, items: Sequence[_Claim | _Finish]) -> tuple[list[Call], dict[int, int]]:
    """The batch's script calls, finishes first, and the index of each item's first call."""
    ttl_s = rt.settings.claim_ttl_s
    calls: list[Call] = []
    first: dict[int, int] = {}
    for i in sorted(range(len(items)), key=lambda i: isinstance(items[i], _Claim)):
        it = items[i]
        first[i] = len(calls)
        calls += (_finish_calls(rt, it.run) if isinstance(it, _Finish)
                  else [rt.claims.claim_call(it.run.state, it.run.task, it.run.owner, ttl_s)[0]])
    return calls, first


def _batch_replies(rt: WorkerRuntime, items: Sequence[_Claim | _Finish], replies: list[Any],
                   first: dict[int, int], asked_at: float) -> list[Any]:
    return [replies[first[i]] if isinstance(it, _Finish)
            else rt.claims.claimed_from(replies[first[i]], it.run.task, asked_at) for i, it in enumerate(items)]


def _unreplied(items: Sequence[_Claim | _Finish], finishes: Sequence[_Finish], exc: Exception) -> list[Any]:
    if finishes:
        log.warning("runs_not_marked_done", runs=len(finishes), error=str(exc))
    return [None if isinstance(it, _Finish) else exc for it in items]


def _append(rt: WorkerRuntime, finishes: Sequence[_Finish]) -> None:
    by_dir: dict[str | None, list[_Run]] = {}
    for f in finishes:
        if f.run.record is not None:
            by_dir.setdefault(f.data_dir, []).append(f.run)
    for data_dir, stored in by_dir.items():
        try:
            rt.spool(data_dir).append([r.record for r in stored if r.record is not None])  # all are (by_dir)
        except Exception as exc:
            text = _failure_text(exc)
            for r in stored:
                r.record, r.failure = None, text


async def _execute_all(rt: WorkerRuntime, runs: Sequence[_Run], data_dir: str | None) -> None:
    """Every run of the message; a bug in one never acks the message before the others end."""
    results = await asyncio.gather(*(_execute(rt, r, data_dir) for r in runs), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


def run_message(holder: RuntimeHolder, hostname: str, tasks: Sequence[RunTask], data_dir: str | None,
                dispatch: str = "") -> list[str]:
    """Execute the runs of one delivered message; returns what happened to each (for logs and
    tests): an outcome, ``done``/``busy`` (nothing to do), ``deferred`` or ``failed``. Never
    raises for a run's own sake: a run whose execution raised is counted as a failure of it."""
    rt = holder.get()
    token = uuid.uuid4().hex[:12]
    states: dict[str, CampaignState] = {}
    message = MessageCalls()
    runs = []
    for i, task in enumerate(tasks):
        if task.campaign not in states:
            states[task.campaign] = CampaignState(rt.redis, task.campaign, prefix=f"{rt.settings.key_prefix}:camp")
        runs.append(_Run(task, states[task.campaign], f"{hostname}:{token}.{i}", dispatch=dispatch, message=message))
    try:
        rt.spool(data_dir)  # a data dir problem raises here, before anything is claimed or called
    except Exception as exc:
        _fail_unclaimed(rt, runs, _failure_text(exc))  # Redis away too: they stay queued, re-sent
    else:
        rt.run(_execute_all(rt, runs, data_dir))
    return [r.result for r in runs]


def _fail_unclaimed(rt: WorkerRuntime, runs: Sequence[_Run], text: str) -> None:
    """Count a failure of each run (nothing of them was claimed or called), from the task thread,
    through the loop's batch, as its runs' own finishes go."""
    for r in runs:
        r.failure = text
    for r, reply in zip(runs, rt.run(_flush(rt, [_Finish(r, None) for r in runs]))):
        _log_end(r, reply)


def _finish_calls(rt: WorkerRuntime, r: _Run) -> list[Call]:
    """The run's done marker (stored), deferral or failure, then the release of every permit it
    still holds; the first call's reply is the done flag or the failure count."""
    if r.record is not None:
        rec = r.record
        first = r.state.done.mark_call(rec.run_id, rec.model, rec.outcome.value, rec.failed, len(rec.attempts),
                                       r.dispatch)
    elif r.countdown_s is not None:
        first = r.state.claims.defer_call(r.task.run_id, r.owner, r.countdown_s)
    else:
        first = r.state.claims.defer_call(r.task.run_id, r.owner, rt.settings.failure_backoff_s, r.failure or "failed")
    return [first, *rt.claims.release_calls(r.held)]


def _drop_permits(rt: WorkerRuntime, r: _Run) -> None:
    for permit, _ in r.held:
        rt.drop_permit(permit)


def _log_end(r: _Run, reply: Any) -> None:
    if r.record is not None:
        # no line: execute_run's run_finished already says how the run ended. A second INFO line
        # per run costs a worker 0.06-0.1 ms of CPU (bench/worker_path.py measures it), and even at
        # DEBUG, filtered out, structlog binds a logger per call (~3 us a run)
        return
    with structlog.contextvars.bound_contextvars(campaign=r.task.campaign, run_id=r.task.run_id, model=r.task.model):
        if r.countdown_s is not None:
            log.info("run_deferred", countdown_s=round(r.countdown_s, 3), reason=r.defer_reason, reserved=r.reserved)
        else:
            log.warning("run_task_failed", failures=reply, error=r.failure)


def register_tasks(app: Celery, holder: RuntimeHolder) -> Any:
    """Register ``irbench.run`` (one run per message) and ``irbench.runs`` (several: the
    orchestrator's ``runs_per_message``) on ``app``; returns the ``irbench.run`` task object."""

    @app.task(name=RUN_TASK_NAME, bind=True, acks_late=True, ignore_result=True)
    def run(self: Any, task_json: dict[str, Any], data_dir: str | None = None, dispatch: str = "") -> str:
        return run_message(holder, self.request.hostname, [RunTask.model_validate(task_json)], data_dir, dispatch)[0]

    @app.task(name=RUNS_TASK_NAME, bind=True, acks_late=True, ignore_result=True)
    def runs(self: Any, body: dict[str, Any] | list[dict[str, Any]], data_dir: str | None = None,
             dispatch: str = "") -> list[str]:
        """``body``: ``workers.celery.message.encode_runs`` of the runs. They execute
        concurrently, each in one of the worker's run slots; a worker that dies part-way leaves
        the claims of its running runs to expire and the rest queued: the reconciler re-sends
        both, one run per message."""
        return run_message(holder, self.request.hostname, decode_runs(body), data_dir, dispatch)

    return run
