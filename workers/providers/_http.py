"""Shared HTTP plumbing for the provider clients: deadlines, error translation, parsing helpers.

``send`` makes one request under the three deadlines of a ``TimeoutPolicy``:

* ``connect_timeout_s`` and ``read_timeout_s`` become an ``httpx.Timeout`` (read also bounds
  writes; the pool wait is bounded only by the total deadline, since a pool slot is our own
  resource, not the provider's);
* ``total_timeout_s`` is a wall-clock ``asyncio.timeout`` around the whole call, body included,
  so a server trickling bytes under the read timeout still cannot exceed it.

The body is read in chunks and bounded by ``max_body_bytes`` while it streams in (never
buffered whole first): a larger body is a ``protocol_error`` carrying its first KiB. The JSON
decode turns ``RecursionError``/``MemoryError`` (a deeply nested or huge document) into a
``protocol_error`` too: nothing an endpoint sends can raise out of a provider.

Every httpx exception is translated here into the ``workers.errors`` tree, so httpx types never
leave ``workers/``. Non-2xx statuses are mapped by ``raise_for_status``. Error messages name the
method, URL, model and what went wrong; secrets passed in ``secrets`` are replaced by ``***``
and headers are never included.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from storage.clock import WallClock, utc_now  # noqa: F401  utc_now: the providers' default clock
from storage.records import ERROR_TEXT_MAX_CHARS, SERVED_IDENTITY_MAX_CHARS, Outcome
from workers.errors import (
    AuthFailed,
    ClientFailed,
    ConfigError,
    ConnectFailed,
    ConnectTimeout,
    ContextExceeded,
    ModelNotFound,
    ModelRetired,
    ProtocolFailed,
    ProviderError,
    RateLimited,
    ReadTimeout,
    ServerFailed,
    TotalTimeout,
    UnknownModel,
)
from workers.providers.aio import AioClient
from workers.providers.direct import DirectClient
from workers.providers.retry_after import parse_retry_after, retry_after_from_headers  # noqa: F401 - re-export
from workers.runtask import TimeoutPolicy
from workers.secrets import mask_secrets

Clock = Callable[[], float]  # monotonic seconds
#: What ``send`` talks through: an ``AsyncClient`` (availability checks, injected clients), or
#: one of ``PooledProvider``'s one-connection clients (both executors): ``AioClient`` (aiohttp
#: underneath, the default: 0.18-0.22 ms of CPU per call on the simulator) or ``DirectClient``
#: (httpx's transport, 0.31-0.41 ms; bench/http_clients.py). All three raise httpx exceptions.
HttpClient = httpx.AsyncClient | AioClient | DirectClient

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


class BodyReader(Protocol):
    """Reads a 2xx body as it arrives (a stream), instead of ``send`` reading it whole."""

    first_token_ms: float | None  # request start to the first token; None until one came

    async def read(self, response: httpx.Response, started: float) -> bytes:
        """Consume ``response``'s body (``started``: the request's ``clock()`` start)."""
        ...

    def timeout_message(self, deadline: str, limit_s: float | None) -> str:
        """What a fired deadline (``read_timeout_s`` / ``total_timeout_s``) means for the stream
        so far: no first token yet, or a stream that stalled or ran long after it."""
        ...


def httpx_timeout(policy: TimeoutPolicy) -> httpx.Timeout:
    """Per-request httpx timeouts from a policy (``None`` = no cap)."""
    return httpx.Timeout(
        connect=policy.connect_timeout_s,
        read=policy.read_timeout_s,
        write=policy.read_timeout_s,
        pool=None,
    )


def check_base_url(base_url: str) -> str:
    """``base_url`` without trailing slashes; ``ConfigError`` unless it is an http(s) URL."""
    url = base_url.strip().rstrip("/")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ConfigError(f"endpoint base_url {base_url!r} is not a URL ({exc}); use e.g. http://host:port") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(f"endpoint base_url {base_url!r} must start with http:// or https:// and name a host")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:  # httpx accepts 99999 until connect
        raise ConfigError(f"endpoint base_url {base_url!r}: port {parsed.port} is not in 1-65535")
    return url


def storable(text: str) -> str:
    """``text`` as valid Unicode: a lone UTF-16 surrogate (a JSON ``\\ud800`` escape without its
    pair, which ``json`` decodes as is) becomes U+FFFD. No UTF-8 store can hold one: a single
    such answer would fail the whole Parquet batch it is written in, and again on every resume."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def clip(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Redact secrets, then bound the text to ``ERROR_TEXT_MAX_CHARS`` (valid Unicode, ``storable``)."""
    text = storable(mask_secrets(text, secrets))
    if len(text) > ERROR_TEXT_MAX_CHARS:
        text = text[: ERROR_TEXT_MAX_CHARS - 1] + "…"
    return text


def identity_text(value: Any, secrets: Iterable[str | None] = ()) -> str | None:
    """A served-identity field as stored: a string only (anything else is None), secrets masked,
    valid Unicode, control characters dropped, at most ``SERVED_IDENTITY_MAX_CHARS``; "" -> None."""
    if not isinstance(value, str):
        return None
    # masked whole first: a cut could leave part of a key unmasked
    masked = mask_secrets(value, secrets)[: 4 * SERVED_IDENTITY_MAX_CHARS]
    text = "".join(ch for ch in storable(masked) if ch.isprintable())
    return text[:SERVED_IDENTITY_MAX_CHARS] or None


@dataclass(frozen=True)
class HttpCall:
    """One request: ``context`` names the call in error messages (e.g. ``model=m``)."""

    method: str
    url: str
    json_body: dict[str, Any] | None = None
    headers: dict[str, str] | None = None
    context: str = ""


class _Exchange:
    """One call in progress: what its errors need (where, when it started, the response so far)."""

    def __init__(self, call: HttpCall, clock: Clock, secrets: tuple[str | None, ...], reader: BodyReader | None) -> None:
        self.call, self.clock, self.secrets, self.reader = call, clock, secrets, reader
        self.where = f"{call.method} {call.url}" + (f" ({call.context})" if call.context else "")
        self.started = clock()
        self.response: httpx.Response | None = None

    def streaming(self) -> bool:
        """The reader is (or would be) reading this body."""
        return self.reader is not None and (self.response is None or 200 <= self.response.status_code < 300)

    def first_token_ms(self) -> float | None:
        return self.reader.first_token_ms if self.reader is not None and self.streaming() else None

    def fail(self, cls: type[ProviderError], what: str) -> ProviderError:
        response = self.response
        return cls(
            clip(f"{self.where}: {what}", self.secrets),
            status_code=response.status_code if response is not None else None,
            latency_ms=(self.clock() - self.started) * 1000.0,
            bytes_received=response.num_bytes_downloaded if response is not None else 0,
            first_token_ms=self.first_token_ms(),
        )

    def stream_message(self, deadline: str, limit_s: float | None) -> str | None:
        """The reader's wording of a fired deadline while it streams, else None."""
        return self.reader.timeout_message(deadline, limit_s) if self.reader is not None and self.streaming() else None

    async def fetch(self, client: HttpClient, timeouts: TimeoutPolicy, max_body_bytes: int | None) -> bytes:
        call = self.call
        request = client.build_request(
            call.method, call.url, json=call.json_body, headers=call.headers, timeout=httpx_timeout(timeouts)
        )
        self.response = response = await client.send(request, stream=True)
        try:
            if self.reader is not None and 200 <= response.status_code < 300:
                return await self.reader.read(response, self.started)
            return await _read_bounded(response, max_body_bytes)
        finally:
            await response.aclose()

    def raw(self, body: bytes) -> RawResponse:
        response = self.response
        assert response is not None
        return RawResponse(
            status_code=response.status_code, headers=response.headers, body=body,
            latency_ms=(self.clock() - self.started) * 1000.0, url=self.call.url,
            bytes_received=response.num_bytes_downloaded, first_token_ms=self.first_token_ms(),
        )


def _transport_error(ex: _Exchange, exc: httpx.HTTPError, timeouts: TimeoutPolicy) -> ProviderError:
    """The failure class and message of an httpx exception (order matters: subclasses first)."""
    if isinstance(exc, httpx.ConnectTimeout):
        return ex.fail(ConnectTimeout, f"connection not established within connect_timeout_s={timeouts.connect_timeout_s}")
    if isinstance(exc, (httpx.ReadTimeout, httpx.WriteTimeout)):
        kind = "read" if isinstance(exc, httpx.ReadTimeout) else "write"
        streamed = ex.stream_message("read_timeout_s", timeouts.read_timeout_s) if kind == "read" else None
        return ex.fail(ReadTimeout, streamed or f"no bytes for read_timeout_s={timeouts.read_timeout_s} ({kind} timed out)")
    if isinstance(exc, httpx.PoolTimeout):
        return ex.fail(ConnectTimeout, "no free connection in the client's pool")
    if isinstance(exc, httpx.ConnectError):
        return ex.fail(ConnectFailed, f"cannot connect: {exc or type(exc).__name__}; check the endpoint's host and port")
    if isinstance(exc, httpx.LocalProtocolError):
        # our own request could not be written (a header value with a newline or NUL): h11
        # quotes the value, which is the key's header, and escaped so that masking misses it
        return ex.fail(ProtocolFailed, "request not sendable: a header value holds a newline, a control byte "
                                       "or a non-ASCII character; check the API key variable")
    if isinstance(exc, (httpx.ProtocolError, httpx.DecodingError)):
        return ex.fail(ProtocolFailed, f"malformed HTTP: {exc or type(exc).__name__}")
    if isinstance(exc, httpx.NetworkError):
        # reset or broken mid-exchange: a network failure, retried like a refused connection
        return ex.fail(ConnectFailed, f"connection lost: {exc or type(exc).__name__}")
    return ex.fail(ProtocolFailed, f"{type(exc).__name__}: {exc}")


async def send(
    client: HttpClient,
    call: HttpCall,
    *,
    timeouts: TimeoutPolicy,
    clock: Clock,
    secrets: Iterable[str | None] = (),
    reader: BodyReader | None = None,
    max_body_bytes: int | None = None,
) -> RawResponse:
    """One request, body read in full, under connect/read/total deadlines.

    Returns the response whatever its status; raises ``ConnectTimeout``, ``ReadTimeout``,
    ``TotalTimeout``, ``ConnectFailed`` or ``ProtocolFailed`` (each with ``latency_ms`` and the
    body bytes received so far) when no complete response arrived. ``max_body_bytes`` bounds
    the decoded body (``None`` = no bound): beyond it the connection is dropped and
    ``ProtocolFailed`` keeps the first ``HEAD_BYTES`` of the body in ``body_head``.
    With ``reader`` a 2xx body is consumed by ``reader.read`` (a stream, which bounds itself) and
    timeouts are worded by the reader.
    """
    ex = _Exchange(call, clock, tuple(secrets), reader)
    deadline = asyncio.timeout(timeouts.total_timeout_s)
    try:
        async with deadline:
            body = await ex.fetch(client, timeouts, max_body_bytes)
    except _BodyTooLarge as exc:
        error = ex.fail(
            ProtocolFailed,
            f"body exceeds max_response_bytes={max_body_bytes} (read {exc.size} bytes, then stopped); "
            "raise max_response_bytes for this model if such answers are expected",
        )
        error.body_head = mask_secrets(exc.head.decode("utf-8", errors="replace"), ex.secrets)
        raise error from None
    except TimeoutError as exc:
        if not deadline.expired():
            raise ex.fail(ProtocolFailed, f"unexpected timeout: {exc}") from None
        raise ex.fail(TotalTimeout, ex.stream_message("total_timeout_s", timeouts.total_timeout_s) or (
            f"no complete answer within total_timeout_s={timeouts.total_timeout_s}; "
            "raise total_timeout_s if slow answers are expected")) from None
    except httpx.HTTPError as exc:
        raise _transport_error(ex, exc, timeouts) from None
    return ex.raw(body)


HEAD_BYTES = 1024  # how much of a refused body is kept


class _BodyTooLarge(ProtocolFailed):
    """Raised by ``_read_bounded``; ``send`` turns it into the ``ProtocolFailed`` it reports
    (with the request's context: URL, latency, bytes)."""

    def __init__(self, size: int, head: bytes) -> None:
        super().__init__(f"body exceeds the bound after {size} bytes")
        self.size, self.head = size, head


async def _read_bounded(response: httpx.Response, max_bytes: int | None) -> bytes:
    """The decoded body, chunk by chunk; ``_BodyTooLarge`` as soon as it passes ``max_bytes``."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if max_bytes is not None and size > max_bytes:
            head = b"".join(chunks)[:HEAD_BYTES]
            raise _BodyTooLarge(size, (head + chunk)[:HEAD_BYTES])
        chunks.append(chunk)
    return b"".join(chunks)


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


@dataclass(frozen=True)
class ExchangeLimits:
    """How one exchange is bounded: ``timeouts`` (connect/read/total deadlines, seconds) and
    ``max_body_bytes`` (the decoded body; ``None`` = no bound, as ``ChatRequest.max_response_bytes``)."""

    timeouts: TimeoutPolicy
    max_body_bytes: int | None = None


async def post_chat(
    client: HttpClient,
    call: HttpCall,
    *,
    model: str,
    limits: ExchangeLimits,
    clock: Clock,
    now: WallClock,
    secrets: tuple[str | None, ...],
) -> tuple[RawResponse, Any]:
    """Send a chat request (``call``: its URL, JSON body and headers); return the raw response
    and its decoded JSON body. ``model`` names the call in error messages.

    Non-2xx statuses, bodies over ``limits.max_body_bytes`` and bodies that are not JSON raise
    the classified ``ProviderError``.
    """
    raw = await send(
        client, call, timeouts=limits.timeouts, clock=clock, secrets=secrets, max_body_bytes=limits.max_body_bytes,
    )
    raise_for_status(raw, model=model, now=now(), secrets=secrets)
    return raw, decode_json_body(raw, model=model, secrets=secrets)


def chat_call(url: str, body: dict[str, Any], headers: dict[str, str], model: str) -> HttpCall:
    """The ``POST`` of one chat request; its transport errors name ``model``."""
    return HttpCall("POST", url, json_body=body, headers=headers, context=f"model={model}")


def answer_outcome(finish_reason: str | None, answer: str) -> Outcome:
    """Classify a 2xx answer (failures.md): the provider saying the budget ran out wins, even
    over empty content; otherwise no answer text is ``empty``."""
    if finish_reason == "length":
        return Outcome.TRUNCATED
    return Outcome.EMPTY if not answer.strip() else Outcome.OK


def split_think(content: str) -> tuple[str, str]:
    """Split a leading ``<think>…</think>`` block out of ``content``: ``(answer, reasoning)``.
    An unterminated leading ``<think>`` makes the whole content reasoning."""
    stripped = content.lstrip()
    if not stripped.startswith("<think>"):
        return content, ""
    inner = stripped[len("<think>") :]
    end = inner.find("</think>")
    if end < 0:
        return "", inner.strip()
    return inner[end + len("</think>") :].lstrip(), inner[:end].strip()


def int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
