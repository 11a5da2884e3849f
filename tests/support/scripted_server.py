"""A tiny scripted chat endpoint on a loopback socket, for provider tests.

``scripted_server()`` serves a starlette app with uvicorn in a daemon thread on a free port and
yields a ``ScriptedServer`` (``base_url``, ``received``). Both wire formats are served
(``POST /v1/chat/completions``, ``POST /api/chat``, ``GET /v1/models``, ``GET /api/tags``), and
the behaviour is chosen by the request's model name:

=====================  ===============================================================
model                  behaviour
=====================  ===============================================================
ok                     200, a valid IR as the answer, usage with reasoning tokens
fenced                 200, the IR inside a ```json fence
reasoning              200, answer plus ``reasoning_content`` / ``thinking``
reasoning-alt          200, answer plus ``reasoning`` (OpenAI-compatible only)
think                  200, ``<think>…</think>`` then the IR in the content
empty                  200, empty content, finish ``stop``
length                 200, half an IR, finish/done reason ``length``
length-empty           200, empty content + reasoning, finish/done reason ``length``
rate-limit-seconds     429, ``Retry-After: 7``
rate-limit-date        429, ``Retry-After: Wed, 21 Oct 2026 07:28:00 GMT``
retired                410, the study's retirement message (date + ``ref:`` id)
retired-short          410, ``retired on 2026-08-01 (reference RET-0042)``
retired-bare           410, no date or reference
not-found              404
auth                   401, and the body echoes the Authorization header (a leaky server)
forbidden              403
bad-request            400
server-error           500
unavailable            503, ``Retry-After: 3``
malformed              200, body is not JSON
wrong-shape            200, JSON that is not the wire format
sleep-<s>              sleeps <s> seconds before sending headers, then answers ok
trickle-<s>-<n>        200 headers at once, then <n> body chunks one every <s> seconds
=====================  ===============================================================

``garbage_server()`` answers every connection with bytes that are not HTTP;
``closed_port()`` returns a port nobody listens on; ``full_backlog_server()`` a listening
socket whose accept queue is full, so new connections hang in the handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

IR = {
    "version": 1,
    "uri": "customer_support",
    "meta": {"engine": "llm", "confidence": 0.9},
    "nodes": [
        {"id": "RULE:a", "kind": "Rule", "label": "Do A.", "meta": {"priority": 1, "inferred": False}},
        {"id": "RULE:a", "kind": "Rule", "label": "Do A again.", "meta": {"priority": "2"}},
        {"id": "SECTION:b", "kind": "Section", "label": "B"},
    ],
}
IR_TEXT = json.dumps(IR)
REASONING = "First I list the rules, then the conditions."
RETIRED_MESSAGE = (
    "gemma3:12b was retired at 2026-07-15 00:00:00 -0700 PDT (ref: 9a2ba1b0-727f-4057-9098-1765d64aaf9e)"
)
RETRY_DATE = "Wed, 21 Oct 2026 07:28:00 GMT"

# (status, error message, extra headers) for the error behaviours
_ERRORS: dict[str, tuple[int, str, dict[str, str]]] = {
    "rate-limit-seconds": (429, "slow down", {"Retry-After": "7"}),
    "rate-limit-date": (429, "slow down", {"Retry-After": RETRY_DATE}),
    "retired": (410, RETIRED_MESSAGE, {}),
    "retired-short": (410, "model x retired on 2026-08-01 (reference RET-0042)", {}),
    "retired-bare": (410, "this model is gone", {}),
    "not-found": (404, "model not found", {}),
    "forbidden": (403, "forbidden", {}),
    "bad-request": (400, "invalid parameter 'temperature'", {}),
    "server-error": (500, "internal error", {}),
    "unavailable": (503, "overloaded", {"Retry-After": "3"}),
}


@dataclass
class ScriptedServer:
    base_url: str
    received: list[dict[str, Any]] = field(default_factory=list)  # {path, headers, body}


def _answer(model: str) -> tuple[str, str, str]:
    """(content, reasoning, finish reason) for a 200 behaviour."""
    if model == "fenced":
        return f"```json\n{IR_TEXT}\n```", "", "stop"
    if model in ("reasoning", "reasoning-alt"):
        return IR_TEXT, REASONING, "stop"
    if model == "think":
        return f"<think>{REASONING}</think>\n{IR_TEXT}", "", "stop"
    if model == "empty":
        return "", "", "stop"
    if model == "length":
        return IR_TEXT[: len(IR_TEXT) // 2], REASONING, "length"
    if model == "length-empty":
        return "", REASONING, "length"
    return IR_TEXT, "", "stop"


def _openai_body(model: str, received: dict[str, Any]) -> dict[str, Any]:
    content, reasoning, finish = _answer(model)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning" if model == "reasoning-alt" else "reasoning_content"] = reasoning
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": 11,
            "completion_tokens": 22,
            "completion_tokens_details": {"reasoning_tokens": 5},
        },
        "echo": received,
    }


def _ollama_body(model: str, received: dict[str, Any]) -> dict[str, Any]:
    content, reasoning, finish = _answer(model)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["thinking"] = reasoning
    return {
        "model": model,
        "message": message,
        "done": True,
        "done_reason": finish,
        "prompt_eval_count": 13,
        "eval_count": 31,
        "echo": received,
    }


def _make_app(state: ScriptedServer) -> Starlette:
    async def chat(request: Request) -> Response:
        body = await request.json()
        state.received.append({"path": request.url.path, "headers": dict(request.headers), "body": body})
        model = str(body.get("model", "ok"))
        ollama = request.url.path.startswith("/api/")
        if model in _ERRORS:
            status, message, headers = _ERRORS[model]
            payload: Any = {"error": message} if ollama else {"error": {"message": message, "code": status}}
            return JSONResponse(payload, status_code=status, headers=headers)
        if model == "auth":
            leaked = request.headers.get("authorization", "")
            return JSONResponse({"error": {"message": f"invalid key in header '{leaked}'"}}, status_code=401)
        if model == "malformed":
            return Response(b'{"choices": [ not json', media_type="application/json")
        if model == "wrong-shape":
            return JSONResponse({"result": "hello"})
        if model.startswith("sleep-"):
            await asyncio.sleep(float(model.split("-", 1)[1]))
            model = "ok"
        if model.startswith("trickle-"):
            _, interval, chunks = model.split("-")

            async def trickle() -> Any:
                for _ in range(int(chunks)):
                    yield b" "
                    await asyncio.sleep(float(interval))
                yield json.dumps(_ollama_body("ok", {}) if ollama else _openai_body("ok", {})).encode()

            return StreamingResponse(trickle(), media_type="application/json")
        return JSONResponse(_ollama_body(model, body) if ollama else _openai_body(model, body))

    async def models(request: Request) -> Response:
        names = ["ok", "gemma3:12b"]
        if request.url.path.startswith("/api/"):
            return JSONResponse({"models": [{"name": n, "model": n} for n in names]})
        return JSONResponse({"object": "list", "data": [{"id": n, "object": "model"} for n in names]})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/api/chat", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/api/tags", models, methods=["GET"]),
        ]
    )


def _loopback_socket(backlog: int = 128) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(backlog)
    return sock


@contextlib.contextmanager
def scripted_server(startup_timeout_s: float = 10.0) -> Iterator[ScriptedServer]:
    """Serve the scripted app on a free loopback port until the block exits."""
    sock = _loopback_socket()
    port = sock.getsockname()[1]
    state = ScriptedServer(base_url=f"http://127.0.0.1:{port}")
    config = uvicorn.Config(
        _make_app(state), log_level="warning", lifespan="off", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("scripted server did not start")
        time.sleep(0.01)
    try:
        yield state
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        sock.close()


@contextlib.contextmanager
def garbage_server() -> Iterator[str]:
    """A loopback server answering every connection with non-HTTP bytes; yields its base URL."""
    sock = _loopback_socket()
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                with contextlib.suppress(OSError):
                    conn.recv(65536)
                    conn.sendall(b"THIS IS NOT HTTP\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=2)
        sock.close()


def closed_port() -> int:
    """A loopback port that was just free (connections to it are refused)."""
    sock = _loopback_socket()
    port = sock.getsockname()[1]
    sock.close()
    return port


@contextlib.contextmanager
def full_backlog_server(fillers: int = 8) -> Iterator[str]:
    """A listening socket that never accepts, its queue filled, so a new connect hangs."""
    sock = _loopback_socket(backlog=0)
    port = sock.getsockname()[1]
    clients = []
    try:
        for _ in range(fillers):
            client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            client.setblocking(False)
            with contextlib.suppress(BlockingIOError, OSError):
                client.connect(("127.0.0.1", port))
            clients.append(client)
        time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        for client in clients:
            client.close()
        sock.close()
