"""``DirectClient``'s surface over aiohttp: the same calls for about half the CPU per call.

Profiles of the local executor put ~85 % of its event-loop CPU in the HTTP call through
httpx/httpcore: anyio cancel scopes around every socket operation, h11 parsing in pure Python.
aiohttp reads through asyncio protocol callbacks and parses in C (llhttp). CPU per call on the
zero-latency simulator, ``process_time``, concurrency 1-64 (bench/http_clients.py measures
this): on uvloop ``httpx.AsyncClient.post`` 0.43-0.54 ms,
``DirectClient`` 0.31-0.41 ms, ``AioClient`` 0.18-0.22 ms (bare aiohttp 0.13-0.20); on asyncio's
loop 0.50-0.65, 0.37-0.50 and 0.20-0.27 ms.
It runs on uvloop (local executor) and on asyncio's own loop (the Celery worker's loop thread).

What stays httpx's, so ``_http.send`` and the providers cannot tell the clients apart:

* ``build_request`` is ``DirectClient``'s (``direct.RequestBuilder``), and the request's headers
  go on the wire as they are, in order: aiohttp adds none of its own (no User-Agent), keeps no
  cookies, follows no redirect, reads no proxy variables, sends a failed GET only once;
* ``send`` returns an ``httpx.Response`` whose stream yields the raw wire bytes (aiohttp's
  decompression is off), so content decoding, ``DecodingError`` and ``num_bytes_downloaded``
  are httpx's;
* every failure is raised as the httpx exception httpcore raises for the same event
  (``_translate``): refused/unreachable/DNS/TLS -> ``ConnectError``; connect deadline ->
  ``ConnectTimeout``; no byte for the read deadline (waiting for the head or between body
  bytes) -> ``ReadTimeout``; no write progress for it -> ``WriteTimeout``; a reset at any point
  -> ``ReadError``; a clean close before or inside a response, malformed HTTP ->
  ``RemoteProtocolError``. Messages are fixed texts and OS error strings: aiohttp's exception
  texts can carry the request's headers (``Authorization``) or the server's bytes, so none is
  copied.

Deadlines: ``read`` is aiohttp's ``sock_read`` (restarted by every byte, started once the
request is written); ``connect`` bounds DNS, TCP connect and TLS together (httpx: DNS+TCP, then
TLS, each), and also a wait for a free connection of this client, which ``PooledProvider`` never
has (one call per client at a time; httpx would not bound that wait). aiohttp has no write
timeout: ``_Protocol`` fails a request whose writing stays paused (the peer stopped reading, the
socket buffers are full) for the read timeout, the bound ``_http.httpx_timeout`` gives httpx's
writes; anything slower is bounded by ``_http.send``'s total deadline.

Where aiohttp would part from httpcore on hostile bytes, ``_Protocol`` (aiohttp's connection
protocol, swapped in through the connector's protocol factory) and ``_refused_head`` bring it
back: the head (status line + headers), a chunk header and the trailers are each bounded at
h11's 100 KiB, counted as bytes arrive, so a server streaming them cannot grow memory; a head starting with a blank line, a transfer
coding other than chunked, a 101, a status under 100 or control bytes in the reason phrase are
refused; a reset inside a body (which aiohttp reports like a short body, or not at all for a
body delimited by the close) is a ``ReadError``; bytes arriving on an idle kept-alive connection
(a late 408) close it instead of becoming the next request's answer.

What stays different (aiohttp's parser is stricter than h11; tests/workers/test_client_hostile.py pins
each): a listed ``Content-Length`` ("2, 2") and ``Content-Length`` beside ``Transfer-Encoding:
chunked`` are ``RemoteProtocolError`` here, where httpcore takes the answer; with llhttp (aiohttp's C parser, what its wheels ship) so are a
duplicated ``Content-Length``, an ``HTTP/1.2`` status line, and bytes after a complete response
in the same read (a 204 with a body; httpcore takes the answer and fails the connection's next
call instead). Under ``PYTHONASYNCIODEBUG``/``-X dev`` aiohttp parses strictly (no obs-fold).
"""

from __future__ import annotations

import asyncio
import functools
import re
import ssl
from collections.abc import AsyncIterator
from typing import Any, cast

import aiohttp
import httpx
from aiohttp import http_exceptions
from aiohttp.client_proto import ResponseHandler
from yarl import URL

from workers.providers.direct import RequestBuilder

MAX_HEAD_BYTES = 100 * 1024  # httpcore's h11 bound on a response's status line + headers
# aiohttp's own bound on one status or header line, set above anything the 100 KiB count lets
# through (that count stops a head whose incomplete part passes it after a read, and asyncio and
# uvloop read at most 256 KiB at a time), so the count is the bound that bites, as in h11
MAX_LINE_BYTES = 1024 * 1024
KEEPALIVE_S = 5.0  # idle connections closed after this, as httpx's default keepalive_expiry
_NO_BODY = frozenset((204, 304, *range(100, 200)))  # statuses whose answers carry no body
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # not allowed in a reason phrase (RFC 9112, h11)

# aiohttp's parse errors, worded without the server's bytes (its messages quote them)
_MALFORMED = (
    (http_exceptions.LineTooLong, f"a status or header line over {MAX_LINE_BYTES} bytes"),
    (http_exceptions.BadStatusLine, "malformed status line"),
    (http_exceptions.InvalidHeader, "malformed header"),
    (http_exceptions.ContentLengthError, "body shorter than its Content-Length"),
    (http_exceptions.TransferEncodingError, "malformed or cut chunked body"),
    (http_exceptions.BadHttpMessage, "malformed response"),
)


class _WriteStalled(aiohttp.ClientError):
    """The request could not be written on for the read timeout (the peer stopped reading)."""


class _BadFraming(aiohttp.ClientError):
    """HTTP framing h11 refuses and aiohttp's parser would take: a head starting with a blank
    line, or a head, chunk header or trailer section still incomplete past ``MAX_HEAD_BYTES``."""


class _Protocol(ResponseHandler):
    """aiohttp's connection protocol, plus what httpcore knows: how the connection ended
    (aiohttp ends a close-delimited body on a reset as if it were complete, and reports a reset
    inside a sized body like a short body), how many bytes came that were not body, whether the
    connection is idle, and how long writing has been paused."""

    lost: BaseException | None = None  # the error the connection ended with (None: open, or clean)
    # bytes of the answer in progress that were not body (head, chunk headers and extensions,
    # trailers), counted by whole reads since its body last grew; -1: no answer in progress
    _framing = -1
    _body: Any = None  # the body reader (aiohttp StreamReader) of the answer in progress
    _idle = False  # the last answer was read whole and no request is out: bytes now are unsolicited
    _stalled: asyncio.TimerHandle | None = None  # the write-progress deadline while paused

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = exc
        self._drop_stall()
        super().connection_lost(exc)

    # aiohttp has no write timeout. httpx's bounds each socket write (``_http.httpx_timeout``
    # sets write = read): here the transport pausing us (its buffer full: the peer stopped
    # reading) for the read timeout fails the request the same way, as a write timeout.
    def pause_writing(self) -> None:
        super().pause_writing()
        if self.read_timeout and self._stalled is None:
            self._stalled = asyncio.get_running_loop().call_later(self.read_timeout, self._on_stalled)

    def resume_writing(self) -> None:
        self._drop_stall()
        super().resume_writing()

    def _drop_stall(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def _on_stalled(self) -> None:
        self._stalled = None
        self._fail(_WriteStalled("no write progress within the read timeout"), abort=True)

    def set_response_params(self, **kwargs: Any) -> None:  # a request was sent: its answer is next
        self._framing, self._body, self._idle = 0, None, False
        super().set_response_params(**kwargs)

    def feed_data(self, data: Any, size: int = 0) -> None:  # a parsed head, with its body reader
        message, body = data
        if 100 <= message.code < 200 and message.code != 101:
            self._framing = 0  # an informational head: the real one follows, counted afresh (h11)
        else:
            self._body = body
            body.on_eof(self._answered)  # at once for an answer without a body
        super().feed_data(data, size)

    def _answered(self) -> None:
        self._framing, self._body, self._idle = -1, None, True

    def data_received(self, data: bytes) -> None:
        if self._idle and data:
            # bytes nobody asked for on a kept-alive connection (a late 408, a second answer):
            # aiohttp would hand them to the next request as its answer; httpcore drops a
            # connection that turns readable while idle, and so does this client
            self._idle = False
            if self.transport is not None:
                self.transport.close()
            return
        if self._framing < 0:
            super().data_received(data)
            return
        body = self._body
        if self._framing == 0 and body is None and data[:1] in (b"\r", b"\n"):  # llhttp would skip it
            self._fail(_BadFraming("no response line received"))
            return
        before = body.total_bytes if body is not None else 0
        super().data_received(data)
        if self._framing < 0:  # the answer ended in these bytes
            return
        grown = (self._body.total_bytes if self._body is not None else 0) - (before if self._body is body else 0)
        self._framing = (0 if grown else self._framing) + len(data) - grown
        # h11 refuses an event (head, chunk header, trailers) still incomplete past the bound;
        # this counts whole reads, so it can bite a read earlier or later, never much later
        if self._framing > MAX_HEAD_BYTES and self.exception() is None:
            what = "response head" if self._body is None else "chunk framing or trailers"
            self._fail(_BadFraming(f"{what} over {MAX_HEAD_BYTES} bytes"))

    def _fail(self, exc: BaseException, *, abort: bool = False) -> None:
        """End the exchange with ``exc`` as aiohttp does on a parse error, the body's reader too
        (``abort``: drop the unsent bytes, or closing would wait for a peer that does not read)."""
        if self._body is not None:
            self._body.set_exception(exc)
        if self.transport is not None:
            self.transport.abort() if abort else self.transport.close()
        self.set_exception(exc)


class _Response(aiohttp.ClientResponse):
    """Keeps the connection's protocol, which outlives the response's hold on the connection
    (released as soon as the body ends, before the reader sees the end)."""

    wire: _Protocol | None = None

    async def start(self, connection: aiohttp.connector.Connection) -> aiohttp.ClientResponse:
        self.wire = cast("_Protocol | None", connection.protocol)  # the connector's factory makes _Protocols (_open)
        return await super().start(connection)


class _Body(httpx.AsyncByteStream):
    """An aiohttp response body as the httpx stream of an ``httpx.Response``: raw bytes, failures
    as httpx exceptions; ``aclose`` releases the connection (closing it if the body is unread)."""

    __slots__ = ("_response", "_request", "_close_delimited")

    def __init__(self, response: _Response, request: httpx.Request) -> None:
        self._response = response
        self._request = request
        headers = response.headers
        # a body ended only by the connection closing: a reset ends it too, and must not pass
        # for the whole body (HEAD, 1xx, 204 and 304 answers have none)
        self._close_delimited = (
            "Content-Length" not in headers and "Transfer-Encoding" not in headers
            and response.status not in _NO_BODY and request.method != "HEAD"
        )

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content = self._response.content
        error: httpx.HTTPError | None = None
        try:
            while chunk := await content.readany():
                yield chunk
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            error = _translate(exc, self._request, self._response.wire)
        wire = self._response.wire
        if error is None and self._close_delimited and wire is not None and isinstance(wire.lost, OSError):
            error = httpx.ReadError(_os_text(wire.lost), request=self._request)
        if error is not None:
            raise error  # outside the except: aiohttp's exception (request headers in its args) is not chained

    async def aclose(self) -> None:
        self._response.release()


class AioClient:
    """``build_request``/``send``/``aclose`` of ``DirectClient``, over one aiohttp session.

    ``max_connections``: the connector's limit (``PooledProvider`` uses 1: one call at a time).
    ``tls``: the verifying context (``registry.make_tls_context``), shared between clients.
    The session is opened on the first ``send``, on the running loop (asyncio's or uvloop's).
    """

    def __init__(self, max_connections: int = 1, *, tls: ssl.SSLContext) -> None:
        self._limit = max_connections
        self._tls = tls
        self._session: aiohttp.ClientSession | None = None
        self._requests = RequestBuilder()
        self.headers = self._requests.headers
        # parsed once per URL and per deadline pair, as DirectClient's caches (tiny: one entry
        # per route and per timeout policy a provider uses)
        self._targets: dict[int, tuple[httpx.URL, URL]] = {}
        self._timeouts: dict[tuple[float | None, float | None], aiohttp.ClientTimeout] = {}

    def build_request(
        self, method: str, url: str, *, json: Any = None, headers: dict[str, str] | None = None,
        timeout: httpx.Timeout,
    ) -> httpx.Request:
        """The request ``DirectClient.build_request`` builds (same headers, body and ``timeout``
        extension)."""
        return self._requests.build(method, url, json=json, headers=headers, timeout=timeout)

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self._limit, limit_per_host=0, ssl=self._tls, keepalive_timeout=KEEPALIVE_S,
            use_dns_cache=False,  # httpcore resolves on every new connection
        )
        # a partial making _Protocols is one making ResponseHandlers (partial is invariant in the stubs)
        connector._factory = cast(
            "functools.partial[ResponseHandler]", functools.partial(_Protocol, loop=asyncio.get_running_loop())
        )
        self._session = aiohttp.ClientSession(
            connector=connector, response_class=_Response, cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False, trust_env=False, raise_for_status=False,
            # the request's own headers are complete (build_request): aiohttp adds none of its
            # defaults (User-Agent, Accept, ..., Content-Type: application/octet-stream)
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            max_line_size=MAX_LINE_BYTES, max_field_size=MAX_LINE_BYTES, max_headers=MAX_HEAD_BYTES // 4,
        )
        # aiohttp sends an idempotent request (GET /v1/models) again when its connection fails;
        # httpcore does not, so neither does this client (an endpoint sees each call once)
        if hasattr(self._session, "_retry_connection"):
            self._session._retry_connection = False
        return self._session

    def _target(self, url: httpx.URL) -> URL:
        entry = self._targets.get(id(url))
        if entry is None or entry[0] is not url:
            # encoded=True: httpx has already percent-encoded it; yarl must not re-quote
            entry = self._targets[id(url)] = (url, URL(str(url), encoded=True))
        return entry[1]

    def _timeout(self, request: httpx.Request) -> aiohttp.ClientTimeout:
        limits = request.extensions.get("timeout", {})
        key = (limits.get("connect"), limits.get("read"))
        timeout = self._timeouts.get(key)
        if timeout is None:
            # ceil_threshold: never round a deadline up to a whole second (aiohttp does from 5 s)
            timeout = self._timeouts[key] = aiohttp.ClientTimeout(
                total=None, connect=key[0], sock_connect=key[0], sock_read=key[1], ceil_threshold=float("inf")
            )
        return timeout

    async def send(self, request: httpx.Request, *, stream: bool = True) -> httpx.Response:
        """Send ``request``; the response's body is still to be read (``stream`` must be True:
        ``_http.send`` always reads bodies itself, bounded)."""
        if not stream:
            raise ValueError("AioClient.send only streams; read the body with aiter_bytes()")
        session = self._session or self._open()
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        error: httpx.HTTPError | None
        try:
            response = cast(_Response, await session.request(  # the session's response_class (_open)
                request.method, self._target(request.url), data=request.content or None, headers=headers,
                allow_redirects=False, timeout=self._timeout(request),
            ))
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            error = _translate(exc, request, None)
        else:
            error = None
            refused = _refused_head(response)
            if refused:
                response.close()
                error = httpx.RemoteProtocolError(refused, request=request)
        if error is not None:
            raise error  # outside the except: aiohttp's exception (request headers in its args) is not chained
        return httpx.Response(
            response.status, headers=response.raw_headers, stream=_Body(response, request), request=request,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": (response.reason or "").encode("latin-1", "replace")},
        )

    async def aclose(self) -> None:
        """Close the pooled connection(s)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AioClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _refused_head(response: aiohttp.ClientResponse) -> str:
    """Why h11 would refuse a head aiohttp's (lenient) parser took, "" when it would not: a
    transfer coding other than chunked (aiohttp reads such a body to the close), a 101 (aiohttp
    hands the connection over), a status under 100, control bytes in the reason phrase."""
    codings = response.headers.getall("Transfer-Encoding", ())
    if codings and [c.strip().lower() for v in codings for c in v.split(",") if c.strip()] != ["chunked"]:
        return "Only Transfer-Encoding: chunked is supported"
    if response.status == 101:
        return "unexpected 101 Switching Protocols"
    if response.status < 100:
        return f"status code {response.status} out of range"
    if response.reason and _CONTROL.search(response.reason):
        return "control bytes in the status line"
    return ""


def _os_text(exc: BaseException) -> str:
    """An OS error as ``[Errno n] text`` (never anything of the request)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"[Errno {exc.errno}] {exc.strerror}" if exc.errno is not None else exc.strerror
    return type(exc).__name__


def _malformed(exc: BaseException) -> str:
    """What was malformed, from the parse error anywhere in ``exc``'s cause chain."""
    seen: BaseException | None = exc
    while seen is not None:
        for cls, text in _MALFORMED:
            if isinstance(seen, cls):
                return f"{text} ({type(seen).__name__})"
        seen = seen.__cause__
    return f"malformed response ({type(exc).__name__})"


def _translate(exc: BaseException, request: httpx.Request, protocol: _Protocol | None) -> httpx.HTTPError:
    """The httpx exception httpcore raises for the event behind aiohttp's ``exc``."""
    lost = protocol.lost if protocol is not None else None
    if isinstance(exc, _WriteStalled):
        return httpx.WriteTimeout("no write progress in time", request=request)
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout("connection not established in time", request=request)
    if isinstance(exc, TimeoutError):  # SocketTimeoutError: sock_read, waiting for the head or the body
        return httpx.ReadTimeout("no bytes received in time", request=request)
    if isinstance(exc, aiohttp.ClientConnectorError):  # refused, unreachable, DNS, TLS handshake
        return httpx.ConnectError(_os_text(getattr(exc, "os_error", None) or exc), request=request)
    if isinstance(exc, _BadFraming):
        return httpx.RemoteProtocolError(str(exc), request=request)
    if isinstance(exc, (aiohttp.ClientResponseError, aiohttp.ClientPayloadError)):
        if isinstance(lost, OSError):  # cut by a reset, not by a lying server
            return httpx.ReadError(_os_text(lost), request=request)
        return httpx.RemoteProtocolError(_malformed(exc), request=request)
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
    if isinstance(exc, OSError):  # ClientOSError, ClientConnectionResetError: a reset mid-exchange
        return httpx.ReadError(_os_text(exc), request=request)
    if isinstance(exc, aiohttp.ClientConnectionError):
        return httpx.ReadError(type(exc).__name__, request=request)
    if isinstance(exc, ValueError):  # a header aiohttp refuses to write (CR/LF in a value)
        return httpx.LocalProtocolError(f"request not sendable ({type(exc).__name__})", request=request)
    return httpx.TransportError(f"{type(exc).__name__}", request=request)
