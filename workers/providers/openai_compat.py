"""OpenAI-compatible ``POST /v1/chat/completions`` (hosted open-model endpoints, vLLM, Ollama's
``/v1``, OpenAI itself).

Request: one user message, ``stream`` (false unless the model streams), ``temperature`` and the token cap when set (under
``max_tokens`` or, for endpoints that want it, ``max_completion_tokens``), a ``json_schema``
``response_format`` in structured-output mode, then ``request.options`` merged last as extra
body fields (so a campaign can set anything the endpoint understands). The reasoning switch is
not standardised across OpenAI-compatible servers: ``OpenAIDialect.reasoning_on``/``reasoning_off`` are the
body fields sent when ``request.reasoning`` is True/False (default: ``reasoning_effort``).
``Cache-Control: no-store`` asks every cache on the path not to keep or reuse the answer.

Reply: answer = ``choices[0].message.content``; reasoning = ``message.reasoning_content`` or
``message.reasoning``, plus a leading ``<think>…</think>`` block split out of the content.
``finish_reason == "length"`` -> TRUNCATED (even with empty content), empty answer -> EMPTY.
The served identity is the body's ``model`` and ``system_fingerprint`` (a stream's last chunk
naming a model). OpenAI documents no response header naming the served model or version
(``openai-version`` is the REST API's version), so no header is read.

Streamed (``request.stream``): ``stream_options: {include_usage: true}`` is sent; the answer and
reasoning are the concatenated ``choices[0].delta`` pieces, ``finish_reason`` the last one given,
usage the final chunk's ``usage`` (None when the server sends none); the reply carries the time
to the first token and the stream's duration (``workers.providers.streaming``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from workers.providers import _http, streaming
from workers.providers.base import ChatRequest, Reply, ServedIdentity
from workers.runtask import ResponseLimits, TimeoutPolicy

LIST_MAX_BYTES = ResponseLimits().max_response_bytes  # a model list is no bigger than an answer

SCHEMA_NAME = "irbench_ir"


@dataclass(frozen=True)
class OpenAIDialect:
    """How one endpoint spells what OpenAI-compatible servers do not agree on: the body field of
    the token cap (``max_tokens_param``) and the body fields sent when ``request.reasoning`` is
    True (``reasoning_on``) or False (``reasoning_off``)."""

    max_tokens_param: str = "max_tokens"
    reasoning_on: dict[str, Any] = field(default_factory=lambda: {"reasoning_effort": "medium"})
    reasoning_off: dict[str, Any] = field(default_factory=lambda: {"reasoning_effort": "none"})


class OpenAIProvider:
    """Client for one OpenAI-compatible endpoint. ``base_url`` may end in ``/v1`` or not."""

    wire_format = "openai"

    def __init__(
        self,
        client: _http.HttpClient,
        base_url: str,
        api_key: str | None,
        *,
        dialect: OpenAIDialect | None = None,
        clock: _http.Clock = time.monotonic,
        now: _http.WallClock = _http.utc_now,
    ) -> None:
        root = _http.check_base_url(base_url)
        self._root = root[: -len("/v1")] if root.endswith("/v1") else root
        self._client = client
        self._api_key = api_key
        self._dialect = OpenAIDialect() if dialect is None else dialect
        self._clock = clock
        self._now = now

    def _headers(self) -> dict[str, str]:
        headers = {"Cache-Control": "no-store", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def build_body(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body sent for ``request`` (public so runs can record what was sent)."""
        body: dict[str, Any] = {
            "model": request.model,
            "messages": [{"role": "user", "content": request.user_message}],
            "stream": request.stream,
        }
        if request.stream:
            body["stream_options"] = {"include_usage": True}
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.max_tokens is not None:
            body[self._dialect.max_tokens_param] = request.max_tokens
        if request.json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": SCHEMA_NAME, "schema": request.json_schema},
            }
        if request.reasoning is True:
            body.update(self._dialect.reasoning_on)
        elif request.reasoning is False:
            body.update(self._dialect.reasoning_off)
        body.update(request.options)
        return body

    async def complete(self, request: ChatRequest) -> Reply:
        """One chat completion; raises ``workers.errors.ProviderError`` subclasses on failure."""
        if request.stream:
            return await self._complete_streamed(request)
        secrets = (self._api_key,)
        raw, data = await _http.post_chat(
            self._client,
            _http.chat_call(f"{self._root}/v1/chat/completions", self.build_body(request), self._headers(), request.model),
            model=request.model,
            limits=_http.ExchangeLimits(request.timeouts, request.max_response_bytes),
            clock=self._clock,
            now=self._now,
            secrets=secrets,
        )
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise _http.protocol_error(raw, model=request.model, what="body has no choices[0]", secrets=secrets)
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise _http.protocol_error(raw, model=request.model, what="choices[0] has no message", secrets=secrets)
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise _http.protocol_error(raw, model=request.model, what="message.content is not a string", secrets=secrets)
        reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        finish_reason = choice.get("finish_reason")
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        return _reply(raw, content or "", reasoning if isinstance(reasoning, str) else "", finish_reason, usage,
                      secrets=secrets, served=streaming.served_identity(data, secrets=secrets))

    async def _complete_streamed(self, request: ChatRequest) -> Reply:
        secrets = (self._api_key,)
        url = f"{self._root}/v1/chat/completions"
        reader = streaming.EventReader(
            "sse", _has_token, lambda event: False, clock=self._clock, where=f"POST {url} model={request.model}",
            max_bytes=request.max_response_bytes, secrets=secrets,
        )
        raw = await streaming.post_stream(
            self._client, _http.chat_call(url, self.build_body(request), self._headers(), request.model), reader,
            model=request.model, timeouts=request.timeouts, now=self._now,
        )
        content: list[str] = []
        reasoning: list[str] = []
        finish_reason: Any = None
        usage: dict[str, Any] = {}
        for event in reader.events:
            if not isinstance(event, dict):
                raise _http.protocol_error(raw, model=request.model, what="stream event is not an object", secrets=secrets)
            if isinstance(event.get("usage"), dict):
                usage = event["usage"]
            delta, reason = _delta(event)
            content.append(_text(delta.get("content")))
            reasoning.append(_text(delta.get("reasoning_content")) or _text(delta.get("reasoning")))
            finish_reason = reason or finish_reason
        # every chunk names the model; the last that does speaks for the answer
        named = next((e for e in reversed(reader.events) if isinstance(e, dict) and "model" in e), None)
        return _reply(raw, "".join(content), "".join(reasoning), finish_reason, usage, secrets=secrets, streamed=True,
                      served=streaming.served_identity(named, secrets=secrets))

    async def list_models(self, timeouts: TimeoutPolicy) -> list[str]:
        """Model ids from ``GET /v1/models``."""
        secrets = (self._api_key,)
        raw = await _http.send(
            self._client, _http.HttpCall("GET", f"{self._root}/v1/models", headers=self._headers()),
            timeouts=timeouts, clock=self._clock, secrets=secrets, max_body_bytes=LIST_MAX_BYTES,
        )
        _http.raise_for_status(raw, model="*", now=self._now(), secrets=secrets)
        data = _http.decode_json_body(raw, model="*", secrets=secrets)
        entries = data.get("data") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            raise _http.protocol_error(raw, model="*", what="/v1/models body has no 'data' list", secrets=secrets)
        return [e["id"] for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _delta(event: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """``choices[0].delta`` and ``finish_reason`` of one stream chunk (``{}``/None when absent,
    e.g. the final usage-only chunk)."""
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return {}, None
    delta = choices[0].get("delta")
    reason = choices[0].get("finish_reason")
    return (delta if isinstance(delta, dict) else {}), (reason if isinstance(reason, str) else None)


def _has_token(event: Any) -> bool:
    if not isinstance(event, dict):
        return False
    delta, _ = _delta(event)
    return bool(_text(delta.get("content")) or _text(delta.get("reasoning_content")) or _text(delta.get("reasoning")))


def _reply(
    raw: _http.RawResponse, content: str, reasoning: str, finish_reason: Any, usage: dict[str, Any],
    *, secrets: tuple[str | None, ...], streamed: bool = False, served: ServedIdentity = ServedIdentity(),
) -> Reply:
    """The classified reply from a whole (or reassembled streamed) answer. An endpoint may echo
    the key inside a 200 answer: it is masked before anything keeps the text."""
    details = usage.get("completion_tokens_details")
    details = details if isinstance(details, dict) else {}
    counts = streaming.TokenUsage(
        prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
        reasoning_tokens=details.get("reasoning_tokens"),
    )
    return streaming.answer_reply(raw, content, reasoning, finish_reason, counts, secrets=secrets, streamed=streamed,
                                  served=served)
