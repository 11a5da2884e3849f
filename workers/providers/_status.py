"""A complete response and what its status and body mean: ``raise_for_status`` maps a non-2xx
status (and the server's wording of it) to the ``workers.errors`` class; ``decode_json_body`` and
``protocol_error`` report a 2xx body that is not JSON or not the provider's format."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from storage.records import ERROR_TEXT_MAX_CHARS
from workers.errors import (
    AuthFailed,
    ClientFailed,
    ContextExceeded,
    ModelNotFound,
    ModelRetired,
    ProtocolFailed,
    RateLimited,
    ServerFailed,
    UnknownModel,
)
from workers.providers._text import clip
from workers.providers.retry_after import retry_after_from_headers

_RETIRED_ON_RE = re.compile(r"retire[ds]?\s+(?:on|at|since)?\s*:?\s*(\d{4}-\d{2}-\d{2})", re.I)
# How servers word a request longer than the context window: OpenAI / vLLM / llama-cpp-python
# ("maximum context length", code context_length_exceeded), llama.cpp's own server ("exceeds
# the available context size"), TGI ("must have less than N tokens"), Anthropic-style gateways.
_CONTEXT_RE = re.compile(
    r"context[ _]length[ _]exceeded|maximum context length|exceeds? (?:the )?(?:available )?context"
    r"|context window|context size|prompt is too long|input is too long|must have less than \d+ (?:input )?tokens",
    re.I,
)
# How gateways word a model name they do not route (LiteLLM, OpenRouter, Portkey-like).
_GATEWAY_UNKNOWN_MODEL_RE = re.compile(
    r"invalid model|unknown model|not a valid model|no (?:healthy )?deployments?|model[ _]group"
    r"|no endpoints? found|model_not_found",
    re.I,
)
# A 400 naming the model as not there (any server).
_MODEL_MISSING_RE = re.compile(r"model\b.{0,120}\b(?:not found|does not exist|not supported|not available)", re.I | re.S)
_REFERENCE_RE = re.compile(r"\b(?:ref(?:erence)?)\b\s*(?:id)?\s*[:#=]?\s*([A-Za-z0-9][A-Za-z0-9_.:-]*[A-Za-z0-9])", re.I)


@dataclass(frozen=True)
class RawResponse:
    """A complete HTTP response; ``latency_ms`` from request start to the last body byte."""

    status_code: int
    headers: httpx.Headers
    body: bytes
    latency_ms: float
    url: str
    bytes_received: int = 0  # bytes on the wire (before content decoding)
    first_token_ms: float | None = None  # streamed 2xx: request start to the first token


def body_message(body: bytes) -> str:
    """The human message in an error body: ``{"error": {"message": ...}}``, ``{"error": "..."}``,
    ``{"message"|"detail": ...}``, or the text itself (only the first ``ERROR_TEXT_MAX_CHARS``
    are read: it ends up clipped to that anyway)."""
    text = body[: ERROR_TEXT_MAX_CHARS * 4].decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return text
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            for key in ("message", "detail", "error"):
                if isinstance(err.get(key), str):
                    return err[key]
        elif isinstance(err, str):
            return err
        for key in ("message", "detail"):
            if isinstance(data.get(key), str):
                return data[key]
    return text


def parse_retirement(message: str) -> tuple[str | None, str | None]:
    """``(retired_on ISO date, reference id)`` from a 410 message such as
    ``"x was retired at YYYY-MM-DD hh:mm:ss -0700 PDT (ref: 9a2b…)"``; ``None`` when absent."""
    date = _RETIRED_ON_RE.search(message)
    ref = _REFERENCE_RE.search(message)
    return (date.group(1) if date else None, ref.group(1) if ref else None)


def raise_for_status(raw: RawResponse, *, model: str, now: dt.datetime, secrets: Iterable[str | None] = ()) -> None:
    """Raise the ``workers.errors`` class for a non-2xx response; return for 2xx."""
    status = raw.status_code
    if 200 <= status < 300:
        return
    secrets = tuple(secrets)
    message = body_message(raw.body)
    retry_after = retry_after_from_headers(raw.headers, now)
    common: dict[str, Any] = {"status_code": status, "latency_ms": raw.latency_ms, "bytes_received": raw.bytes_received}

    def text(what: str) -> str:
        return clip(f"POST {raw.url} model={model}: HTTP {status} {what}: {message}", secrets)

    if status == 429:
        raise RateLimited(text("rate limited"), retry_after_s=retry_after, **common)
    if status == 410:
        retired_on, reference = parse_retirement(message)
        raise ModelRetired(text("model retired"), retired_on=retired_on, reference=reference, **common)
    if status in (400, 404, 413, 422) and _CONTEXT_RE.search(message):
        raise ContextExceeded(text("prompt does not fit the model's context window"), **common)
    if status in (400, 404, 422) and (
        _GATEWAY_UNKNOWN_MODEL_RE.search(message) or (status != 404 and _MODEL_MISSING_RE.search(message))
    ):
        raise UnknownModel(text("model unknown to the endpoint (a gateway routes no such model); check the name "
                                "against its /v1/models"), **common)
    if status == 404:
        raise ModelNotFound(text("model or route not found; check the model name and base_url"), **common)
    if status in (401, 403):
        raise AuthFailed(text("authentication failed; check the API key variable (api_key_env)"), **common)
    if 400 <= status < 500:
        raise ClientFailed(text("request rejected"), **common)
    if status >= 500:
        raise ServerFailed(text("server error"), retry_after_s=retry_after, **common)
    raise ProtocolFailed(text("unexpected status"), **common)


def decode_json_body(raw: RawResponse, *, model: str, secrets: Iterable[str | None] = ()) -> Any:
    """The 2xx body as JSON; ``ProtocolFailed`` when it is not JSON, nested deeper than the
    parser's recursion guard, or too big to hold in memory."""
    try:
        return json.loads(raw.body)
    except (ValueError, RecursionError, MemoryError) as exc:
        what = {RecursionError: "nested too deeply", MemoryError: "too large to decode"}.get(type(exc), str(exc))
        snippet = raw.body[:200].decode("utf-8", errors="replace")
        raise ProtocolFailed(
            clip(f"POST {raw.url} model={model}: HTTP {raw.status_code} body is not JSON ({what}): {snippet!r}", secrets),
            status_code=raw.status_code,
            latency_ms=raw.latency_ms,
            bytes_received=raw.bytes_received,
        ) from None


def protocol_error(raw: RawResponse, *, model: str, what: str, secrets: Iterable[str | None] = ()) -> ProtocolFailed:
    """A ``ProtocolFailed`` for a 2xx body that is JSON but not the provider's format."""
    return ProtocolFailed(
        clip(f"POST {raw.url} model={model}: HTTP {raw.status_code} {what}", secrets),
        status_code=raw.status_code,
        latency_ms=raw.latency_ms,
        bytes_received=raw.bytes_received,
    )
