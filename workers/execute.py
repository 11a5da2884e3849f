"""The one loop that executes a run: gate → permit → call → classify → retry → RunRecord.

``execute_run`` never raises for a provider failure: every outcome, failures included, comes
back as a ``RunRecord`` with all attempts, ready to be stored. Writing is the caller's job (the
local executor batches, a Celery task writes one file).

The execution id is made when the run starts. With ``RunContext.intent`` set, each call waits,
between its permit and its send, for the caller to make durable the record that stands if the
process dies mid-call (``died_record``: outcome ``worker_died``; the Celery worker's spool
journals it, ``storage.parquet.intents``).
"""

from __future__ import annotations

import contextvars
import functools
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from importlib.metadata import PackageNotFoundError, version

import structlog

from storage.records import ERROR_TEXT_MAX_CHARS, Attempt, Outcome, ParseOutcome, RunRecord, new_execution_id
from workers.clock import Clock, SystemClock
from workers.errors import IrbenchError, ModelRetired, ProtocolFailed, ProviderError
from workers.gate import ModelGate
from workers.ir_extract import extract_ir
from workers.limits.base import Limiter
from workers.providers.base import ChatRequest, Provider, Reply
from workers.retry import decide
from workers.runtask import ResponseLimits, RunTask
from workers.spend import Reservation, SpendMeter, reservation_tokens

log = structlog.get_logger("irbench.run")

@functools.cache  # importlib.metadata scans site-packages: ~1 ms a call, measured per run
def _package_version() -> str:
    try:
        return version("irbench")
    except PackageNotFoundError:
        return "0+unknown"


@dataclass(frozen=True)
class ExecuteSettings:
    """Knobs of the loop itself (not of one model)."""

    chars_per_token: float = 4.0  # prompt-token estimate for tokens/min accounting
    assumed_completion_tokens: int = 2048  # charged when a model has no max_tokens cap


@dataclass
class RunContext:
    """The side effects one run needs, injected."""

    provider_for: Callable[[RunTask], Provider]
    limiter: Limiter
    gate: ModelGate
    clock: Clock = field(default_factory=SystemClock)
    settings: ExecuteSettings = field(default_factory=ExecuteSettings)
    spend: SpendMeter | None = None  # the spend cap's meter (workers.spend), for tasks with ``spend_capped``
    #: awaited before each call with the record that stands if the process dies mid-call
    #: (``died_record``); returns once that record is durable. None: no journal.
    intent: Callable[[RunRecord], Awaitable[None]] | None = None


def _estimate_cost(task: RunTask, settings: ExecuteSettings) -> int:
    prompt = int(len(task.user_message) / settings.chars_per_token) + 1
    return prompt + (task.max_tokens if task.max_tokens is not None else settings.assumed_completion_tokens)


@functools.cache  # ~2.5 ms a call, per run on the event loop; providers only serialise it
def _ir_json_schema() -> dict[str, Any]:
    from storage.ir import IRDocument  # the IR's JSON schema, for constrained decoding

    return IRDocument.model_json_schema()


def _request(task: RunTask) -> ChatRequest:
    schema = _ir_json_schema() if task.structured_output else None
    return ChatRequest(
        model=task.model,
        user_message=task.user_message,
        timeouts=task.timeouts,
        max_tokens=task.max_tokens,
        temperature=task.temperature,
        reasoning=task.reasoning,
        json_schema=schema,
        stream=task.stream,
        options=dict(task.options),
        max_response_bytes=task.response.max_response_bytes,
    )


def _truncate(text: str) -> str:
    return text if len(text) <= ERROR_TEXT_MAX_CHARS else text[: ERROR_TEXT_MAX_CHARS - 1] + "…"


async def execute_run(task: RunTask, ctx: RunContext) -> RunRecord:
    """Execute ``task`` under its retry policy; return its record (never raises ProviderError).

    Logs one canonical ``run_finished`` line with campaign, run_id and model bound.
    """
    bound = _bind(task)
    try:
        record = await _execute(task, ctx)
        assert isinstance(record, RunRecord)
        log.info("run_finished", **finished_fields(record))
        return record
    finally:
        structlog.contextvars.reset_contextvars(**bound)


async def execute_run_deferred(task: RunTask, ctx: RunContext) -> RunRecord | PendingRecord:
    """``execute_run``, except that an answered run comes back as a ``PendingRecord``: its IR
    extraction and record validation are left to ``finish()`` (the local executor runs it in
    its writer process), and so is its ``run_finished`` line (``log_finished``)."""
    bound = _bind(task)
    try:
        record = await _execute(task, ctx, defer_extraction=True)
        if isinstance(record, RunRecord):
            log.info("run_finished", **finished_fields(record))
        return record
    finally:
        structlog.contextvars.reset_contextvars(**bound)


def _bind(task: RunTask) -> Mapping[str, contextvars.Token[Any]]:
    """Bind the run's campaign, run_id and model to every log line until ``reset_contextvars``
    with the returned tokens restores what was bound before: ``bound_contextvars``' effect
    without its generator-based context manager and its save/restore (3.6 -> 1.5 us a run)."""
    return structlog.contextvars.bind_contextvars(campaign=task.campaign, run_id=task.run_id, model=task.model)


def finished_fields(record: RunRecord) -> dict[str, Any]:
    """The fields of the ``run_finished`` log line, besides the bound campaign/run_id/model."""
    return dict(
        outcome=record.outcome.value,
        attempts=len(record.attempts),
        latency_ms=record.latency_ms,
        parse_outcome=record.parse_outcome.value,
        nodes=record.node_count,
        cancel_reason=record.cancel_reason,
    )


def log_finished(campaign: str, run_id: str, model: str, fields: dict[str, Any]) -> None:
    """The ``run_finished`` line of a run finished away from ``execute_run`` (a ``PendingRecord``);
    ``fields`` = ``finished_fields`` of its record."""
    log.info("run_finished", campaign=campaign, run_id=run_id, model=model, **fields)


@dataclass(frozen=True)
class PendingRecord:
    """An answered run's record less the IR extraction and validation (~0.5 ms of CPU per run,
    a quarter of the local executor's per-run CPU on the event loop; bench/writer_cpu.py): plain,
    picklable parts, so ``finish()`` can run in another process. ``finish()`` gives the same
    record ``execute_run`` would have returned (``finished_at`` was taken when the run ended)."""

    base: dict[str, Any]  # RunRecord fields; its ``attempts`` are ``Attempt``s, or their dicts once unpickled
    reply: Reply
    bounds: ResponseLimits

    @property
    def outcome(self) -> Outcome:
        return self.reply.outcome

    def finish(self) -> RunRecord:
        return _answered_record(self.base, self.reply, self.bounds)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with the attempts as dicts: an ``Attempt`` pickles through pydantic's
        Python-level ``__getstate__``/``__setstate__`` on both ends of the writer process's pipe
        (bench/writer_cpu.py measures the unpickling); the record validates the dicts back into the same
        ``Attempt``s. The rest unpickles in C (``__dict__`` restored, no ``__init__``)."""
        base = dict(self.base)
        base["attempts"] = [a if isinstance(a, dict) else dict(a.__dict__) for a in base["attempts"]]
        return {"base": base, "reply": self.reply, "bounds": self.bounds}


class _Run:
    """One run's attempts so far and how the last one ended (what its record is built from)."""

    def __init__(self, task: RunTask, ctx: RunContext) -> None:
        self.task, self.ctx = task, ctx
        self.measured_at = ctx.clock.now()
        self.started_s = ctx.clock.monotonic()
        self.execution_id = new_execution_id()  # before any call: the journal's intents carry it
        self.attempts: list[Attempt] = []
        self.reply: Reply | None = None
        self.error: ProviderError | None = None
        self.cancel_reason: str | None = None
        self.backoff_ms = 0.0  # time slept between attempts (part of total_latency_ms)
        self._rng: random.Random | None = None  # deterministic jitter per run, seeded on a first failure (~4 us)

    async def attempt(self, number: int, request: ChatRequest) -> bool:
        """Make attempt ``number`` under the spend cap and the limiter; True when it failed (a
        retry may follow)."""
        task, ctx = self.task, self.ctx
        self.cancel_reason = ctx.gate.closed_reason(task.model)
        if self.cancel_reason is not None:
            return False
        reservation = await self._reserve()
        if isinstance(reservation, str):
            self.cancel_reason = reservation
            return False
        used = (0, 0)
        try:
            failed, used = await self._permitted(number, request)
            return failed
        finally:
            if reservation is not None:
                assert ctx.spend is not None
                await ctx.spend.settle(reservation, *used)

    async def _reserve(self) -> Reservation | str | None:
        """The spend reservation of this attempt (None: not capped), or the reason it is refused."""
        task, ctx = self.task, self.ctx
        if ctx.spend is None or not task.spend_capped:
            return None
        s = ctx.settings
        return await ctx.spend.reserve(task, *reservation_tokens(task, s.chars_per_token, s.assumed_completion_tokens))

    async def _permitted(self, number: int, request: ChatRequest) -> tuple[bool, tuple[int, int]]:
        """The attempt under its permit: (failed, (prompt, completion) tokens the reply reported)."""
        task, ctx = self.task, self.ctx
        started = ctx.clock.now()
        try:
            permit = await ctx.limiter.acquire(task.model, task.limits, task.run_id, _estimate_cost(task, ctx.settings))
        except IrbenchError as exc:  # model disabled while we waited
            self.cancel_reason = str(exc) or "disabled"
            return False, (0, 0)
        actual_tokens: int | None = None
        t0 = ctx.clock.monotonic()
        try:
            if ctx.intent is not None:
                await ctx.intent(died_record(self, number, started))
                t0 = ctx.clock.monotonic()
            reply = await provider_call(ctx, task, request)
            self.reply, self.error = reply, None
            if reply.prompt_tokens is not None or reply.completion_tokens is not None:
                actual_tokens = (reply.prompt_tokens or 0) + (reply.completion_tokens or 0)
            self.attempts.append(Attempt(
                attempt=number, outcome=reply.outcome, started_at=started, latency_ms=reply.latency_ms,
                status_code=reply.status_code, bytes_received=reply.bytes_received,
            ))
            ctx.gate.observe(task.model, reply.outcome)
            return False, (reply.prompt_tokens or 0, reply.completion_tokens or 0)
        except ProviderError as exc:
            await self._failed(number, started, exc, exc.latency_ms or (ctx.clock.monotonic() - t0) * 1000.0)
            return True, (0, 0)
        finally:
            await ctx.limiter.release(permit, actual_tokens)

    async def _failed(self, number: int, started: Any, exc: ProviderError, latency_ms: float) -> None:
        task, ctx = self.task, self.ctx
        self.reply, self.error = None, exc
        self.attempts.append(Attempt(
            attempt=number, outcome=exc.outcome, started_at=started, latency_ms=latency_ms,
            status_code=exc.status_code, bytes_received=exc.bytes_received, retry_after_s=exc.retry_after_s,
            error=_truncate(str(exc)),
        ))
        detail = f"retired on {exc.retired_on}" if isinstance(exc, ModelRetired) and exc.retired_on else None
        ctx.gate.observe(task.model, exc.outcome, detail or _truncate(str(exc))[:200])
        if exc.outcome is Outcome.RATE_LIMITED and exc.retry_after_s:
            # an advertised wait beyond the cap cools the model for the cap only
            await ctx.limiter.cooldown(task.model, min(exc.retry_after_s, task.retry.max_retry_after_s))

    async def wait_to_retry(self, number: int) -> bool:
        """After failed attempt ``number``: sleep the backoff and return True, or False when the
        retry policy stops here."""
        clock, last = self.ctx.clock, self.attempts[-1]
        self._rng = self._rng or random.Random(self.task.run_id)
        decision = decide(last.outcome, number, self.task.retry, last.retry_after_s, self._rng,
                          clock.monotonic() - self.started_s)
        if not decision.retry:
            return False
        self.backoff_ms += await _sleep_ms(clock, decision.wait_s)
        return True


async def _execute(task: RunTask, ctx: RunContext, defer_extraction: bool = False) -> RunRecord | PendingRecord:
    run = _Run(task, ctx)
    request = _request(task)
    for number in range(1, task.retry.max_attempts + 1):
        if not await run.attempt(number, request) or not await run.wait_to_retry(number):
            break
    return _record(run, defer_extraction)


async def _sleep_ms(clock: Clock, seconds: float) -> float:
    """Sleep ``seconds``; return the time actually slept in ms (an overrun loop sleeps longer)."""
    t0 = clock.monotonic()
    await clock.sleep(seconds)
    return (clock.monotonic() - t0) * 1000.0


async def provider_call(ctx: RunContext, task: RunTask, request: ChatRequest) -> Reply:
    """One call; a ``RecursionError``/``MemoryError`` the answer provoked is a protocol_error
    attempt, never an exception out of the run."""
    try:
        return await ctx.provider_for(task).complete(request)
    except (RecursionError, MemoryError) as exc:
        raise ProtocolFailed(f"model={task.model}: the answer could not be processed ({type(exc).__name__})") from None


#: The error text of a ``worker_died`` attempt.
DIED_TEXT = "the worker died mid-call: the call was sent, its outcome is unknown"


def died_record(run: _Run, number: int, started: Any) -> RunRecord:
    """The record of ``run``'s execution if its process dies during attempt ``number`` (which
    began at ``started``): the attempts so far, then that one as ``worker_died`` (latency 0:
    unknown). ``finished_at`` is the attempt's start, so any later execution of the run is
    newer (``storage.runs.EXECUTION_RULE``)."""
    died = Attempt(attempt=number, outcome=Outcome.WORKER_DIED, started_at=started, latency_ms=0.0, error=DIED_TEXT)
    base = _base(run.task, run.measured_at, [*run.attempts, died], started)
    return RunRecord(**base, outcome=Outcome.WORKER_DIED, execution_id=run.execution_id)


def worker_error_record(task: RunTask, error_text: str, clock: Clock | None = None) -> RunRecord:
    """The record of a poison run: its task raised or killed its worker too often. No attempt
    is recorded (the failed executions left none); ``cancel_reason`` holds the failure text."""
    now = (clock or SystemClock()).now()
    base = _base(task, now, [], now)
    return RunRecord(**base, outcome=Outcome.WORKER_ERROR, cancel_reason=_truncate(error_text))


def _base(task: RunTask, measured_at, attempts: list[Attempt], finished_at) -> dict:
    return dict(
        run_id=task.run_id,
        campaign=task.campaign,
        panel=task.panel,
        prompt_sha256=task.prompt_sha256,
        prompt_name=task.prompt_name,
        prompt_license=task.prompt_license,
        prompt_source=task.prompt_source,
        model=task.model,
        endpoint=task.endpoint.name,
        wire_format=task.endpoint.wire_format,
        budget_max_tokens=task.budget_max_tokens,
        run_index=task.run_index,
        max_tokens=task.max_tokens,
        temperature=task.temperature,
        reasoning_enabled=task.reasoning,
        structured_output=task.structured_output,
        stream=task.stream,
        connect_timeout_s=task.timeouts.connect_timeout_s,
        read_timeout_s=task.timeouts.read_timeout_s,
        total_timeout_s=task.timeouts.total_timeout_s,
        instruction_version=task.instruction_version,
        instruction_sha256=task.instruction_sha256,
        measured_at=measured_at,
        measurement_date=task.measured_on or measured_at.date(),
        attempts=attempts,
        finished_at=finished_at,
        irbench_version=_package_version(),
        wave=task.wave,
        wave_started_at=task.wave_started_at,
    )


def _record(run: _Run, defer_extraction: bool = False) -> RunRecord | PendingRecord:
    task, attempts, error = run.task, run.attempts, run.error
    base = _base(task, run.measured_at, attempts, run.ctx.clock.now())
    base["execution_id"] = run.execution_id
    if not attempts:  # closed before the first call
        return RunRecord(**base, outcome=Outcome.CANCELLED, cancel_reason=run.cancel_reason or "cancelled")
    last = attempts[-1]
    base.update(latency_ms=last.latency_ms, status_code=last.status_code,
                total_latency_ms=sum(a.latency_ms for a in attempts) + run.backoff_ms)
    if run.reply is None:
        retired_on = error.retired_on if isinstance(error, ModelRetired) else None
        head = error.body_head if error is not None else None  # a body refused as too large
        # closed between a failed attempt and its retry: the run was stopped, not answered with
        # that failure (one outcome per run; the attempts keep what each call met)
        outcome = Outcome.CANCELLED if run.cancel_reason is not None else last.outcome
        return RunRecord(
            **base, outcome=outcome, retired_on=retired_on, cancel_reason=run.cancel_reason, response_text=head,
            first_token_ms=error.first_token_ms if error is not None else None,
        )
    if defer_extraction:
        return PendingRecord(base, run.reply, task.response)
    return _answered_record(base, run.reply, task.response)


def _answered_record(base: dict[str, Any], reply: Reply, bounds: ResponseLimits) -> RunRecord:
    extraction = extract_ir(
        reply.answer_text,
        budget_exhausted=reply.outcome is Outcome.TRUNCATED,
        max_chars=bounds.max_answer_chars,
        max_depth=bounds.max_json_depth,
        max_nodes=bounds.max_ir_nodes,
    )
    return RunRecord(
        **base,
        outcome=reply.outcome,
        finish_reason=reply.finish_reason,
        response_text=reply.answer_text,
        reasoning_text=reply.reasoning_text or None,
        answer_chars=len(reply.answer_text),
        reasoning_chars=len(reply.reasoning_text),
        prompt_tokens=reply.prompt_tokens,
        completion_tokens=reply.completion_tokens,
        reasoning_tokens=reply.reasoning_tokens,
        first_token_ms=reply.first_token_ms,
        stream_duration_ms=reply.stream_duration_ms,
        parse_outcome=extraction.parse_outcome if reply.answer_text else ParseOutcome.EMPTY,
        parse_repairs=list(extraction.repairs),
        ir_json=extraction.ir_json,
        node_ids=list(extraction.node_ids),
        node_count=extraction.node_count,
        duplicate_id_count=extraction.duplicate_id_count,
        served_model=reply.served.model,
        system_fingerprint=reply.served.system_fingerprint,
        served_digest=reply.served.digest,
    )
