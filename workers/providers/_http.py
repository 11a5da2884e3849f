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
leave ``workers/``. Non-2xx statuses are mapped by ``raise_for_status`` (``_status``); the text
helpers (``clip``, ``storable``, ...) live in ``_text``; both are re-exported here, the one
module the clients import. Error messages name the
method, URL, model and what went wrong; secrets passed in ``secrets`` are replaced by ``***``
and headers are never included.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from storage.clock import WallClock, utc_now  # noqa: F401  utc_now: the providers' default clock
from workers.errors import (
    ConfigError,
    ConnectFailed,
    ConnectTimeout,
    ProtocolFailed,
    ProviderError,
    ReadTimeout,
    TotalTimeout,
)
from workers.providers._status import (  # noqa: F401 - re-export: the clients use them as _http.*
    RawResponse,
    body_message,
    decode_json_body,
    parse_retirement,
    protocol_error,
    raise_for_status,
)
from workers.providers._text import (  # noqa: F401 - re-export: the clients use them as _http.*
    answer_outcome,
    clip,
    identity_text,
    int_or_none,
    split_think,
    storable,
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


