"""Property: no body and no answer text can raise out of decode + IR extraction.

Arbitrary bytes and arbitrary JSON-ish text go through the real provider code (``send`` with the
bounded body read, status classification, JSON decode, wire-format checks) over an injected
``httpx.MockTransport``, then through ``extract_ir``; every example must end in exactly one
failures.md outcome (and one ir.md parse outcome when there is an answer).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.records import Outcome, ParseOutcome
from workers.errors import ProviderError
from workers.ir_extract import extract_ir
from workers.providers.base import ChatRequest
from workers.providers.ollama import OllamaProvider
from workers.providers.openai_compat import OpenAIProvider
from workers.runtask import TimeoutPolicy
from tests.support.examples import examples

pytestmark = pytest.mark.property

TIMEOUTS = TimeoutPolicy(connect_timeout_s=5, read_timeout_s=5, total_timeout_s=5)
KEY = "sk-propertyTEST-1234567890abcdef"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(
        ["choices", "message", "content", "nodes", "id", "kind", "meta", "reasoning_content", "thinking",
         "finish_reason", "done_reason", "usage", "version", "label"]), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def jsonish(draw) -> str:  # type: ignore[no-untyped-def]
    """JSON, JSON cut anywhere, bracket storms, fences and prose around JSON, raw junk."""
    base = json.dumps(draw(json_values))
    kind = draw(st.sampled_from(["whole", "cut", "storm", "fence", "prose", "junk", "wire"]))
    if kind == "cut":
        return base[: draw(st.integers(0, len(base)))]
    if kind == "storm":
        n = draw(st.integers(1, 5000))
        return draw(st.sampled_from(["[", "{", '{"a":', "[{", '"'])) * n + draw(st.sampled_from(["", "]" * n, "}"]))
    if kind == "fence":
        return f"```json\n{base}\n```"
    if kind == "prose":
        return draw(st.text(max_size=50)) + base + draw(st.text(max_size=50))
    if kind == "junk":
        return draw(st.text(alphabet='[]{}",:\\0123456789.eE+-truefalsn <think>`\n', max_size=400))
    content = draw(st.sampled_from([base, "[" * 3000, None, 5, ""]))
    return json.dumps({"choices": [{"message": {"content": content}, "finish_reason": "length"}],
                       "message": {"content": content}})


def _through_provider(body: bytes, status: int, wire: str) -> set[str]:
    """Outcome (and parse outcome) of one call whose endpoint answers ``body``."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers={"Content-Type": "application/json"})

    async def call() -> set[str]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            cls = OpenAIProvider if wire == "openai" else OllamaProvider
            provider = cls(client, "http://hostile.invalid", KEY)
            request = ChatRequest(model="m", user_message="hi", timeouts=TIMEOUTS, max_response_bytes=64 * 1024)
            try:
                reply = await provider.complete(request)
            except ProviderError as exc:
                assert KEY not in str(exc)
                return {exc.outcome.value}
            parsed = extract_ir(reply.answer_text, budget_exhausted=reply.outcome is Outcome.TRUNCATED)
            assert parsed.parse_outcome in set(ParseOutcome)
            return {reply.outcome.value, "parse:" + parsed.parse_outcome.value}

    return asyncio.run(call())


OUTCOMES = {o.value for o in Outcome}


def _check(result: set[str]) -> None:
    assert len([r for r in result if not r.startswith("parse:")]) == 1
    assert all(r.removeprefix("parse:") in OUTCOMES | {p.value for p in ParseOutcome} for r in result)


@settings(max_examples=examples(1000), deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.binary(max_size=2048), status=st.sampled_from([200, 200, 200, 201, 400, 404, 410, 429, 500]),
       wire=st.sampled_from(["openai", "ollama"]))
def test_arbitrary_bytes_always_end_in_a_class(body: bytes, status: int, wire: str) -> None:
    _check(_through_provider(body, status, wire))


@settings(max_examples=examples(1000), deadline=None, suppress_health_check=list(HealthCheck))
@given(text=jsonish(), wire=st.sampled_from(["openai", "ollama"]))
def test_arbitrary_jsonish_bodies_always_end_in_a_class(text: str, wire: str) -> None:
    _check(_through_provider(text.encode("utf-8", errors="surrogatepass"), 200, wire))


@settings(max_examples=examples(1000), deadline=None, suppress_health_check=list(HealthCheck))
@given(text=jsonish() | st.text(max_size=500), budget=st.booleans())
def test_arbitrary_answers_always_extract_to_a_parse_outcome(text: str, budget: bool) -> None:
    result = extract_ir(text, budget_exhausted=budget)
    assert result.parse_outcome in set(ParseOutcome)
    assert (result.ir_json is not None) == (result.document is not None)
