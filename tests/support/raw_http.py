"""A keep-alive HTTP/1.1 server on loopback that answers every request with the same bytes: the
smallest real socket peer for client-side tests (headers on the wire, pooling, deadlines)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

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
