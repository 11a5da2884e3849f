"""The execution loop against the simulator over loopback: retries, retirement, timeouts."""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
from pathlib import Path

import pytest

from orchestrator.campaign.instruction import load_instruction
from orchestrator.local.executor import LocalOptions, run_local
from simulator.config import SimConfig, SimModel
from simulator.server import start_background
from storage.records import Outcome
from storage.runs import RunStore
from workers.clock import SystemClock
from workers.errors import ServerFailed
from workers.execute import RunContext, execute_run
from workers.gate import MemoryGate
from workers.limits.memory import MemoryLimiter
from workers.providers.base import ChatRequest, Reply
from workers.runtask import EndpointRef, ModelLimits, RetryPolicy, RunTask, TimeoutPolicy

PROMPT = """// @rule RULE:GREETING category=style priority=1
Say hello.
// @condition CONDITION:VIP
{% if user.vip %}
// @rule RULE:VIP_TONE category=style priority=2 conditionRef=CONDITION:VIP
Be extra polite.
{% endif %}
// @breakpoint BREAKPOINT:END
"""


def _tasks(model: str, base_url: str, n: int, **overrides) -> list[RunTask]:
    instr = load_instruction(None)
    fields = dict(
        campaign="t",
        panel="t",
        model=model,
        endpoint=EndpointRef(name="sim", base_url=base_url),
        prompt_sha256="a" * 64,
        prompt_name="hello.prompt.rtpl",
        user_message=instr.render("hello.prompt.rtpl", PROMPT),
        instruction_version=instr.version,
        instruction_sha256=instr.sha256,
        limits=ModelLimits(max_concurrency=1),
        retry=RetryPolicy(max_attempts=4, backoff_base_s=0.01, backoff_cap_s=0.05),
    )
    fields.update(overrides)
    return [RunTask(run_id=f"{model}-{i:04d}", run_index=i, **fields) for i in range(n)]


def _requests(base_url: str, model: str) -> int:
    with urllib.request.urlopen(f"{base_url}/_stats") as resp:
        stats = json.load(resp)
    models = stats.get("models", stats)
    entry = models.get(model, {})
    return int(entry.get("total", entry.get("requests", 0)))


def _run(tasks, tmp_path: Path):
    store = RunStore(tmp_path / "data")
    summary = asyncio.run(run_local(tasks, store, secrets={}, options=LocalOptions()))
    return store, summary


def test_retired_model_stops_calls_and_cancels_the_rest(tmp_path: Path) -> None:
    cfg = SimConfig(seed=1, models={"old": SimModel(retired_after_requests=3, retired_on="2026-08-01",
                                                     retirement_reference="RET-7")})
    with start_background(cfg) as sim:
        store, summary = _run(_tasks("old", sim.base_url, 10), tmp_path)
        assert _requests(sim.base_url, "old") == 4  # 3 answers, one 410, nothing after
    records = {r.run_id: r for r in store.read_records()}
    outcomes = sorted(r.outcome.value for r in records.values())
    assert outcomes.count("ok") == 3 and outcomes.count("retired") == 1 and outcomes.count("cancelled") == 6
    retired = next(r for r in records.values() if r.outcome is Outcome.RETIRED)
    assert retired.retired_on == "2026-08-01" and len(retired.attempts) == 1  # never retried
    cancelled = [r for r in records.values() if r.outcome is Outcome.CANCELLED]
    assert all(r.cancel_reason and r.cancel_reason.startswith("retired") and not r.attempts for r in cancelled)


def test_server_errors_are_retried_and_every_attempt_kept(tmp_path: Path) -> None:
    cfg = SimConfig(seed=3, models={"flaky": SimModel(server_error_prob=0.5)})
    with start_background(cfg) as sim:
        store, _ = _run(_tasks("flaky", sim.base_url, 12), tmp_path)
        calls = _requests(sim.base_url, "flaky")
    records = store.read_records()
    attempts = sum(len(r.attempts) for r in records)
    assert attempts == calls  # every HTTP call is recorded as an attempt
    assert any(len(r.attempts) > 1 for r in records)
    for r in records:
        assert [a.attempt for a in r.attempts] == list(range(1, len(r.attempts) + 1))
        assert r.outcome == r.attempts[-1].outcome  # a run's class is its last attempt's
        assert all(a.outcome is Outcome.SERVER_ERROR for a in r.attempts[:-1])


def test_hang_is_cut_at_the_total_deadline(tmp_path: Path) -> None:
    cfg = SimConfig(seed=2, models={"hang": SimModel(hang_prob=1.0, hang_s=30.0), "fine": SimModel()})
    deadline_s = 2.0  # long enough that event-loop jitter on a loaded CI box stays inside ±10 %
    timeouts = TimeoutPolicy(connect_timeout_s=2.0, read_timeout_s=None, total_timeout_s=deadline_s)
    with start_background(cfg) as sim:
        tasks = _tasks("hang", sim.base_url, 2, timeouts=timeouts) + _tasks("fine", sim.base_url, 4)
        t0 = time.monotonic()
        store, _ = _run(tasks, tmp_path)
        elapsed = time.monotonic() - t0
    records = store.read_records()
    hung = [r for r in records if r.model == "hang"]
    assert all(r.outcome is Outcome.TIMEOUT_TOTAL for r in hung)
    for r in hung:
        assert abs(r.latency_ms / 1000 - deadline_s) <= 0.1 * deadline_s + 0.05
        assert r.total_timeout_s == deadline_s
    assert all(r.outcome is Outcome.OK for r in records if r.model == "fine")
    assert elapsed < 2 * deadline_s + 3  # serial hangs, not 30 s each


def test_rate_limited_calls_cool_down_and_complete(tmp_path: Path) -> None:
    cfg = SimConfig(seed=5, models={"busy": SimModel(rate_limit_prob=0.4, retry_after_s=1)})
    with start_background(cfg) as sim:
        tasks = _tasks("busy", sim.base_url, 6, retry=RetryPolicy(max_attempts=8, backoff_base_s=0.01))
        store, _ = _run(tasks, tmp_path)
    records = store.read_records()
    assert all(r.outcome is Outcome.OK for r in records)
    limited = [a for r in records for a in r.attempts if a.outcome is Outcome.RATE_LIMITED]
    assert limited and all(a.retry_after_s == pytest.approx(1.0) for a in limited)
    # after each 429 the next attempt of that run starts no earlier than Retry-After
    for r in records:
        for prev, nxt in zip(r.attempts, r.attempts[1:]):
            if prev.outcome is Outcome.RATE_LIMITED:
                gap = (nxt.started_at - prev.started_at).total_seconds() * 1000 - prev.latency_ms
                assert gap >= 1000 - 50


def test_total_latency_covers_every_attempt_and_the_backoff_waits(tmp_path: Path) -> None:
    """``latency_ms`` is the final attempt's; ``total_latency_ms`` adds the earlier attempts and
    the waits between them, checked against the attempts' own start stamps (no rate limit here,
    so the gap between two starts is one attempt plus one backoff wait)."""
    cfg = SimConfig(seed=11, models={"flaky": SimModel(server_error_prob=0.6, latency_ms_median=20)})
    with start_background(cfg) as sim:
        tasks = _tasks("flaky", sim.base_url, 12, retry=RetryPolicy(max_attempts=5, backoff_base_s=0.15,
                                                                     backoff_cap_s=0.3))
        store, _ = _run(tasks, tmp_path)
    records = store.read_records()
    retried = [r for r in records if len(r.attempts) > 1]
    assert retried, "the seed should make some runs retry"
    for r in records:
        first, last = r.attempts[0], r.attempts[-1]
        assert r.latency_ms == last.latency_ms
        wall_ms = (last.started_at - first.started_at).total_seconds() * 1000 + last.latency_ms
        assert r.total_latency_ms == pytest.approx(wall_ms, abs=15 + 5 * len(r.attempts))
        assert r.total_latency_ms >= sum(a.latency_ms for a in r.attempts)
    # the backoff waits (full jitter, deterministic per run_id) are in the total, not in latency_ms
    waits_ms = sum(r.total_latency_ms - sum(a.latency_ms for a in r.attempts) for r in retried)
    assert waits_ms > 100
    assert sum(r.total_latency_ms for r in retried) > sum(r.latency_ms for r in retried) + waits_ms


class _SleepRecorder(SystemClock):
    """The system clock, except that sleeps are recorded and return at once."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


class _FailTwice:
    """A provider whose first two calls fail with a server error and whose third answers."""

    wire_format = "openai"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ChatRequest) -> Reply:
        self.calls += 1
        if self.calls <= 2:
            raise ServerFailed("model=m: HTTP 500", status_code=500)
        return Reply(Outcome.OK, '{"nodes": []}', "", 1.0)


def test_the_backoff_waits_are_the_jitter_seeded_by_the_run_id() -> None:
    """The retry waits are full jitter drawn from ``random.Random(run_id)``: the same run waits
    the same whatever ran before it (the generator is made on the run's first failure)."""
    task = _tasks("m", "http://127.0.0.1:9", 1, retry=RetryPolicy(max_attempts=3, backoff_base_s=0.5, backoff_cap_s=4))[0]
    clock, provider = _SleepRecorder(), _FailTwice()
    ctx = RunContext(provider_for=lambda _t: provider, limiter=MemoryLimiter(), gate=MemoryGate(10), clock=clock)
    record = asyncio.run(execute_run(task, ctx))
    assert [a.outcome for a in record.attempts] == [Outcome.SERVER_ERROR, Outcome.SERVER_ERROR, Outcome.OK]
    rng = random.Random(task.run_id)
    assert clock.slept == [rng.uniform(0.0, 0.5), rng.uniform(0.0, 1.0)]


class _CancelDuringBackoff(_SleepRecorder):
    """Closes the run's model (a cancel) while the run waits to retry."""

    def __init__(self, gate: MemoryGate, model: str) -> None:
        super().__init__()
        self.gate, self.model = gate, model

    async def sleep(self, seconds: float) -> None:
        await super().sleep(seconds)
        self.gate.close(self.model, "cancelled by test")


def test_a_run_cancelled_between_attempts_is_cancelled_with_its_attempts_kept() -> None:
    task = _tasks("m", "http://127.0.0.1:9", 1, retry=RetryPolicy(max_attempts=3, backoff_base_s=0.5, backoff_cap_s=4))[0]
    gate, provider = MemoryGate(10), _FailTwice()
    ctx = RunContext(provider_for=lambda _t: provider, limiter=MemoryLimiter(), gate=gate,
                     clock=_CancelDuringBackoff(gate, "m"))
    record = asyncio.run(execute_run(task, ctx))
    assert provider.calls == 1  # the retry was never sent
    assert record.outcome is Outcome.CANCELLED and record.cancel_reason == "cancelled by test"
    assert [a.outcome for a in record.attempts] == [Outcome.SERVER_ERROR]  # what the one call met


def test_each_call_waits_for_its_intent_the_record_if_the_worker_dies_then() -> None:
    """``RunContext.intent`` is awaited before each send, with the record that stands if the
    process dies during that call: the same execution id as the final record, the attempts so
    far and the one in flight as ``worker_died``, finished at that attempt's start."""
    task = _tasks("m", "http://127.0.0.1:9", 1, retry=RetryPolicy(max_attempts=3, backoff_base_s=0.5, backoff_cap_s=4))[0]
    provider = _FailTwice()
    intents: list[tuple[int, object]] = []

    async def intend(record) -> None:
        intents.append((provider.calls, record))  # calls made before this one's send

    ctx = RunContext(provider_for=lambda _t: provider, limiter=MemoryLimiter(), gate=MemoryGate(10),
                     clock=_SleepRecorder(), intent=intend)
    record = asyncio.run(execute_run(task, ctx))
    assert [calls for calls, _ in intents] == [0, 1, 2]  # one intent per call, before it
    for n, (_, died) in enumerate(intents, start=1):
        assert died.execution_id == record.execution_id and died.outcome is Outcome.WORKER_DIED
        assert [a.outcome for a in died.attempts] == [Outcome.SERVER_ERROR] * (n - 1) + [Outcome.WORKER_DIED]
        assert died.finished_at == died.attempts[-1].started_at < record.finished_at
