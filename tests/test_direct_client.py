"""``DirectClient`` (httpx's transport without ``AsyncClient``'s layers) over real loopback HTTP.

A keep-alive server records each request head and answers with a gzip-encoded completion that
also sets a cookie, so the tests see what goes on the wire (default headers, no cookie sent
back), that bodies are decoded, and that deadlines and refused connections are classified as
through an ``AsyncClient``.
"""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest

from storage.records import Outcome
from workers.errors import ConnectFailed, TotalTimeout
from workers.providers.base import ChatRequest
from workers.providers.direct import DirectClient
from workers.providers.openai_compat import OpenAIProvider
from workers.providers.registry import make_tls_context
from tests.support.raw_http import serve_fixed
from workers.runtask import TimeoutPolicy

_ANSWER = {"choices": [{"message": {"content": "héllo"}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
_BODY = gzip.compress(json.dumps(_ANSWER).encode())


async def _serve(heads: list[bytes], delay_s: float = 0.0) -> asyncio.Server:
    return await serve_fixed(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
                             b"set-cookie: session=abc\r\ncontent-length: %d\r\n\r\n%s" % (len(_BODY), _BODY),
                             delay_s=delay_s, on_request=heads.append)


def _request(total_s: float = 10.0) -> ChatRequest:
    return ChatRequest(model="m", user_message="hi", timeouts=TimeoutPolicy(total_timeout_s=total_s))


def test_default_headers_decoded_body_and_no_cookie_jar() -> None:
    heads: list[bytes] = []

    async def main() -> list[str]:
        server = await _serve(heads)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            async with DirectClient(tls=make_tls_context()) as client:
                provider = OpenAIProvider(client, url, "sk-secret")
                return [(await provider.complete(_request())).answer_text for _ in range(2)]
        finally:
            server.close()
            await server.wait_closed()

    answers = asyncio.run(main())
    assert answers == ["héllo", "héllo"]  # gzip body decoded, UTF-8 kept
    assert len(heads) == 2
    for head in heads:
        text = head.decode().lower()
        assert "user-agent: python-httpx/" in text and "accept-encoding: gzip, deflate" in text
        assert "authorization: bearer sk-secret" in text and "cache-control: no-store" in text
        assert "cookie:" not in text  # the first answer's cookie is not sent with the next call


def test_total_deadline_and_refused_connection_are_classified() -> None:
    async def main() -> tuple[Exception, Exception]:
        server = await _serve([], delay_s=2.0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            async with DirectClient(tls=make_tls_context()) as client:
                with pytest.raises(TotalTimeout) as slow:
                    await OpenAIProvider(client, url, None).complete(_request(total_s=0.3))
        finally:
            server.close()
            await server.wait_closed()
        async with DirectClient(tls=make_tls_context()) as client:  # nothing listens there now
            with pytest.raises(ConnectFailed) as refused:
                await OpenAIProvider(client, url, None).complete(_request())
        return slow.value, refused.value

    slow, refused = asyncio.run(main())
    assert slow.outcome is Outcome.TIMEOUT_TOTAL and slow.latency_ms >= 250
    assert refused.outcome is Outcome.CONNECT_ERROR
