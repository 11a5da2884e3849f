"""Every byte from an endpoint is hostile: a lying server on loopback, both wire formats.

Each test counts both sides: what the endpoint received (``HostileServer.received``) and what
the store holds (one record per run, the right failures.md class, bounded text).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from orchestrator.campaign.instruction import load_instruction
from orchestrator.local.executor import LocalOptions, run_local
from storage.records import Outcome, ParseOutcome, RunRecord
from storage.runs import RunStore
from tests.support.hostile_server import hostile_server
from workers.runtask import EndpointRef, ModelLimits, ResponseLimits, RetryPolicy, RunTask
from workers.secrets import SECRET_MARKER

KEY = "sk-hostileTEST-0a1b2c3d4e5f60718293"
WIRES = ("openai", "ollama")


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    with hostile_server() as s:
        yield s


def _tasks(model: str, base_url: str, wire: str, n: int = 1, **overrides) -> list[RunTask]:  # type: ignore[no-untyped-def]
    instr = load_instruction(None)
    fields = dict(
        campaign="hostile", panel="hostile", model=model,
        endpoint=EndpointRef(name="h", base_url=base_url, wire_format=wire, api_key_env="HOSTILE_KEY"),
        prompt_sha256="b" * 64, prompt_name="p.txt", user_message=instr.render("p.txt", "Say hi."),
        instruction_version=instr.version, instruction_sha256=instr.sha256,
        limits=ModelLimits(max_concurrency=1),
        retry=RetryPolicy(max_attempts=3, backoff_base_s=0.01, backoff_cap_s=0.02),
    )
    fields.update(overrides)
    return [RunTask(run_id=f"{wire}-{model}-{i}", run_index=i, **fields) for i in range(n)]


def _run(server, tmp_path: Path, model: str, wire: str, n: int = 1, **overrides) -> list[RunRecord]:  # type: ignore[no-untyped-def]
    store = RunStore(tmp_path / f"data-{wire}-{model}")
    before = server.requests_for(model)
    tasks = _tasks(model, server.base_url, wire, n, **overrides)
    asyncio.run(run_local(tasks, store, secrets={"HOSTILE_KEY": KEY}, options=LocalOptions()))
    records = sorted(store.read_records(), key=lambda r: r.run_id)
    assert [r.run_id for r in records] == sorted(t.run_id for t in tasks)  # one stored record per run
    _run.requests = server.requests_for(model) - before  # type: ignore[attr-defined]
    return records


# (model, outcome, requests the endpoint sees per run)
CLASSIFIED = [
    ("deep-body", Outcome.PROTOCOL_ERROR, 1),
    ("invalid-json", Outcome.PROTOCOL_ERROR, 1),
    ("html", Outcome.PROTOCOL_ERROR, 1),
    ("nul", Outcome.PROTOCOL_ERROR, 1),
    ("empty-choices", Outcome.PROTOCOL_ERROR, 1),
    ("choices-not-list", Outcome.PROTOCOL_ERROR, 1),
    ("wrong-length", Outcome.PROTOCOL_ERROR, 1),
    ("content-null", Outcome.EMPTY, 1),
    ("echo-key-error", Outcome.SERVER_ERROR, 3),  # retried up to max_attempts
]


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize(("model", "outcome", "requests"), CLASSIFIED)
def test_broken_answers_are_classified_and_stored(server, tmp_path: Path, wire: str, model: str,
                                                  outcome: Outcome, requests: int) -> None:  # type: ignore[no-untyped-def]
    (record,) = _run(server, tmp_path, model, wire)
    assert _run.requests == requests  # type: ignore[attr-defined]
    assert record.outcome is outcome and len(record.attempts) == requests
    assert all(a.outcome is outcome for a in record.attempts)
    assert KEY not in record.model_dump_json()


@pytest.mark.parametrize("wire", WIRES)
def test_unpaired_surrogate_escapes_are_stored_not_a_crash(server, tmp_path: Path, wire: str) -> None:  # type: ignore[no-untyped-def]
    """An unpaired ``\\ud800`` escape is valid JSON but decodes to a lone surrogate, which no UTF-8
    store holds: kept as is it would fail the whole Parquet batch (and every resume). The texts keep
    U+FFFD in its place and an IR holding one is schema_invalid."""
    records = _run(server, tmp_path, "lone-surrogate", wire, n=3)
    assert _run.requests == 3  # type: ignore[attr-defined]
    for record in records:
        assert record.outcome is Outcome.OK and record.parse_outcome is ParseOutcome.SCHEMA_INVALID
        assert record.response_text is not None and record.response_text.startswith("x\ufffd")
        assert record.reasoning_text == "think \ufffd" and record.ir_json is None


@pytest.mark.parametrize("wire", WIRES)
def test_deeply_nested_answer_is_invalid_json_not_a_crash(server, tmp_path: Path, wire: str) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    records = _run(server, tmp_path, "deep-answer", wire, n=2)
    assert _run.requests == 2  # type: ignore[attr-defined]
    for r in records:
        assert r.outcome is Outcome.OK and r.parse_outcome is ParseOutcome.INVALID_JSON
        assert r.response_text == "[" * 100_000 + "]" * 100_000  # the raw answer is kept whole
    assert time.monotonic() - t0 < 30  # an unbounded bracket scan runs for minutes; generous for a loaded CI


@pytest.mark.parametrize("wire", WIRES)
def test_body_over_max_response_bytes_is_protocol_error_with_first_kib(server, tmp_path: Path, wire: str) -> None:  # type: ignore[no-untyped-def]
    limits = ResponseLimits(max_response_bytes=64 * 1024)
    (record,) = _run(server, tmp_path, "big-body-300000", wire, response=limits)
    assert _run.requests == 1  # type: ignore[attr-defined]
    assert record.outcome is Outcome.PROTOCOL_ERROR
    assert "max_response_bytes=65536" in record.attempts[0].error
    assert record.response_text is not None and len(record.response_text) == 1024
    assert record.response_text.startswith("{")
    # under the bound the same body is a normal answer
    (ok,) = _run(server, tmp_path, "big-body-30000", wire, response=limits)
    assert ok.outcome is Outcome.OK and ok.succeeded


def test_endless_chunked_body_stops_at_the_bound(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    limits = ResponseLimits(max_response_bytes=1024 * 1024)
    (record,) = _run(server, tmp_path, "endless-chunked", "openai", response=limits)
    assert _run.requests == 1  # type: ignore[attr-defined]
    assert record.outcome is Outcome.PROTOCOL_ERROR and "max_response_bytes" in record.attempts[0].error
    # the client hung up soon after the bound: the server wrote at most the bound plus socket buffers
    assert server.bytes_sent["endless-chunked"] < 16 * 1024 * 1024


def test_default_bound_refuses_a_10_mb_body(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (record,) = _run(server, tmp_path, "big-body-10000000", "openai")
    assert record.outcome is Outcome.PROTOCOL_ERROR
    assert f"max_response_bytes={8 * 1024 * 1024}" in record.attempts[0].error
    assert len(record.response_text or "") == 1024


@pytest.mark.parametrize("wire", WIRES)
def test_answer_over_max_answer_chars_is_stored_but_not_parsed(server, tmp_path: Path, wire: str) -> None:  # type: ignore[no-untyped-def]
    (record,) = _run(server, tmp_path, "big-answer-2000000", wire)
    assert record.outcome is Outcome.OK and record.parse_outcome is ParseOutcome.INVALID_JSON
    assert record.answer_chars > 1024 * 1024 and len(record.response_text or "") == record.answer_chars
    assert record.ir_json is None


@pytest.mark.parametrize("wire", WIRES)
def test_echoed_key_in_a_200_answer_is_masked(server, tmp_path: Path, wire: str) -> None:  # type: ignore[no-untyped-def]
    (record,) = _run(server, tmp_path, "echo-key", wire)
    sent = [r for r in server.received if r["body"].get("model") == "echo-key"][-1]
    assert sent["headers"]["authorization"] == f"Bearer {KEY}"  # the key did reach the endpoint
    assert KEY not in record.model_dump_json()
    assert SECRET_MARKER in (record.response_text or "") and SECRET_MARKER in (record.reasoning_text or "")
    assert record.finish_reason == SECRET_MARKER
    # the key with zero-width spaces between its characters: masked once they are dropped
    assert record.served_model == SECRET_MARKER
    assert record.served_digest == (SECRET_MARKER if wire == "ollama" else None)  # Ollama's from /api/tags
    assert record.succeeded  # masking left the IR itself intact


def test_retry_after_above_the_cap_ends_the_run_rate_limited(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    (record,) = _run(server, tmp_path, "retry-after-999999999", "openai",
                     retry=RetryPolicy(max_attempts=4, max_retry_after_s=120))
    assert time.monotonic() - t0 < 30
    assert _run.requests == 1  # type: ignore[attr-defined]
    assert record.outcome is Outcome.RATE_LIMITED
    assert record.attempts[0].retry_after_s == 999999999  # the advertised value is stored


def test_retry_after_under_the_cap_is_honoured(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    (record,) = _run(server, tmp_path, "retry-after-1", "openai",
                     retry=RetryPolicy(max_attempts=2, backoff_base_s=0.01, max_retry_after_s=5))
    assert time.monotonic() - t0 >= 1.0
    assert _run.requests == 2 and len(record.attempts) == 2  # type: ignore[attr-defined]


def test_no_wait_outlives_the_run_deadline(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    (record,) = _run(server, tmp_path, "retry-after-3", "openai",
                     retry=RetryPolicy(max_attempts=4, max_retry_after_s=120, run_deadline_s=2.0))
    assert time.monotonic() - t0 < 2.0 + 10  # not 3 x 3 s of waits; slack for CI load
    assert _run.requests == 1 and record.outcome is Outcome.RATE_LIMITED  # type: ignore[attr-defined]


def test_decide_caps_retry_after_and_respects_the_run_deadline() -> None:
    import random

    from workers.retry import decide

    policy = RetryPolicy(max_attempts=5, backoff_base_s=1, backoff_cap_s=4, max_retry_after_s=120, run_deadline_s=600)
    rng = random.Random(0)
    assert decide(Outcome.RATE_LIMITED, 1, policy, 120.0, rng).wait_s == 120.0  # at the cap: honoured
    assert not decide(Outcome.RATE_LIMITED, 1, policy, 120.5, rng).retry  # above it: the run ends
    assert not decide(Outcome.SERVER_ERROR, 1, policy, 999999999.0, rng).retry
    assert decide(Outcome.RATE_LIMITED, 1, policy, 100.0, rng, elapsed_s=499.0).retry
    assert not decide(Outcome.RATE_LIMITED, 1, policy, 100.0, rng, elapsed_s=500.0).retry  # would end past 600 s
    unbounded = policy.model_copy(update={"run_deadline_s": None})
    assert decide(Outcome.RATE_LIMITED, 1, unbounded, 100.0, rng, elapsed_s=1e9).retry


def test_provider_refuses_a_port_out_of_range() -> None:
    import httpx

    from workers.errors import ConfigError
    from workers.providers.openai_compat import OpenAIProvider

    with pytest.raises(ConfigError, match="port 99999 is not in 1-65535"):
        OpenAIProvider(httpx.AsyncClient(), "http://127.0.0.1:99999", None)


@pytest.mark.parametrize("wire", WIRES)
def test_the_served_identity_is_bounded_masked_and_typed(server, tmp_path: Path, wire: str) -> None:  # type: ignore[no-untyped-def]
    from storage.records import SERVED_IDENTITY_MAX_CHARS

    (record,) = _run(server, tmp_path, "hostile-identity", wire)
    assert record.outcome is Outcome.OK and record.served_model == "m" * SERVED_IDENTITY_MAX_CHARS
    assert record.served_digest is None  # a number is not a digest
    # read wherever given: control characters dropped, the echoed key masked
    assert record.system_fingerprint == f"fp[31m{SECRET_MARKER}end-{SECRET_MARKER}"


def test_a_served_identity_never_keeps_a_key_hidden_or_cut() -> None:
    from storage.records import SERVED_IDENTITY_MAX_CHARS
    from workers.providers._text import IDENTITY_SCAN_CHARS, identity_text

    assert identity_text("\x00".join(KEY), [KEY]) == SECRET_MARKER  # whole once the NULs are gone
    # the key straddles the end of what is read: no start of it is kept
    cut = identity_text("\x00" * (IDENTITY_SCAN_CHARS - 10) + KEY, [KEY])
    assert cut is None
    tail = "v" * (IDENTITY_SCAN_CHARS - 10) + KEY
    assert identity_text(tail, [KEY]) == "v" * SERVED_IDENTITY_MAX_CHARS
    assert identity_text("v" * 190 + KEY, [KEY]) == "v" * 190 + SECRET_MARKER  # masked before the cut
    assert identity_text("served-v2", [KEY]) == "served-v2" and identity_text("\x00\u200b", [KEY]) is None
