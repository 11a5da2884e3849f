"""Worst cases of one hostile answer: body decode and IR extraction, with their bounds.

Prints, per adversarial input, its size, the seconds ``extract_ir`` (or the HTTP JSON decode)
took and the class it ended in. The bounds under test are the defaults of
``workers.runtask.ResponseLimits``: 8 MiB body, 1 MiB answer for extraction, depth 64, 2000
nodes. Seconds are the median of ``--repeat`` runs; the load average is printed alongside.

    python bench/hostile_extract.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import httpx

from workers.errors import ProviderError
from workers.ir_extract import extract_ir
from workers.providers.base import ChatRequest
from workers.providers.openai_compat import OpenAIProvider
from workers.runtask import TimeoutPolicy

MIB = 1024 * 1024
NODE = '{"id": "RULE:a", "kind": "Rule", "label": "Do A.", "meta": {"priority": 1}}'


def answers() -> dict[str, str]:
    """Answers just under the 1 MiB extraction bound, shaped to make each step work hardest."""
    n = (MIB - 64) // (len(NODE) + 2)
    many = "[" + ", ".join([NODE] * n) + "]"
    return {
        "10 MB answer (refused)": '{"nodes": [' + "x" * 10_000_000,
        "100k [ + 100k ]": "[" * 100_000 + "]" * 100_000,
        "1 MiB bare node list": many,
        "1 MiB nodes, trailing commas": '{"nodes": ' + many[:-1] + ",]}",
        "1 MiB nodes, cut mid-value": '{"nodes": ' + many[: len(many) // 2],
        "1 MiB unterminated string": '{"nodes": "' + "x" * (MIB - 16),
        "1 MiB prose with 64 braces": ("word { " * (MIB // 7)),
        "1 MiB of 2000 nodes (valid)": '{"nodes": [' + ", ".join([NODE.replace("RULE:a", f"R{i}") for i in range(2000)]) + "]}",
    }


def bodies() -> dict[str, bytes]:
    return {
        "8 MiB valid JSON body": json.dumps({"choices": [{"message": {"content": "x" * (8 * MIB - 64)}}]}).encode(),
        "10 MB body (over 9 MiB bound)": b'{"choices": [' + b" " * 10_000_000,
        '{"choices": + 200k [': b'{"choices": ' + b"[" * 200_000,
    }


def timed(fn, repeat: int) -> tuple[float, str]:  # type: ignore[no-untyped-def]
    out, times = "", []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'input':40s} {'chars':>10s} {'seconds':>8s}  class")
    for name, text in answers().items():
        s, cls = timed(lambda: extract_ir(text).parse_outcome.value, args.repeat)  # noqa: B023
        print(f"{'extract: ' + name:40s} {len(text):10d} {s:8.3f}  {cls}")

    def decode(body: bytes) -> str:
        """The provider's whole 2xx path (bounded read, JSON decode, wire checks) over an
        in-memory transport, so only our code is timed."""

        async def call() -> str:
            transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
            async with httpx.AsyncClient(transport=transport) as client:
                provider = OpenAIProvider(client, "http://bench.invalid", None)
                request = ChatRequest(model="m", user_message="x", timeouts=TimeoutPolicy(),
                                      max_response_bytes=9 * MIB)
                try:
                    await provider.complete(request)
                except ProviderError as exc:
                    return exc.outcome.value
                return "decoded"

        return asyncio.run(call())

    for name, body in bodies().items():
        s, cls = timed(lambda: decode(body), args.repeat)  # noqa: B023
        print(f"{'decode: ' + name:40s} {len(body):10d} {s:8.3f}  {cls}")


if __name__ == "__main__":
    main()
