"""Reading a streamed chat answer: OpenAI server-sent events or Ollama NDJSON, bounded.

``EventReader`` is the ``_http.BodyReader`` for ``stream: true`` calls. It splits the body into
lines as bytes arrive (never reading more than ``max_bytes`` of body), decodes each event's
JSON, and notes when the first token came (``first_token_ms``, from the request's start), which
is what the provider's ``is_token`` says an event carries. When a deadline fires it words the
timeout by where the stream was: ``no first token within read_timeout_s=X`` (nothing started)
or ``stream stalled`` (tokens came, then nothing for ``read_timeout_s``), and for the total
deadline ``no first token within total_timeout_s=X`` or ``stream still running at
total_timeout_s=X``.

Framing: ``sse`` lines are ``data: <json>`` (comments and other fields ignored, ``data:
[DONE]`` ends the stream); ``ndjson`` lines are one JSON object each.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from workers.errors import ProtocolFailed, ServerFailed
from workers.providers import _http
from workers.providers.base import Reply, ServedIdentity
from workers.runtask import TimeoutPolicy
from workers.secrets import mask_optional, mask_secrets

Framing = Literal["sse", "ndjson"]


class EventReader:
    """Collects the JSON events of one streamed 2xx body, at most ``max_bytes`` of it (decoded;
    ``None`` = unbounded, as ``ChatRequest.max_response_bytes``). After ``read``: ``events`` in arrival
    order, ``done`` (the stream's own end marker was seen), ``first_token_ms`` and
    ``last_byte_ms`` (request start to first token / to the last byte), ``tokens`` (events
    that carried a token)."""

    def __init__(
        self,
        framing: Framing,
        is_token: Callable[[Any], bool],
        is_done: Callable[[Any], bool],
        *,
        clock: _http.Clock,
        where: str,
        max_bytes: int | None = None,
        secrets: tuple[str | None, ...] = (),
    ) -> None:
        self._framing = framing
        self._is_token, self._is_done = is_token, is_done
        self.clock, self.secrets = clock, secrets  # post_stream times and masks the exchange with these
        self._where, self._max_bytes = where, max_bytes
        self._started = 0.0
        self.events: list[Any] = []
        self.done = False
        self.tokens = 0
        self.first_token_ms: float | None = None
        self.last_byte_ms: float | None = None

    def _elapsed_ms(self) -> float:
        return (self.clock() - self._started) * 1000.0

    def _fail(self, cls: type[ProtocolFailed] | type[ServerFailed], what: str, response: httpx.Response) -> Exception:
        return cls(
            _http.clip(f"{self._where}: {what}", self.secrets),
            status_code=response.status_code,
            latency_ms=self._elapsed_ms(),
            bytes_received=response.num_bytes_downloaded,
            first_token_ms=self.first_token_ms,
        )

    def _payload(self, line: bytes) -> bytes | None:
        """The JSON text of one line, ``None`` for lines without an event."""
        line = line.rstrip(b"\r")
        if self._framing == "ndjson":
            return line if line.strip() else None
        if not line.startswith(b"data:"):
            return None  # blank separator, ": comment", "event:", "id:", "retry:"
        return line[5:].strip()

    def _feed(self, line: bytes, response: httpx.Response) -> None:
        payload = self._payload(line)
        if payload is None or self.done:
            return
        if self._framing == "sse" and payload == b"[DONE]":
            self.done = True
            return
        try:
            event = json.loads(payload)
        except (ValueError, RecursionError) as exc:
            raise self._fail(ProtocolFailed, f"stream event is not JSON ({exc}): {payload[:200]!r}", response) from None
        if isinstance(event, dict) and event.get("error"):
            # an error after the 200 (e.g. the server failed mid-generation)
            raise self._fail(ServerFailed, f"stream ended with an error: {_http.body_message(payload)}", response)
        self.events.append(event)
        if self._is_token(event):
            self.tokens += 1
            if self.first_token_ms is None:
                self.first_token_ms = self._elapsed_ms()
        if self._is_done(event):
            self.done = True

    async def read(self, response: httpx.Response, started: float) -> bytes:
        """Consume the body line by line; ``ProtocolFailed`` past ``max_bytes``. Returns b""
        (the events are kept decoded instead)."""
        self._started = started
        pending = b""
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if self._max_bytes is not None and size > self._max_bytes:
                raise self._fail(
                    ProtocolFailed, f"streamed body exceeds max_response_bytes={self._max_bytes}", response
                )
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._feed(line, response)
        if pending:
            self._feed(pending, response)
        self.last_byte_ms = self._elapsed_ms()
        return b""

    def timeout_message(self, deadline: str, limit_s: float | None) -> str:
        if self.first_token_ms is None:
            return (f"no first token within {deadline}={limit_s} ({len(self.events)} event(s) without a token); "
                    f"raise {deadline} if the model is slow to start")
        if deadline == "read_timeout_s":
            return (f"stream stalled: no bytes for read_timeout_s={limit_s} after {self.tokens} token event(s) "
                    f"(first token at {self.first_token_ms:.0f} ms)")
        return (f"stream still running at total_timeout_s={limit_s} after {self.tokens} token event(s) "
                f"(first token at {self.first_token_ms:.0f} ms); raise total_timeout_s for long answers")


async def post_stream(
    client: _http.HttpClient,
    call: _http.HttpCall,
    reader: EventReader,
    *,
    model: str,
    timeouts: TimeoutPolicy,
    now: _http.WallClock,
) -> _http.RawResponse:
    """Send a streamed chat request (``call``: URL, JSON body, headers), events into ``reader``;
    non-2xx raise as in ``post_chat``, and a 2xx stream that ends without its end marker is
    ``ProtocolFailed``. The reader's clock times the whole exchange (so the first token and the
    latency share one clock) and its secrets are masked out of every message."""
    secrets = reader.secrets
    raw = await _http.send(client, call, timeouts=timeouts, clock=reader.clock, secrets=secrets, reader=reader)
    _http.raise_for_status(raw, model=model, now=now(), secrets=secrets)
    if not reader.done:
        raise ProtocolFailed(
            _http.clip(f"POST {call.url} model={model}: stream ended before its end marker after "
                       f"{len(reader.events)} event(s); the connection was cut or the server is not streaming", secrets),
            status_code=raw.status_code, latency_ms=raw.latency_ms, bytes_received=raw.bytes_received,
            first_token_ms=reader.first_token_ms,
        )
    return raw


def stream_duration_ms(raw: _http.RawResponse) -> float | None:
    """First token to the last byte, in ms (``None`` when no token came)."""
    return None if raw.first_token_ms is None else max(raw.latency_ms - raw.first_token_ms, 0.0)


@dataclass(frozen=True)
class TokenUsage:
    """The token counts an endpoint reported, as it sent them (anything but an int is dropped)."""

    prompt_tokens: Any = None
    completion_tokens: Any = None
    reasoning_tokens: Any = None


def served_identity(body: Any, *, secrets: tuple[str | None, ...], digest_key: str | None = None) -> ServedIdentity:
    """The served identity of an answer body (or stream chunk): its ``model`` and
    ``system_fingerprint`` and, with ``digest_key``, that field as the model digest; bounded."""
    if not isinstance(body, dict):
        return ServedIdentity()
    return ServedIdentity(
        model=_http.identity_text(body.get("model"), secrets),
        system_fingerprint=_http.identity_text(body.get("system_fingerprint"), secrets),
        digest=_http.identity_text(body.get(digest_key), secrets) if digest_key else None,
    )


def answer_reply(
    raw: _http.RawResponse, content: str, reasoning: str, finish_reason: Any, usage: TokenUsage, *,
    secrets: tuple[str | None, ...], streamed: bool, served: ServedIdentity = ServedIdentity(),
) -> Reply:
    """The classified reply from a whole (or reassembled streamed) answer, for every wire format:
    ``<think>`` blocks of ``content`` join ``reasoning``; token counts are kept only when they
    are integers. An endpoint may echo the key inside a 200 answer: it is masked before
    anything keeps the text."""
    answer, think = _http.split_think(_http.storable(content))
    reasoning = _http.storable("\n".join(part for part in (reasoning, think) if part))
    finish = _http.storable(finish_reason) if isinstance(finish_reason, str) else None
    return Reply(
        outcome=_http.answer_outcome(finish, answer),
        answer_text=mask_secrets(answer, secrets),
        reasoning_text=mask_secrets(reasoning, secrets),
        latency_ms=raw.latency_ms,
        status_code=raw.status_code,
        bytes_received=raw.bytes_received,
        finish_reason=mask_optional(finish, secrets),
        prompt_tokens=_http.int_or_none(usage.prompt_tokens),
        completion_tokens=_http.int_or_none(usage.completion_tokens),
        reasoning_tokens=_http.int_or_none(usage.reasoning_tokens),
        first_token_ms=raw.first_token_ms if streamed else None,
        stream_duration_ms=stream_duration_ms(raw) if streamed else None,
        served=served,
    )
