"""``PooledProvider``'s clients over real loopback HTTP: ``AioClient`` (aiohttp, the default) and
``DirectClient`` (httpx's transport without ``AsyncClient``'s layers), each on uvloop (the local
executor) and on asyncio's own loop (the Celery worker).

A keep-alive server records each request head and answers with a gzip-encoded completion that
also sets a cookie, so the tests see what goes on the wire (the same head from every client,
default headers, no cookie sent back), that bodies are decoded, and that deadlines and refused
connections are classified as through an ``AsyncClient``. Hostile answers, byte by byte, are in
tests/workers/test_client_hostile.py.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from storage.records import Outcome
from tests.support.raw_http import serve_fixed
from workers.errors import ConnectFailed, TotalTimeout
from workers.providers import _http
from workers.providers.aio import AioClient
from workers.providers.base import ChatRequest
from workers.providers.direct import DirectClient
from workers.providers.openai_compat import OpenAIProvider
from workers.providers.pooled import PooledProvider
from workers.providers.registry import make_http_client, make_tls_context
from workers.runtask import TimeoutPolicy

CLIENTS = {"aio": AioClient, "direct": DirectClient}
LOOPS = ("uvloop", "asyncio")

_ANSWER = {"choices": [{"message": {"content": "héllo"}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
_BODY = gzip.compress(json.dumps(_ANSWER).encode())


def _run(loop: str, coro: Coroutine[Any, Any, Any]) -> Any:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


async def _serve(heads: list[bytes], delay_s: float = 0.0) -> asyncio.Server:
    return await serve_fixed(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
                             b"set-cookie: session=abc\r\ncontent-length: %d\r\n\r\n%s" % (len(_BODY), _BODY),
                             delay_s=delay_s, on_request=heads.append)


def _request(total_s: float = 10.0) -> ChatRequest:
    return ChatRequest(model="m", user_message="hi", timeouts=TimeoutPolicy(total_timeout_s=total_s))


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_default_headers_decoded_body_and_no_cookie_jar(client: str, loop: str) -> None:
    heads: list[bytes] = []

    async def main() -> list[tuple[str | None, int]]:
        server = await _serve(heads)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            async with CLIENTS[client](tls=make_tls_context()) as c:
                provider = OpenAIProvider(c, url, "sk-secret")
                replies = [await provider.complete(_request()) for _ in range(2)]
                return [(r.answer_text, r.bytes_received) for r in replies]
        finally:
            server.close()
            await server.wait_closed()

    answers = _run(loop, main())
    assert answers == [("héllo", len(_BODY))] * 2  # gzip body decoded, UTF-8 kept; wire bytes counted
    assert len(heads) == 2
    for head in heads:
        text = head.decode().lower()
        assert "user-agent: python-httpx/" in text and "accept-encoding: gzip, deflate" in text
        assert "authorization: bearer sk-secret" in text and "cache-control: no-store" in text
        assert "cookie:" not in text  # the first answer's cookie is not sent with the next call


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_total_deadline_and_refused_connection_are_classified(client: str, loop: str) -> None:
    async def main() -> tuple[Exception, Exception]:
        server = await _serve([], delay_s=2.0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            async with CLIENTS[client](tls=make_tls_context()) as c:
                with pytest.raises(TotalTimeout) as slow:
                    await OpenAIProvider(c, url, None).complete(_request(total_s=0.3))
        finally:
            server.close()
            await server.wait_closed()
        async with CLIENTS[client](tls=make_tls_context()) as c:  # nothing listens there now
            with pytest.raises(ConnectFailed) as refused:
                await OpenAIProvider(c, url, None).complete(_request())
        return slow.value, refused.value

    slow, refused = _run(loop, main())
    assert slow.outcome is Outcome.TIMEOUT_TOTAL and slow.latency_ms >= 250
    assert refused.outcome is Outcome.CONNECT_ERROR


def test_every_client_puts_the_same_head_on_the_wire() -> None:
    """A provider's POST, a bodiless POST and a GET, byte for byte alike from ``AioClient``,
    ``DirectClient`` and an ``AsyncClient`` (``registry.make_http_client``)."""
    heads: list[bytes] = []

    async def main() -> None:
        server = await serve_fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", on_request=heads.append)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions?q=%2F&r=a%20b"
        policy = TimeoutPolicy(total_timeout_s=5)
        headers = {"Authorization": "Bearer k", "Cache-Control": "no-store", "Accept": "application/json"}
        for make in (lambda: AioClient(tls=make_tls_context()), lambda: DirectClient(tls=make_tls_context()),
                     lambda: make_http_client(1)):
            async with make() as c:
                await _http.send(c, _http.HttpCall("POST", url, json_body={"model": "héllo", "n": [1, 2.5, None]}, headers=headers),
                                 timeouts=policy, clock=time.monotonic)
                await _http.send(c, _http.HttpCall("POST", url, headers=headers), timeouts=policy, clock=time.monotonic)
                await _http.send(c, _http.HttpCall("GET", url.replace("chat/completions", "models"), headers=headers),
                                 timeouts=policy, clock=time.monotonic)
        server.close()
        await server.wait_closed()

    _run("uvloop", main())
    aio, direct, httpx_client = heads[0:3], heads[3:6], heads[6:9]
    assert aio == direct == httpx_client
    assert b"Content-Length: 0" in aio[1] and b"Content-Type" not in aio[1] and b"Content-Length" not in aio[2]


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_pooled_provider_makes_the_injected_client(client: str, loop: str) -> None:
    """``PooledProvider`` makes ``AioClient``s unless told otherwise, one per concurrent call."""
    async def main() -> tuple[list[str], set[type], int]:
        server = await _serve([], delay_s=0.05)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        made: list[Any] = []

        def factory(max_connections: int = 1, *, tls: Any) -> Any:
            made.append(CLIENTS[client](max_connections, tls=tls))
            return made[-1]

        pool = PooledProvider(lambda c: OpenAIProvider(c, url, None), tls=make_tls_context(), client_factory=factory)
        try:
            replies = await asyncio.gather(*[pool.complete(_request()) for _ in range(3)])
            clients_made = pool.clients_made
        finally:
            await pool.aclose()
            server.close()
            await server.wait_closed()
        return [r.answer_text for r in replies], {type(c) for c in made}, clients_made

    answers, kinds, made = _run(loop, main())
    assert answers == ["héllo"] * 3 and kinds == {CLIENTS[client]} and made == 3


def test_pooled_provider_defaults_to_aio_client() -> None:
    import inspect

    assert inspect.signature(PooledProvider).parameters["client_factory"].default is AioClient


def _self_signed(tmp_path: Any) -> tuple[str, str]:
    """A certificate for ``localhost`` only (not 127.0.0.1) and its key, made by the openssl CLI."""
    import subprocess

    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost"], check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_tls_is_verified_with_the_shared_context(client: str, loop: str, tmp_path: Any) -> None:
    """Over HTTPS the client verifies with the context it is given (certificate and host name):
    a trusted certificate answers; an unknown one, or one for another name, is a connect_error."""
    import ssl

    cert, key = _self_signed(tmp_path)

    async def main() -> list[str]:
        served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        served.load_cert_chain(cert, key)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
            except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
                pass
            finally:
                writer.transport.abort()

        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=served)
        port = server.sockets[0].getsockname()[1]
        trusting = make_tls_context()
        trusting.load_verify_locations(cert)
        outcomes = []
        for tls, host in ((trusting, "localhost"), (make_tls_context(), "localhost"), (trusting, "127.0.0.1")):
            async with CLIENTS[client](tls=tls) as c:
                try:
                    raw = await _http.send(c, _http.HttpCall("POST", f"https://{host}:{port}/x", json_body={}),
                                           timeouts=TimeoutPolicy(total_timeout_s=5), clock=time.monotonic)
                    outcomes.append(f"ok {raw.status_code}")
                except ConnectFailed as exc:
                    outcomes.append(f"{exc.outcome.value} {'CERTIFICATE_VERIFY_FAILED' in str(exc)}")
        server.close()
        return outcomes

    assert _run(loop, main()) == ["ok 200", "connect_error True", "connect_error True"]
