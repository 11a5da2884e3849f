"""Raw HTTP/1.1 servers on loopback, the smallest real socket peers for client-side tests:
``serve_fixed`` answers every request with the same bytes (headers on the wire, pooling,
deadlines); ``serve_scripts`` plays back a script of bytes, pauses, resets and closes chosen by
the request's path (hostile endpoints, byte by byte); ``serve_in_thread`` runs either (or any
``asyncio`` server) on a loop of its own, for code under test that blocks its thread."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import struct
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence

_LENGTH = re.compile(rb"^content-length:\s*(\d+)", re.I | re.M)


async def serve_fixed(response: bytes, *, delay_s: float = 0.0,
                      on_connect: Callable[[], None] | None = None,
                      on_request: Callable[[bytes], None] | None = None) -> asyncio.Server:
    """Start the server on 127.0.0.1 (a free port). Each request's body is read (by its
    content-length), ``on_request`` gets its head, and after ``delay_s`` seconds ``response``
    (a whole HTTP response, status line included) is written back on the same connection."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if on_connect is not None:
            on_connect()
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                match = _LENGTH.search(head)
                await reader.readexactly(int(match.group(1)) if match else 0)
                if on_request is not None:
                    on_request(head)
                if delay_s:
                    await asyncio.sleep(delay_s)
                writer.write(response)
                await writer.drain()
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


RESET = "reset"  # a script step: abort the connection with a TCP RST (SO_LINGER 0)
CLOSE = "close"  # a script step: flush, then close cleanly (FIN)
HANG = "hang"  # a script step: say nothing more, keep the connection open
Step = bytes | float | str  # bytes: written as they are; float: a pause in seconds; or the above


@contextlib.asynccontextmanager
async def serve_scripts(scripts: Mapping[str, Sequence[Step]]) -> AsyncIterator[str]:
    """A lying HTTP/1.1 server on 127.0.0.1 (a free port), for client-side classification tests:
    each request's path (``/name``) picks the script played back on its connection, step by
    step; after the last step the connection waits for the next request (keep-alive). Yields
    the base URL; on exit every connection is dropped."""
    tasks: set[asyncio.Task[None]] = set()

    async def play(writer: asyncio.StreamWriter, steps: Sequence[Step]) -> bool:
        """Play one script; False once the connection is gone."""
        for step in steps:
            if step == RESET:
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return False
            if step == CLOSE:
                await writer.drain()
                writer.close()
                return False
            if step == HANG:
                await asyncio.Event().wait()
            if isinstance(step, float):
                await writer.drain()
                await asyncio.sleep(step)
            elif isinstance(step, bytes):
                writer.write(step)
        await writer.drain()
        return True

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                match = _LENGTH.search(head)
                await reader.readexactly(int(match.group(1)) if match else 0)
                name = head.split(b" ", 2)[1].decode("latin-1").strip("/")
                if not await play(writer, scripts[name]):
                    return
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        except asyncio.CancelledError:  # the server is stopping: end quietly (asyncio logs a
            pass  # cancelled connection handler as an error)
        finally:
            writer.transport.abort()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.contextmanager
def serve_in_thread(start: Callable[[], Awaitable[asyncio.Server]]) -> Iterator[str]:
    """Run ``start()``'s server on its own event loop in a daemon thread, for tests whose code
    under test blocks the calling thread (a worker's ``run_message``); yields its base URL
    (``http://127.0.0.1:<port>``) and stops the server on exit."""
    ready, stop = threading.Event(), threading.Event()
    port: list[int] = []

    def serve() -> None:
        async def main() -> None:
            server = await start()
            port.append(server.sockets[0].getsockname()[1])
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.01)
            server.close()

        asyncio.run(main())

    t = threading.Thread(target=serve, name="test-endpoint", daemon=True)
    t.start()
    if not ready.wait(5):
        raise RuntimeError("the test endpoint did not start within 5 s")
    try:
        yield f"http://127.0.0.1:{port[0]}"
    finally:
        stop.set()
        t.join(5)
