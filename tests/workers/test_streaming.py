"""Streaming (``stream = true``) end to end on the simulator: its SSE / NDJSON as the official
clients read them, the providers' reassembly, time to first token, the two kinds of timeout,
the size bound, and what a streamed campaign stores. The provider tests run over each HTTP
client a provider can be given: an ``AsyncClient``, and ``PooledProvider``'s ``AioClient`` and
``DirectClient``."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from orchestrator.campaign.prepared import prepare

from orchestrator.local.campaign import run_campaign_local
from orchestrator.campaign.spec import load_campaign
from simulator.config import SimConfig, SimModel
from simulator.server import start_background
from storage.records import Outcome
from storage.runs import RunStore
from workers import errors
from workers.providers.aio import AioClient
from workers.providers.base import ChatRequest, Reply
from workers.providers.direct import DirectClient
from workers.providers.ollama import OllamaProvider
from workers.providers.openai_compat import OpenAIProvider
from workers.providers.registry import make_http_client, make_tls_context
from workers.runtask import TimeoutPolicy

from tests.simulator.test_simulator import PROMPT, message

pytestmark = pytest.mark.slow

WIRES = ["openai", "ollama"]
CLIENTS = {"httpx": lambda: make_http_client(), "aio": lambda: AioClient(tls=make_tls_context()),
           "direct": lambda: DirectClient(tls=make_tls_context())}
FAST = TimeoutPolicy(connect_timeout_s=2.0, read_timeout_s=5.0, total_timeout_s=20.0)
CONFIG = SimConfig(seed=5, models={
    "steady": SimModel(stream_chunk_chars=8),
    "reasoner": SimModel(reasoning_chars_mean=400, stream_chunk_chars=32),
    "paced": SimModel(stream_chunk_chars=40, stream_chunk_interval_ms=30),
    "slow-start": SimModel(latency_ms_median=1500),
    "staller": SimModel(stall_prob=1.0, stall_s=3.0, stream_chunk_chars=40),
    "trickle": SimModel(stream_chunk_chars=4, stream_chunk_interval_ms=100),
})


@pytest.fixture(scope="module")
def sim():
    with start_background(CONFIG, graceful_shutdown_s=0.5) as running:
        yield running


@pytest.fixture()
def fresh(sim):
    httpx.post(f"{sim.base_url}/_reset").raise_for_status()
    return sim


def call(wire: str, base_url: str, model: str, timeouts: TimeoutPolicy = FAST, *, client: str = "httpx",
         **kw: Any) -> Reply:
    async def go() -> Reply:
        async with CLIENTS[client]() as client_:
            cls = OpenAIProvider if wire == "openai" else OllamaProvider
            return await cls(client_, base_url, None).complete(
                ChatRequest(model=model, user_message=message()[0]["content"], timeouts=timeouts, **kw))

    return asyncio.run(go())


def stats(sim) -> dict:
    return httpx.get(f"{sim.base_url}/_stats").json()["models"]


# ------------------------------------------------------------------ the simulator's wire formats

def test_openai_client_reassembles_the_same_answer_with_usage_in_the_last_chunk(fresh) -> None:
    client = openai.OpenAI(base_url=f"{fresh.base_url}/v1", api_key="unused", max_retries=0)
    whole = client.chat.completions.create(model="reasoner", messages=message())
    httpx.post(f"{fresh.base_url}/_reset").raise_for_status()  # same counter -> same answer
    chunks = list(client.chat.completions.create(model="reasoner", messages=message(), stream=True,
                                                 stream_options={"include_usage": True}))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == whole.choices[0].message.content and len(chunks) > 5
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_ollama_client_reassembles_the_same_answer(fresh) -> None:
    client = ollama.Client(host=fresh.base_url)
    whole = client.chat(model="reasoner", messages=message(), stream=False)
    httpx.post(f"{fresh.base_url}/_reset").raise_for_status()
    parts = list(client.chat(model="reasoner", messages=message(), stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert "".join(p.message.thinking or "" for p in parts) == whole.message.thinking
    assert parts[-1].done and parts[-1].eval_count == whole.eval_count and not any(p.done for p in parts[:-1])


# ------------------------------------------------------------------ the providers

@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("wire", WIRES)
def test_streamed_reply_equals_the_whole_one_and_has_its_timings(fresh, wire: str, client: str) -> None:
    whole = call(wire, fresh.base_url, "paced", max_tokens=4000, client=client)
    httpx.post(f"{fresh.base_url}/_reset").raise_for_status()
    streamed = call(wire, fresh.base_url, "paced", max_tokens=4000, stream=True, client=client)
    assert streamed.outcome is Outcome.OK and streamed.answer_text == whole.answer_text
    assert (streamed.prompt_tokens, streamed.completion_tokens) == (whole.prompt_tokens, whole.completion_tokens)
    assert streamed.completion_tokens and streamed.completion_tokens > 0  # usage from the final chunk
    assert whole.first_token_ms is None and whole.stream_duration_ms is None
    # 40-char chunks 30 ms apart: the stream lasts at least (chunks - 1) * 30 ms after the first
    chunks = -(-len(whole.answer_text) // 40)
    assert streamed.first_token_ms is not None and 0 < streamed.first_token_ms < streamed.latency_ms
    assert streamed.stream_duration_ms >= (chunks - 2) * 30 * 0.9
    assert streamed.first_token_ms + streamed.stream_duration_ms == pytest.approx(streamed.latency_ms)


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("wire", WIRES)
def test_streamed_truncation_and_reasoning(fresh, wire: str, client: str) -> None:
    reply = call(wire, fresh.base_url, "reasoner", max_tokens=150, stream=True, client=client)
    assert reply.outcome is Outcome.TRUNCATED and reply.finish_reason == "length"
    assert len(reply.reasoning_text) > 100 and reply.completion_tokens == 150
    body = OpenAIProvider(make_http_client(), "http://x", None).build_body(
        ChatRequest(model="m", user_message="u", timeouts=FAST, stream=True))
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("wire", WIRES)
def test_no_first_token_is_told_from_a_stalled_stream(fresh, wire: str, client: str) -> None:
    tight = TimeoutPolicy(connect_timeout_s=2.0, read_timeout_s=0.5, total_timeout_s=20.0)
    with pytest.raises(errors.ReadTimeout) as never:
        call(wire, fresh.base_url, "slow-start", tight, stream=True, client=client)
    assert "no first token within read_timeout_s=0.5" in str(never.value)
    assert never.value.first_token_ms is None
    with pytest.raises(errors.ReadTimeout) as stalled:
        call(wire, fresh.base_url, "staller", tight, stream=True, client=client)
    assert "stream stalled" in str(stalled.value) and "no first token" not in str(stalled.value)
    assert stalled.value.first_token_ms is not None and stalled.value.first_token_ms < 500
    assert 500 <= stalled.value.latency_ms < 3000
    # each request reached the simulator once: the failures are the client's deadlines
    seen = stats(fresh)
    assert seen["slow-start"]["requests"] == 1 and seen["staller"]["requests"] == 1


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("wire", WIRES)
def test_total_deadline_on_a_running_stream(fresh, wire: str, client: str) -> None:
    capped = TimeoutPolicy(connect_timeout_s=2.0, read_timeout_s=5.0, total_timeout_s=1.0)
    with pytest.raises(errors.TotalTimeout) as info:
        call(wire, fresh.base_url, "trickle", capped, stream=True, client=client)
    assert "stream still running at total_timeout_s=1.0" in str(info.value)
    assert info.value.first_token_ms is not None and 1000 <= info.value.latency_ms < 3000


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("wire", WIRES)
def test_streamed_body_is_bounded(fresh, wire: str, client: str) -> None:
    with pytest.raises(errors.ProtocolFailed, match="exceeds max_response_bytes=300"):
        call(wire, fresh.base_url, "steady", stream=True, max_response_bytes=300, client=client)


def _read_request(conn: socket.socket) -> None:
    """Read one HTTP request (headers, then Content-Length bytes of body) from ``conn``."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += conn.recv(65536)


@contextlib.contextmanager
def cut_stream_server() -> Iterator[str]:
    """A loopback server that answers 200 with one SSE chunk and closes: a cut stream."""
    sock = socket.create_server(("127.0.0.1", 0))
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"{\\"ver"},"finish_reason":null}]}\n\n'

    def serve() -> None:
        conn, _ = sock.accept()
        with conn:
            _read_request(conn)  # all of it: closing with unread bytes would send a RST instead
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + chunk)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        thread.join(5)
        sock.close()


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_cut_stream_is_a_protocol_error(client: str) -> None:
    with cut_stream_server() as base_url:
        with pytest.raises(errors.ProtocolFailed, match="stream ended before its end marker") as info:
            call("openai", base_url, "m", stream=True, client=client)
    assert info.value.first_token_ms is not None and info.value.status_code == 200


# ------------------------------------------------------------------ a streamed campaign, stored

def test_streamed_campaign_stores_first_token_and_duration(tmp_path: Path, fresh) -> None:
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "ticket.prompt.rtpl").write_text(PROMPT, encoding="utf-8")
    (tmp_path / "c.toml").write_text(f"""
name = "streamed"
runs = 2
[corpus]
paths = ["prompts"]
[endpoints.sim]
base_url = "{fresh.base_url}"
[endpoints.simo]
base_url = "{fresh.base_url}"
wire_format = "ollama"
[models.paced]
endpoint = "sim"
stream = true
[models.steady]
endpoint = "simo"
stream = true
[models.reasoner]
endpoint = "sim"
""", encoding="utf-8")
    spec = load_campaign(tmp_path / "c.toml")
    store = RunStore(tmp_path / "data")
    run_campaign_local(prepare(spec), store, {})
    rows = store.read_table().to_pylist()
    assert len(rows) == 6 and {r["outcome"] for r in rows} == {"ok"}
    for r in rows:
        streamed = r["model"] != "reasoner"
        assert r["stream"] is streamed
        assert (r["first_token_ms"] is not None) is streamed and (r["stream_duration_ms"] is not None) is streamed
        assert r["completion_tokens"] > 0 and r["parse_outcome"] in ("ok", "repaired")
        if streamed:
            assert 0 < r["first_token_ms"] <= r["latency_ms"]
