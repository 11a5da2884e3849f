"""Ollama's native ``POST /api/chat`` (local Ollama or ollama.com with a bearer key).

Request: one user message, ``stream`` (false unless the model streams), ``options: {num_predict, temperature,
**request.options}`` (``num_predict`` is Ollama's token cap), ``think`` when
``request.reasoning`` is set, ``format: <json schema>`` in structured-output mode.
Reply: answer = ``message.content`` (a leading ``<think>`` block is split out for models that
inline it), reasoning = ``message.thinking``; ``done_reason == "length"`` -> TRUNCATED;
tokens from ``prompt_eval_count``/``eval_count`` (Ollama does not split reasoning tokens out).
The served identity is the body's (the final line's) ``model`` and its ``digest``: the answer's
own where it carries one, else the digest ``GET /api/tags`` lists for the served (or asked-for)
name. The list is read after a successful answer, at most once per ``digest_ttl_s`` per provider
(a model re-pulled under its name shows within that time); when it cannot be read, or names no
such model, the digest is None and the answer is kept as it is.
Streamed (``request.stream``): NDJSON lines whose ``message.content``/``thinking`` pieces are
concatenated; the final ``done: true`` line carries ``done_reason`` and the token counts.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any


from workers.errors import ProviderError
from workers.providers import _http, streaming
from workers.providers.base import ChatRequest, Reply
from workers.runtask import ResponseLimits, TimeoutPolicy

LIST_MAX_BYTES = ResponseLimits().max_response_bytes  # a model list is no bigger than an answer


class OllamaProvider:
    """Client for one Ollama endpoint. ``base_url`` may end in ``/api`` or not.
    ``digest_ttl_s``: how long (seconds, on ``clock``) the digests read from ``/api/tags`` are
    reused before the list is read again."""

    wire_format = "ollama"

    def __init__(
        self,
        client: _http.HttpClient,
        base_url: str,
        api_key: str | None = None,
        *,
        clock: _http.Clock = time.monotonic,
        now: _http.WallClock = _http.utc_now,
        digest_ttl_s: float = 60.0,
    ) -> None:
        root = _http.check_base_url(base_url)
        self._root = root[: -len("/api")] if root.endswith("/api") else root
        self._client = client
        self._api_key = api_key
        self._clock = clock
        self._now = now
        self._digest_ttl_s = digest_ttl_s
        self._digests: dict[str, str] = {}
        self._digests_read_at: float | None = None

    def _headers(self) -> dict[str, str]:
        headers = {"Cache-Control": "no-store", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def build_body(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body sent for ``request``."""
        options: dict[str, Any] = {}
        if request.max_tokens is not None:
            options["num_predict"] = request.max_tokens
        if request.temperature is not None:
            options["temperature"] = request.temperature
        options.update(request.options)
        body: dict[str, Any] = {
            "model": request.model,
            "messages": [{"role": "user", "content": request.user_message}],
            "stream": request.stream,
            "options": options,
        }
        if request.reasoning is not None:
            body["think"] = request.reasoning
        if request.json_schema is not None:
            body["format"] = request.json_schema
        return body

    async def complete(self, request: ChatRequest) -> Reply:
        """One chat call; raises ``workers.errors.ProviderError`` subclasses on failure. The
        reply's served digest is completed from ``/api/tags`` (see the module docstring)."""
        reply = await self._chat(request)
        if reply.served.digest is not None:
            return reply
        names = [n for n in (reply.served.model, request.model) if n]
        digest = await self._listed_digest(names, request)
        return dataclasses.replace(reply, served=dataclasses.replace(reply.served, digest=digest))

    async def _listed_digest(self, names: list[str], request: ChatRequest) -> str | None:
        """The digest ``/api/tags`` lists for the first of ``names`` it knows (``NAME`` also
        matches ``NAME:latest``), from the list read within ``digest_ttl_s``; None if none."""
        read_at = self._digests_read_at
        if read_at is None or self._clock() - read_at >= self._digest_ttl_s:
            self._digests_read_at = self._clock()
            try:
                self._digests = _digests(await self._tags(request.timeouts), (self._api_key,))
            except ProviderError:
                self._digests = {}
        for name in names:
            for key in (name, f"{name}:latest"):
                if key in self._digests:
                    return self._digests[key]
        return None

    async def _chat(self, request: ChatRequest) -> Reply:
        secrets = (self._api_key,)
        url = f"{self._root}/api/chat"
        if request.stream:
            reader = streaming.EventReader(
                "ndjson", _has_token, lambda event: isinstance(event, dict) and event.get("done") is True,
                clock=self._clock, where=f"POST {url} model={request.model}", max_bytes=request.max_response_bytes,
                secrets=secrets,
            )
            raw = await streaming.post_stream(
                self._client, _http.chat_call(url, self.build_body(request), self._headers(), request.model), reader,
                model=request.model, timeouts=request.timeouts, now=self._now,
            )
            if not all(isinstance(e, dict) and isinstance(e.get("message", {}), dict) for e in reader.events):
                raise _http.protocol_error(raw, model=request.model, what="stream line is not a chat chunk", secrets=secrets)
            pieces = [e.get("message") or {} for e in reader.events]
            final = reader.events[-1]
            return _reply(raw, final, "".join(_text(m.get("content")) for m in pieces),
                          "".join(_text(m.get("thinking")) for m in pieces), secrets=secrets, streamed=True)
        raw, data = await _http.post_chat(
            self._client,
            _http.chat_call(url, self.build_body(request), self._headers(), request.model),
            model=request.model,
            limits=_http.ExchangeLimits(request.timeouts, request.max_response_bytes),
            clock=self._clock,
            now=self._now,
            secrets=secrets,
        )
        message = data.get("message") if isinstance(data, dict) else None
        if not isinstance(message, dict):
            raise _http.protocol_error(raw, model=request.model, what="body has no 'message' object", secrets=secrets)
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise _http.protocol_error(raw, model=request.model, what="message.content is not a string", secrets=secrets)
        return _reply(raw, data, content or "", _text(message.get("thinking")), secrets=secrets)

    async def _tags(self, timeouts: TimeoutPolicy) -> list[Any]:
        """The ``models`` entries of ``GET /api/tags``; raises ``ProviderError`` subclasses."""
        secrets = (self._api_key,)
        raw = await _http.send(
            self._client, _http.HttpCall("GET", f"{self._root}/api/tags", headers=self._headers()),
            timeouts=timeouts, clock=self._clock, secrets=secrets, max_body_bytes=LIST_MAX_BYTES,
        )
        _http.raise_for_status(raw, model="*", now=self._now(), secrets=secrets)
        data = _http.decode_json_body(raw, model="*", secrets=secrets)
        entries = data.get("models") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            raise _http.protocol_error(raw, model="*", what="/api/tags body has no 'models' list", secrets=secrets)
        return entries

    async def list_models(self, timeouts: TimeoutPolicy) -> list[str]:
        """Model names from ``GET /api/tags``."""
        names = []
        for entry in await self._tags(timeouts):
            if isinstance(entry, dict):
                name = entry.get("name") or entry.get("model")
                if isinstance(name, str):
                    names.append(name)
        return names


def _digests(entries: list[Any], secrets: tuple[str | None, ...]) -> dict[str, str]:
    """Name (and model) -> digest of ``/api/tags`` entries; entries without a string digest are
    skipped, and each digest is bounded and masked as a served identity is."""
    out: dict[str, str] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        digest = _http.identity_text(entry.get("digest"), secrets)
        for key in ("name", "model"):
            name = entry.get(key)
            if digest is not None and isinstance(name, str):
                out.setdefault(name, digest)
    return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _has_token(event: Any) -> bool:
    message = event.get("message") if isinstance(event, dict) else None
    return isinstance(message, dict) and bool(_text(message.get("content")) or _text(message.get("thinking")))


def _reply(
    raw: _http.RawResponse, final: dict[str, Any], content: str, thinking: str, *,
    secrets: tuple[str | None, ...], streamed: bool = False,
) -> Reply:
    """The classified reply; ``final`` is the whole body or the last (``done``) stream line. An
    endpoint may echo the key inside a 200 answer: it is masked before anything keeps the text."""
    counts = streaming.TokenUsage(prompt_tokens=final.get("prompt_eval_count"), completion_tokens=final.get("eval_count"))
    return streaming.answer_reply(raw, content, thinking, final.get("done_reason"), counts, secrets=secrets, streamed=streamed,
                                  served=streaming.served_identity(final, secrets=secrets, digest_key="digest"))
