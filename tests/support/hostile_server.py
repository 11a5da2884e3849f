"""A deliberately broken chat endpoint on a loopback socket, written at the byte level.

Unlike ``scripted_server`` (a well-behaved ASGI app), this server writes raw HTTP/1.1 so it can
lie: wrong ``Content-Length``, a chunked body that never ends, NUL bytes, a 200 that is HTML, a
body of 10 MB, JSON nested 200k deep, an answer echoing the API key. Both wire formats are
served (``POST /v1/chat/completions`` and ``POST /api/chat``); the behaviour is picked by the
request's ``model`` (anything after ``--`` is ignored, so one campaign can hold the same
behaviour under several model names, e.g. ``echo-key--ollama``):

=======================  ==========================================================
model                    behaviour
=======================  ==========================================================
ok                       200, a valid IR (the well-behaved control)
deep-body                200, ``{"choices": `` then 200k ``[`` (never closed)
deep-answer              200, valid wire JSON; the answer is 100k ``[`` + 100k ``]``
big-body-<n>             200, a valid answer padded to n bytes (Content-Length set)
big-answer-<n>           200, a valid wire body whose answer is n characters of IR-ish text
retry-after-<v>          429 with ``Retry-After: <v>``
echo-key                 200, the Authorization key inside content, reasoning and finish_reason, and
                         as the answer's ``model`` with zero-width spaces between its characters
echo-key-error           500 whose body echoes the key
invalid-json             200, ``application/json`` that is not JSON
html                     200, an HTML page
nul                      200, NUL bytes and invalid UTF-8
empty-choices            200, ``choices: []``
choices-not-list         200, ``choices: "nope"``
content-null             200, ``message.content: null``
lone-surrogate           200, content, reasoning and an error-free IR whose id hold unpaired
                         ``\ud800`` escapes (valid JSON, not valid Unicode once decoded)
wrong-length             200, ``Content-Length: 5000`` then 40 bytes and a close
hostile-identity         200, a valid IR whose ``model`` is 100k characters, ``system_fingerprint``
                         echoes the key between control characters and again hidden, ``digest``
                         is a number
endless-chunked          200, chunked, 64 KiB chunks forever (until the client hangs up)
=======================  ==========================================================

``GET /api/tags`` lists ``echo-key`` and ``echo-key--ollama`` with that hidden key as their digest.

``received`` lists every request (path, lower-cased headers, decoded JSON body), so a test can
count what the endpoint saw as well as what the store holds. ``bytes_sent`` counts body bytes
written per model (how much of an endless body the client accepted before hanging up).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.support.scripted_server import IR_TEXT

CHUNK = b"x" * 65536


@dataclass
class HostileServer:
    base_url: str
    received: list[dict[str, Any]] = field(default_factory=list)
    bytes_sent: Counter[str] = field(default_factory=Counter)

    def requests_for(self, model: str) -> int:
        """Requests whose model was exactly ``model``."""
        return sum(1 for r in self.received if r["body"].get("model") == model)


def _wire(model: str, content: Any, *, ollama: bool, reasoning: str = "", finish: str = "stop",
          served: str | None = None) -> bytes:
    if ollama:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["thinking"] = reasoning
        body: dict[str, Any] = {"model": served or model, "message": message, "done": True, "done_reason": finish}
    else:
        message = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = reasoning
        body = {"model": served or model, "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    return json.dumps(body).encode()


def _head(status: int, headers: dict[str, str]) -> bytes:
    reason = {200: "OK", 429: "Too Many Requests", 500: "Internal Server Error"}.get(status, "X")
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _simple(status: int, body: bytes, content_type: str = "application/json", **extra: str) -> bytes:
    headers = {"Content-Type": content_type, "Content-Length": str(len(body)), "Connection": "close", **extra}
    return _head(status, headers) + body


def _hidden(key: str) -> str:
    """``key`` with a zero-width space between its characters: whole again once they are dropped."""
    return "\u200b".join(key)


def _tags(key: str) -> bytes:
    """``GET /api/tags``: the echo-key models listed with the key (hidden) as their digest."""
    entries = [{"name": n, "model": n, "digest": _hidden(key)} for n in ("echo-key", "echo-key--ollama")]
    return _simple(200, json.dumps({"models": entries}).encode())


def _response(model: str, key: str, ollama: bool) -> bytes | None:  # noqa: C901  (one branch per hostile behaviour)
    """The whole response for a fixed behaviour; ``None`` for the streaming ones."""
    if model == "ok":
        return _simple(200, _wire(model, IR_TEXT, ollama=ollama))
    if model == "deep-body":
        return _simple(200, b'{"choices": ' + b"[" * 200_000)
    if model == "deep-answer":
        return _simple(200, _wire(model, "[" * 100_000 + "]" * 100_000, ollama=ollama))
    if model.startswith("big-body-"):
        n = int(model.rsplit("-", 1)[1])
        body = _wire(model, IR_TEXT, ollama=ollama)
        return _simple(200, body[:-1] + b', "pad": "' + b"x" * max(0, n - len(body) - 11) + b'"}')
    if model.startswith("big-answer-"):
        n = int(model.rsplit("-", 1)[1])
        answer = '{"nodes": [' + ('{"id": "RULE:a", "kind": "Rule"}, ' * (n // 34 + 1))[: max(0, n - 13)]
        return _simple(200, _wire(model, answer, ollama=ollama))
    if model.startswith("retry-after-"):
        return _simple(429, b'{"error": "slow down"}', **{"Retry-After": model.split("-", 2)[2]})
    if model == "echo-key":
        return _simple(
            200, _wire(model, f"{IR_TEXT}\nyour key is {key}", ollama=ollama, reasoning=f"I saw {key}", finish=key,
                       served=_hidden(key))
        )
    if model == "echo-key-error":
        return _simple(500, json.dumps({"error": f"bad key {key}"}).encode())
    if model == "invalid-json":
        return _simple(200, b'{"choices": [ not json')
    if model == "html":
        return _simple(200, b"<html><body><h1>Welcome to nginx!</h1></body></html>", "text/html")
    if model == "nul":
        return _simple(200, b'{"choices": \x00\x00\xff\xfe [')
    if model == "empty-choices":
        return _simple(200, b'{"choices": [], "message": "x"}' if not ollama else b'{"message": []}')
    if model == "choices-not-list":
        return _simple(200, b'{"choices": "nope"}' if not ollama else b'{"message": "nope"}')
    if model == "content-null":
        return _simple(200, _wire(model, None, ollama=ollama))
    if model == "lone-surrogate":
        # json.dumps writes the escapes as they are: ASCII bytes a strict decoder turns into \ud800
        text = 'x\ud800 {"nodes": [{"id": "RULE:\\ud800", "kind": "Rule"}]}'
        return _simple(200, _wire(model, text, ollama=ollama, reasoning="think \udfff"))
    if model == "hostile-identity":
        body = json.loads(_wire(model, IR_TEXT, ollama=ollama))
        body.update(model="m" * 100_000, system_fingerprint=f"fp\x00\x1b[31m{key}\u2028end-{_hidden(key)}",
                    digest=12345)
        return _simple(200, json.dumps(body).encode())
    if model == "wrong-length":
        return _head(200, {"Content-Type": "application/json", "Content-Length": "5000", "Connection": "close"}) + (
            b'{"choices": [{"message": {"content": "abc'
        )
    return None


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], dict[str, Any]] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    path = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else "/"
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    raw = await reader.readexactly(int(headers.get("content-length", "0") or 0))
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {}
    return path, headers, body if isinstance(body, dict) else {}


def _make_handler(state: HostileServer):  # type: ignore[no-untyped-def]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await _read_request(reader)
            if request is None:
                return
            path, headers, body = request
            state.received.append({"path": path, "headers": headers, "body": body})
            model = str(body.get("model", "ok")).split("--")[0]
            key = headers.get("authorization", "").removeprefix("Bearer ")
            fixed = _tags(key) if path.startswith("/api/tags") else _response(model, key, path.startswith("/api/"))
            if fixed is not None:
                writer.write(fixed)
                state.bytes_sent[model] += len(fixed)
                await writer.drain()
                return
            if model == "endless-chunked":
                writer.write(_head(200, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}))
                writer.write(b'10\r\n{"choices": ["xx\r\n')
                while True:  # until the client hangs up (drain raises)
                    writer.write(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
                    state.bytes_sent[model] += len(CHUNK)
                    await writer.drain()
            writer.write(_simple(404, b'{"error": "unknown behaviour"}'))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    return handle


@contextlib.contextmanager
def hostile_server() -> Iterator[HostileServer]:
    """Serve the hostile endpoint on a free loopback port (own event loop, daemon thread)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def start() -> None:
        state = HostileServer(base_url="")
        server = await asyncio.start_server(_make_handler(state), "127.0.0.1", 0)
        state.base_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        holder.update(state=state, server=server)
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop)
    if not ready.wait(10):
        raise RuntimeError("hostile server did not start")
    try:
        yield holder["state"]
    finally:
        async def stop() -> None:
            holder["server"].close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
