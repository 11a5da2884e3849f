"""What a lying endpoint does to one call, byte by byte, through each of ``PooledProvider``'s
clients: ``AioClient`` (aiohttp, the default) must classify every case as ``DirectClient``
(httpx's transport, the reference) does, on uvloop (the local executor) and on asyncio's own
loop (the Celery worker).

Each case is a script played by ``serve_scripts`` and sent through ``_http.send`` (the layer
that turns httpx exceptions into failures.md classes). The request carries an API key in its
``Authorization`` header that is *not* passed as a secret to mask, so a message that quoted a
request header would show it. ``DIFFERENT`` pins what cannot be made to match: aiohttp's parsers
(llhttp in C, and its pure-Python fallback) refuse framing h11 accepts; the reasons are in
``workers/providers/aio.py``.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from aiohttp.http_parser import HttpResponseParser, HttpResponseParserPy

from storage.records import Outcome
from tests.support.raw_http import CLOSE, HANG, RESET, Step, serve_scripts
from workers.errors import ProviderError
from workers.providers import _http
from workers.providers.aio import AioClient
from workers.providers.direct import DirectClient
from workers.providers.registry import make_tls_context
from workers.runtask import TimeoutPolicy

pytestmark = pytest.mark.slow

KEY = "sk-clientHOSTILE-0f1e2d3c4b5a"
TIMEOUTS = TimeoutPolicy(connect_timeout_s=0.5, read_timeout_s=0.4, total_timeout_s=1.5)
CLIENTS = {"aio": AioClient, "direct": DirectClient}
OK = "ok"  # a whole response came back (whatever its status)

_BODY = b'{"ok": true}'
_GZ = gzip.compress(_BODY)


def _head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


# name: (script, outcome for both clients)
SAME: dict[str, tuple[list[Step], str]] = {
    "content-length": ([_head("HTTP/1.1 200 OK", "Content-Length: 12") + _BODY], OK),
    "chunked": ([_head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked") + b"c\r\n" + _BODY + b"\r\n0\r\n\r\n"], OK),
    "close-delimited": ([_head("HTTP/1.1 200 OK") + _BODY, CLOSE], OK),
    "gzip": ([_head("HTTP/1.1 200 OK", "Content-Encoding: gzip", f"Content-Length: {len(_GZ)}") + _GZ], OK),
    "header-line-100kb": ([_head("HTTP/1.1 200 OK", "X-Big: " + "a" * 100_000, "Content-Length: 12") + _BODY], OK),
    "headers-300": ([_head("HTTP/1.1 200 OK", *[f"X-H{i}: v" for i in range(300)], "Content-Length: 12") + _BODY], OK),
    "continue-then-200": ([_head("HTTP/1.1 100 Continue") + _head("HTTP/1.1 200 OK", "Content-Length: 12") + _BODY], OK),
    "status-600": ([_head("HTTP/1.1 600 X", "Content-Length: 12") + _BODY], OK),
    # malformed HTTP: protocol_error
    "truncated-content-length": ([_head("HTTP/1.1 200 OK", "Content-Length: 5000") + b'{"ab', CLOSE], "protocol_error"),
    "truncated-chunked": ([_head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked") + b"100\r\nabc", CLOSE],
                          "protocol_error"),
    "bad-chunk-size": ([_head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked") + b"zz\r\nabc\r\n0\r\n\r\n"],
                       "protocol_error"),
    "garbage-status-line": ([b"garbage\r\n\r\n", CLOSE], "protocol_error"),
    "status-line-200kb": ([b"HTTP/1.1 200 " + b"O" * 200_000 + b"\r\nContent-Length: 0\r\n\r\n"], "protocol_error"),
    "header-line-1mb": ([_head("HTTP/1.1 200 OK", "X-Big: " + "a" * 1_000_000, "Content-Length: 12") + _BODY],
                        "protocol_error"),
    "headers-200kb": ([_head("HTTP/1.1 200 OK", *[f"X-H{i}: " + "v" * 1000 for i in range(200)], "Content-Length: 12")],
                      "protocol_error"),
    "endless-headers": ([b"HTTP/1.1 200 OK\r\n", *[b"X-A: " + b"v" * 1000 + b"\r\n"] * 2000, HANG], "protocol_error"),
    "endless-chunk-extension": ([_head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked") + b"2;ext=",
                                 *[b"a" * 65536] * 40, HANG], "protocol_error"),
    "chunk-extension-200kb": ([_head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked") + b"2;x=" + b"a" * 200_000
                               + b"\r\nok\r\n0\r\n\r\n"], "protocol_error"),
    "endless-trailers": ([_head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked") + b"2\r\nok\r\n0\r\n",
                          *[b"X-T: " + b"v" * 1000 + b"\r\n"] * 2000, HANG], "protocol_error"),
    "blank-line-before-status": ([b"\r\n" + _head("HTTP/1.1 200 OK", "Content-Length: 12") + _BODY], "protocol_error"),
    "transfer-encoding-gzip": ([_head("HTTP/1.1 200 OK", "Transfer-Encoding: gzip, chunked") + b"2\r\nok\r\n0\r\n\r\n"],
                               "protocol_error"),
    "switching-protocols": ([_head("HTTP/1.1 101 Switching Protocols", "Upgrade: x", "Connection: Upgrade"), CLOSE],
                            "protocol_error"),
    "status-000": ([_head("HTTP/1.1 000 X", "Content-Length: 12") + _BODY], "protocol_error"),
    "nul-in-reason": ([b"HTTP/1.1 200 O\x00K\r\nContent-Length: 12\r\n\r\n" + _BODY], "protocol_error"),
    "nul-in-header": ([b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 12\r\n\r\n" + _BODY], "protocol_error"),
    "bad-gzip": ([_head("HTTP/1.1 200 OK", "Content-Encoding: gzip", "Content-Length: 10") + b"notgzip!!!"],
                 "protocol_error"),
    "close-before-response": ([CLOSE], "protocol_error"),
    "close-mid-head": ([b"HTTP/1.1 200 OK\r\nX-A: b", 0.05, CLOSE], "protocol_error"),
    # a reset anywhere is a network failure: connect_error, retried
    "reset-before-response": ([RESET], "connect_error"),
    "reset-mid-head": ([b"HTTP/1.1 200 OK\r\nX-A: b", 0.05, RESET], "connect_error"),
    "reset-after-head": ([_head("HTTP/1.1 200 OK", "Content-Length: 100"), 0.05, RESET], "connect_error"),
    "reset-with-head": ([_head("HTTP/1.1 200 OK", "Content-Length: 100") + b"abc", RESET], "connect_error"),
    "reset-mid-chunked": ([_head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked") + b"3\r\nabc\r\n", 0.05, RESET],
                          "connect_error"),
    "reset-mid-close-delimited": ([_head("HTTP/1.1 200 OK") + b"abc", 0.05, RESET], "connect_error"),
    # deadlines
    "never-answers": ([HANG], "timeout_read"),
    "head-then-silence": ([_head("HTTP/1.1 200 OK", "Content-Length: 100") + b"abc", HANG], "timeout_read"),
    "endless-100-continue": ([*[_head("HTTP/1.1 100 Continue"), 0.05] * 60], "timeout_total"),
    "trickle-past-total": ([_head("HTTP/1.1 200 OK", "Content-Length: 100"), *[0.1, b"a"] * 40], "timeout_total"),
}
# name: (script, DirectClient's outcome, AioClient's with llhttp, AioClient's with aiohttp's
# pure-Python parser (AIOHTTP_NO_EXTENSIONS=1, or no C extension for the platform))
DIFFERENT: dict[str, tuple[list[Step], str, str, str]] = {
    "duplicate-content-length": ([_head("HTTP/1.1 200 OK", "Content-Length: 12", "Content-Length: 12") + _BODY],
                                 OK, "protocol_error", OK),
    "content-length-list": ([_head("HTTP/1.1 200 OK", "Content-Length: 12, 12") + _BODY],
                            OK, "protocol_error", "protocol_error"),
    "content-length-and-chunked": (
        [_head("HTTP/1.1 200 OK", "Content-Length: 100", "Transfer-Encoding: chunked") + b"2\r\nok\r\n0\r\n\r\n"],
        OK, "protocol_error", "protocol_error",
    ),
    "http-1.2": ([_head("HTTP/1.2 200 OK", "Content-Length: 12") + _BODY], OK, "protocol_error", OK),
    # bytes after a whole answer, in the same read: h11 keeps them (and fails the next call on the
    # connection), llhttp fails the read that holds them
    "trailing-bytes": ([_head("HTTP/1.1 200 OK", "Content-Length: 12") + _BODY + b"JUNK"], OK, "protocol_error", OK),
    "204-with-body": ([_head("HTTP/1.1 204 No Content", "Content-Length: 12") + _BODY], OK, "protocol_error", OK),
}
LLHTTP = HttpResponseParser is not HttpResponseParserPy  # aiohttp parses with its C extension
SCRIPTS = {name: case[0] for name, case in {**SAME, **DIFFERENT}.items()}


def _run(loop: str, coro: Coroutine[Any, Any, Any]) -> Any:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


async def _call(client_cls: Callable[..., Any], url: str, *, json_body: dict[str, Any] | None = None,
                timeouts: TimeoutPolicy = TIMEOUTS) -> tuple[str, str]:
    """(outcome, error text) of one ``_http.send`` through a fresh client; the key is sent but
    not masked, and must appear in no error text of the chain."""
    async with client_cls(tls=make_tls_context()) as client:
        try:
            raw = await _http.send(client, _http.HttpCall(
                "POST", url, json_body={"model": "m"} if json_body is None else json_body,
                headers={"Authorization": f"Bearer {KEY}"}, context="model=m"), timeouts=timeouts, clock=time.monotonic)
        except ProviderError as exc:
            chain: BaseException | None = exc
            while chain is not None:
                assert KEY not in str(chain) and KEY not in repr(chain.args), f"{type(chain).__name__}: {chain}"
                chain = chain.__context__
            assert "\n" not in str(exc)  # errors in one line
            return exc.outcome.value, str(exc)
        return OK, f"HTTP {raw.status_code} {raw.body[:40]!r}"


async def _scripted(client_cls: Callable[..., Any], name: str) -> tuple[str, str]:
    async with serve_scripts(SCRIPTS) as base_url:
        return await _call(client_cls, f"{base_url}/{name}")


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("name", sorted(SAME))
def test_both_clients_classify_alike(name: str, client: str, loop: str) -> None:
    outcome, text = _run(loop, _scripted(CLIENTS[client], name))
    assert outcome == SAME[name][1], text


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("name", sorted(DIFFERENT))
def test_what_aiohttp_refuses_and_h11_takes(name: str, client: str, loop: str) -> None:
    _, direct, aio_llhttp, aio_python = DIFFERENT[name]
    outcome, text = _run(loop, _scripted(CLIENTS[client], name))
    assert outcome == (direct if client == "direct" else aio_llhttp if LLHTTP else aio_python), text


def test_messages_name_what_went_wrong() -> None:
    """Spot checks of the texts a user reads (the classes are pinned above)."""
    async def main() -> dict[str, str]:
        async with serve_scripts(SCRIPTS) as base_url:
            names = ("truncated-content-length", "headers-200kb", "endless-trailers", "reset-after-head",
                     "transfer-encoding-gzip")
            return {n: (await _call(AioClient, f"{base_url}/{n}"))[1] for n in names}

    texts = _run("uvloop", main())
    assert "body shorter than its Content-Length" in texts["truncated-content-length"]
    assert "response head over 102400 bytes" in texts["headers-200kb"]
    assert "chunk framing or trailers over 102400 bytes" in texts["endless-trailers"]
    assert "connection lost: [Errno 104]" in texts["reset-after-head"]
    assert "Only Transfer-Encoding: chunked is supported" in texts["transfer-encoding-gzip"]


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_refused_port_and_connect_deadline(client: str, loop: str) -> None:
    async def main() -> tuple[tuple[str, str], tuple[str, str], float]:
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        refused_url = f"http://127.0.0.1:{free.getsockname()[1]}/x"
        free.close()
        refused = await _call(CLIENTS[client], refused_url)
        # a listener whose accept queue is full: SYNs are dropped, the handshake never ends
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = [socket.socket() for _ in range(4)]
        for s in fillers:
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        try:
            stuck = await _call(CLIENTS[client], f"http://127.0.0.1:{port}/x")
        finally:
            for s in (*fillers, listener):
                s.close()
        return refused, stuck, time.monotonic() - t0

    refused, stuck, took_s = _run(loop, main())
    assert refused[0] == "connect_error" and "cannot connect" in refused[1]
    assert stuck[0] == "timeout_connect" and 0.4 < took_s < 1.4, (stuck, took_s)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_server_that_stops_reading_is_a_write_timeout(client: str, loop: str) -> None:
    """32 MB of request body against a peer that never reads: the socket buffers fill, writing
    stalls, and after read_timeout_s without progress the call ends as httpx's write timeout."""
    async def main() -> tuple[tuple[str, str], float]:
        stalled: set[asyncio.Task[None]] = set()

        async def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            stalled.add(asyncio.current_task())  # type: ignore[arg-type]
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                writer.transport.abort()

        server = await asyncio.start_server(never_read, "127.0.0.1", 0, limit=1024)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/x"
        t0 = time.monotonic()
        try:
            return await _call(CLIENTS[client], url, json_body={"x": "a" * 32_000_000},
                               timeouts=TimeoutPolicy(connect_timeout_s=1, read_timeout_s=0.5, total_timeout_s=20)), \
                time.monotonic() - t0
        finally:
            server.close()
            for task in stalled:
                task.cancel()
            await asyncio.gather(*stalled, return_exceptions=True)

    (outcome, text), took_s = _run(loop, main())
    assert outcome == "timeout_read" and "(write timed out)" in text, text
    assert took_s < 10


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_bytes_on_an_idle_connection_never_answer_the_next_call(client: str, loop: str) -> None:
    """A server that sends a late 408 on a kept-alive connection after answering: the next call
    gets its own answer on a new connection, not the stale 408."""
    async def main() -> tuple[list[tuple[int, bytes]], int]:
        connections = 0

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            try:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nFRESH")
                await asyncio.sleep(0.05)
                writer.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 5\r\n\r\nSTALE")
                await writer.drain()
                await reader.read()
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
                pass
            finally:
                writer.transport.abort()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/x"
        answers = []
        async with CLIENTS[client](tls=make_tls_context()) as c:
            for _ in range(3):
                raw = await _http.send(c, _http.HttpCall("POST", url, json_body={}), timeouts=TIMEOUTS, clock=time.monotonic)
                answers.append((raw.status_code, raw.body))
                await asyncio.sleep(0.2)
        server.close()
        return answers, connections

    answers, connections = _run(loop, main())
    assert answers == [(200, b"FRESH")] * 3 and connections == 3


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_get_that_fails_is_sent_once(client: str) -> None:
    """aiohttp would resend an idempotent request whose connection failed; httpcore does not."""
    async def main() -> tuple[str, int]:
        seen = 0

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal seen
            await reader.readuntil(b"\r\n\r\n")
            seen += 1
            writer.transport.abort()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/models"
        async with CLIENTS[client](tls=make_tls_context()) as c:
            try:
                await _http.send(c, _http.HttpCall("GET", url), timeouts=TIMEOUTS, clock=time.monotonic)
                outcome = OK
            except ProviderError as exc:
                outcome = exc.outcome.value
        server.close()
        return outcome, seen

    outcome, seen = _run("uvloop", main())
    assert outcome in (Outcome.CONNECT_ERROR.value, Outcome.PROTOCOL_ERROR.value) and seen == 1
