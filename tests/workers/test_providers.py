"""Provider clients against a scripted endpoint over real loopback HTTP."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

import httpx
import pytest

from storage.records import ERROR_TEXT_MAX_CHARS, Outcome
from workers import errors
from workers.providers import _http
from workers.providers.base import ChatRequest, Provider, Reply
from workers.providers.ollama import OllamaProvider
from workers.providers.openai_compat import OpenAIDialect, OpenAIProvider
from workers.providers.registry import make_http_client, make_provider
from workers.runtask import EndpointRef, TimeoutPolicy

from tests.support.scripted_server import (
    REASONING,
    RETIRED_MESSAGE,
    closed_port,
    full_backlog_server,
    garbage_server,
    scripted_server,
)

KEY = "sk-test-SECRET-0123456789abcdef"
FAST = TimeoutPolicy(connect_timeout_s=2.0, read_timeout_s=5.0, total_timeout_s=10.0)
# 2026-10-21 07:26:00 UTC: two minutes before the scripted Retry-After HTTP-date
FROZEN_NOW = dt.datetime(2026, 10, 21, 7, 26, 0, tzinfo=dt.timezone.utc)
WIRE_FORMATS = ["openai", "ollama"]


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    with scripted_server() as srv:
        yield srv


def make(wire: str, client: httpx.AsyncClient, base_url: str, **kw: Any) -> Provider:
    cls = OpenAIProvider if wire == "openai" else OllamaProvider
    return cls(client, base_url, KEY, now=lambda: FROZEN_NOW, **kw)


def call(
    wire: str, base_url: str, model: str, timeouts: TimeoutPolicy = FAST, **request_kw: Any
) -> Reply:
    async def go() -> Reply:
        async with make_http_client() as client:
            return await make(wire, client, base_url).complete(
                ChatRequest(model=model, user_message="emit the IR", timeouts=timeouts, **request_kw)
            )

    return asyncio.run(go())


def call_error(wire: str, base_url: str, model: str, timeouts: TimeoutPolicy = FAST) -> errors.ProviderError:
    with pytest.raises(errors.ProviderError) as info:
        call(wire, base_url, model, timeouts)
    exc = info.value
    assert KEY not in str(exc), "the API key leaked into an error message"
    assert len(str(exc)) <= ERROR_TEXT_MAX_CHARS
    assert exc.latency_ms > 0
    return exc


# ---------------------------------------------------------------- 2xx outcomes


@pytest.mark.parametrize("wire", WIRE_FORMATS)
def test_ok_answer_and_usage(server, wire: str) -> None:  # type: ignore[no-untyped-def]
    reply = call(wire, server.base_url, "ok", max_tokens=1500, temperature=0.0)
    assert reply.outcome == Outcome.OK
    assert reply.answer_text.startswith('{"version": 1')
    assert reply.reasoning_text == ""
    assert reply.status_code == 200
    assert reply.bytes_received > len(reply.answer_text)
    assert reply.latency_ms > 0
    assert reply.finish_reason == "stop"
    if wire == "openai":
        assert (reply.prompt_tokens, reply.completion_tokens, reply.reasoning_tokens) == (11, 22, 5)
    else:
        assert (reply.prompt_tokens, reply.completion_tokens, reply.reasoning_tokens) == (13, 31, None)


@pytest.mark.parametrize("wire", WIRE_FORMATS)
def test_fenced_answer_is_returned_verbatim(server, wire: str) -> None:  # type: ignore[no-untyped-def]
    reply = call(wire, server.base_url, "fenced")
    assert reply.outcome == Outcome.OK
    assert reply.answer_text.startswith("```json\n")  # extraction, not the provider, strips it


@pytest.mark.parametrize(
    ("wire", "model"), [("openai", "reasoning"), ("openai", "reasoning-alt"), ("ollama", "reasoning")]
)
def test_reasoning_is_kept_apart_from_the_answer(server, wire: str, model: str) -> None:  # type: ignore[no-untyped-def]
    reply = call(wire, server.base_url, model)
    assert reply.outcome == Outcome.OK
    assert reply.reasoning_text == REASONING
    assert REASONING not in reply.answer_text


@pytest.mark.parametrize("wire", WIRE_FORMATS)
def test_think_block_is_split_out_of_content(server, wire: str) -> None:  # type: ignore[no-untyped-def]
    reply = call(wire, server.base_url, "think")
    assert reply.outcome == Outcome.OK
    assert reply.reasoning_text == REASONING
    assert reply.answer_text.startswith("{") and "<think>" not in reply.answer_text


@pytest.mark.parametrize("wire", WIRE_FORMATS)
def test_empty_content_is_empty(server, wire: str) -> None:  # type: ignore[no-untyped-def]
    reply = call(wire, server.base_url, "empty")
    assert reply.outcome == Outcome.EMPTY
    assert reply.answer_text == ""


@pytest.mark.parametrize("wire", WIRE_FORMATS)
@pytest.mark.parametrize("model", ["length", "length-empty"])
def test_length_finish_is_truncated_even_when_empty(server, wire: str, model: str) -> None:  # type: ignore[no-untyped-def]
    reply = call(wire, server.base_url, model)
    assert reply.outcome == Outcome.TRUNCATED
    assert reply.finish_reason == "length"
    assert reply.reasoning_text == REASONING
    assert (reply.answer_text == "") == (model == "length-empty")


# ---------------------------------------------------------------- what is sent


def test_openai_request_body_and_headers(server) -> None:  # type: ignore[no-untyped-def]
    schema = {"type": "object", "properties": {"nodes": {"type": "array"}}}
    call("openai", server.base_url + "/v1/", "ok", max_tokens=1500, temperature=0.0, json_schema=schema,
         reasoning=False, options={"seed": 7})
    seen = server.received[-1]
    assert seen["path"] == "/v1/chat/completions"
    body = seen["body"]
    assert body["max_tokens"] == 1500 and "max_completion_tokens" not in body
    assert body["temperature"] == 0.0 and body["stream"] is False and body["seed"] == 7
    assert body["messages"] == [{"role": "user", "content": "emit the IR"}]
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == schema
    assert body["reasoning_effort"] == "none"
    assert seen["headers"]["cache-control"] == "no-store"
    assert seen["headers"]["authorization"] == f"Bearer {KEY}"


def test_openai_max_completion_tokens_and_no_cap(server) -> None:  # type: ignore[no-untyped-def]
    async def go() -> None:
        async with make_http_client() as client:
            dialect = OpenAIDialect(max_tokens_param="max_completion_tokens")
            provider = OpenAIProvider(client, server.base_url, None, dialect=dialect)
            await provider.complete(ChatRequest(model="ok", user_message="x", timeouts=FAST, max_tokens=8000))
            body = server.received[-1]["body"]
            assert body["max_completion_tokens"] == 8000 and "max_tokens" not in body
            assert "authorization" not in server.received[-1]["headers"]
            await provider.complete(ChatRequest(model="ok", user_message="x", timeouts=FAST))
            body = server.received[-1]["body"]
            # the study's harness: no cap, no temperature given -> neither field is sent
            assert "max_completion_tokens" not in body and "max_tokens" not in body
            assert "temperature" not in body and "reasoning_effort" not in body

    asyncio.run(go())


def test_ollama_request_body(server) -> None:  # type: ignore[no-untyped-def]
    schema = {"type": "object"}
    call("ollama", server.base_url + "/api", "ok", max_tokens=1500, temperature=0.2, reasoning=True,
         json_schema=schema, options={"num_ctx": 8192})
    seen = server.received[-1]
    assert seen["path"] == "/api/chat"
    body = seen["body"]
    assert body["options"] == {"num_predict": 1500, "temperature": 0.2, "num_ctx": 8192}
    assert "max_tokens" not in body
    assert body["think"] is True and body["format"] == schema and body["stream"] is False
    assert seen["headers"]["cache-control"] == "no-store"


@pytest.mark.parametrize("wire", WIRE_FORMATS)
def test_list_models(server, wire: str) -> None:  # type: ignore[no-untyped-def]
    async def go() -> list[str]:
        async with make_http_client() as client:
            return await make(wire, client, server.base_url).list_models(FAST)

    assert asyncio.run(go()) == ["ok", "gemma3:12b"]


# ---------------------------------------------------------------- status classes


@pytest.mark.parametrize("wire", WIRE_FORMATS)
@pytest.mark.parametrize(
    ("model", "cls", "status"),
    [
        ("not-found", errors.ModelNotFound, 404),
        ("auth", errors.AuthFailed, 401),
        ("forbidden", errors.AuthFailed, 403),
        ("bad-request", errors.ClientFailed, 400),
        ("server-error", errors.ServerFailed, 500),
        ("unavailable", errors.ServerFailed, 503),
        ("malformed", errors.ProtocolFailed, 200),
        ("wrong-shape", errors.ProtocolFailed, 200),
    ],
)
def test_status_classes(server, wire: str, model: str, cls: type, status: int) -> None:  # type: ignore[no-untyped-def]
    exc = call_error(wire, server.base_url, model)
    assert type(exc) is cls
    assert exc.status_code == status
    assert exc.bytes_received > 0
    assert model != "auth" or "[redacted]" in str(exc)  # the leaky server's echo was redacted
    if model == "unavailable":
        assert exc.retry_after_s == 3.0


@pytest.mark.parametrize("wire", WIRE_FORMATS)
def test_rate_limited_retry_after(server, wire: str) -> None:  # type: ignore[no-untyped-def]
    seconds = call_error(wire, server.base_url, "rate-limit-seconds")
    assert type(seconds) is errors.RateLimited and seconds.outcome == Outcome.RATE_LIMITED
    assert seconds.status_code == 429 and seconds.retry_after_s == 7.0
    date = call_error(wire, server.base_url, "rate-limit-date")
    assert date.retry_after_s == pytest.approx(120.0)


@pytest.mark.parametrize("wire", WIRE_FORMATS)
@pytest.mark.parametrize(
    ("model", "retired_on", "reference"),
    [
        ("retired", "2026-07-15", "9a2ba1b0-727f-4057-9098-1765d64aaf9e"),
        ("retired-short", "2026-08-01", "RET-0042"),
        ("retired-bare", None, None),
    ],
)
def test_retired(server, wire: str, model: str, retired_on: str | None, reference: str | None) -> None:  # type: ignore[no-untyped-def]
    exc = call_error(wire, server.base_url, model)
    assert isinstance(exc, errors.ModelRetired) and exc.outcome == Outcome.RETIRED
    assert exc.status_code == 410
    assert (exc.retired_on, exc.reference) == (retired_on, reference)
    if model == "retired":
        assert RETIRED_MESSAGE in str(exc)


# ---------------------------------------------------------------- transport failures and deadlines


@pytest.mark.parametrize("wire", WIRE_FORMATS)
def test_connect_refused_is_connect_error(wire: str) -> None:
    exc = call_error(wire, f"http://127.0.0.1:{closed_port()}", "ok")
    assert type(exc) is errors.ConnectFailed and exc.outcome == Outcome.CONNECT_ERROR
    assert exc.status_code is None and exc.bytes_received == 0


def test_connect_timeout() -> None:
    policy = TimeoutPolicy(connect_timeout_s=0.3, read_timeout_s=5.0, total_timeout_s=5.0)
    with full_backlog_server() as url:
        exc = call_error("openai", url, "ok", policy)
    assert type(exc) is errors.ConnectTimeout and exc.outcome == Outcome.TIMEOUT_CONNECT
    assert 250 <= exc.latency_ms <= 1500


def test_malformed_http_is_protocol_error() -> None:
    with garbage_server() as url:
        exc = call_error("openai", url, "ok")
    assert type(exc) is errors.ProtocolFailed and exc.outcome == Outcome.PROTOCOL_ERROR


@pytest.mark.parametrize("wire", WIRE_FORMATS)
def test_read_timeout_before_headers(server, wire: str) -> None:  # type: ignore[no-untyped-def]
    policy = TimeoutPolicy(connect_timeout_s=2.0, read_timeout_s=0.3, total_timeout_s=10.0)
    exc = call_error(wire, server.base_url, "sleep-2", policy)
    assert type(exc) is errors.ReadTimeout and exc.outcome == Outcome.TIMEOUT_READ
    assert 300 * 0.9 <= exc.latency_ms <= 300 * 1.1 + 400


@pytest.mark.parametrize("wire", WIRE_FORMATS)
def test_total_deadline_cuts_a_trickling_body(server, wire: str) -> None:  # type: ignore[no-untyped-def]
    # a byte every 0.1 s never trips the 1 s read timeout, but the 1 s total deadline fires
    policy = TimeoutPolicy(connect_timeout_s=2.0, read_timeout_s=1.0, total_timeout_s=1.0)
    started = time.monotonic()
    exc = call_error(wire, server.base_url, "trickle-0.1-40", policy)
    wall_ms = (time.monotonic() - started) * 1000
    assert type(exc) is errors.TotalTimeout and exc.outcome == Outcome.TIMEOUT_TOTAL
    assert 1000 * 0.9 <= exc.latency_ms <= 1000 * 1.1 + 200
    assert exc.latency_ms <= wall_ms
    assert exc.status_code == 200 and exc.bytes_received >= 5  # bytes arrived before the cut


def test_slow_answer_within_deadlines_succeeds(server) -> None:  # type: ignore[no-untyped-def]
    policy = TimeoutPolicy(connect_timeout_s=2.0, read_timeout_s=1.0, total_timeout_s=5.0)
    reply = call("openai", server.base_url, "trickle-0.05-6", policy)
    assert reply.outcome == Outcome.OK and reply.latency_ms >= 250


def test_no_caps_at_all(server) -> None:  # type: ignore[no-untyped-def]
    policy = TimeoutPolicy(connect_timeout_s=None, read_timeout_s=None, total_timeout_s=None)
    assert call("ollama", server.base_url, "sleep-0.2", policy).outcome == Outcome.OK


# ---------------------------------------------------------------- helpers and registry


def test_retry_after_parsing() -> None:
    assert _http.parse_retry_after("7", FROZEN_NOW) == 7.0
    assert _http.parse_retry_after("1.5", FROZEN_NOW) == 1.5
    assert _http.parse_retry_after("Wed, 21 Oct 2026 07:28:00 GMT", FROZEN_NOW) == 120.0
    assert _http.parse_retry_after("Wed, 21 Oct 2026 07:00:00 GMT", FROZEN_NOW) == 0.0  # past
    assert _http.parse_retry_after("soon", FROZEN_NOW) is None
    assert _http.parse_retry_after(None, FROZEN_NOW) is None


def test_error_text_is_bounded_and_redacted() -> None:
    text = _http.clip(f"key={KEY} " + "x" * 5000, [KEY, None])
    assert KEY not in text and len(text) == ERROR_TEXT_MAX_CHARS


def test_make_provider_picks_by_wire_format() -> None:
    async def go() -> None:
        async with make_http_client() as client:
            openai = make_provider(EndpointRef(name="e", base_url="http://127.0.0.1:1/v1"), client, None)
            ollama = make_provider(
                EndpointRef(name="e", base_url="http://127.0.0.1:1", wire_format="ollama"), client, None
            )
            assert isinstance(openai, OpenAIProvider) and isinstance(ollama, OllamaProvider)
            bogus = EndpointRef.model_construct(name="e", base_url="http://x", wire_format="grpc", api_key_env=None)
            with pytest.raises(errors.ConfigError, match="openai, ollama"):
                make_provider(bogus, client, None)
            with pytest.raises(errors.ConfigError, match="http"):
                make_provider(EndpointRef(name="e", base_url="ftp://host"), client, None)

    asyncio.run(go())


def test_http_client_ignores_proxy_env() -> None:
    client = make_http_client(max_connections=8)
    try:
        assert client.trust_env is False
    finally:
        asyncio.run(client.aclose())
