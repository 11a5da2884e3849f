"""The HTTP call alone, per client: runs/s and CPU ms per call, side by side in one run.

Against the simulator in its own process (zero latency, no limits; as ``local_throughput.py``),
``concurrency`` coroutines pull the same request bodies from one iterator; each coroutine owns
one client with one keep-alive connection (as ``PooledProvider``'s calls do) and, per call,
POSTs the JSON body irbench sends (``OpenAIProvider.build_body``, same headers) to
``/v1/chat/completions``, reads the whole body, ``json.loads`` it and takes
``choices[0].message.content``. Clients:

* ``httpx``: ``httpx.AsyncClient.post`` (the bare loop of ``local_throughput.py``);
* ``direct``: ``DirectClient`` (``build_request``, ``send``, ``aiter_bytes``: what ``_http.send``
  does with it);
* ``aio``: ``AioClient``, the same calls;
* ``aiohttp``: a bare ``aiohttp.ClientSession.post`` and ``read()``, the floor ``aio`` builds on.

Each repeat alternates the order of the clients; the figure is the median over repeats. CPU is
this process's ``process_time`` per call (the client side only; less noisy than wall time on a
shared machine); ``sim_ms`` is the simulator process's CPU per call (when it is at or above the
client's, the simulator caps runs/s). The load average is printed before and after.

    python bench/http_clients.py [--calls 2000] [--levels 1,4,16,64] [--repeats 3] [--loop uvloop|asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from local_throughput import HEADERS, SIM_TOML, cpu_s, make_tasks, request_bodies

from simulator.server import start_subprocess
from workers.providers.aio import AioClient
from workers.providers.direct import DirectClient

KINDS = ("httpx", "direct", "aio", "aiohttp")
TIMEOUT = httpx.Timeout(30.0)
Call = Callable[[dict[str, Any]], Awaitable[Any]]


def _answer(body: bytes) -> Any:
    return json.loads(body)["choices"][0]["message"]["content"]


async def _lane(kind: str, url: str, source: Iterator[dict[str, Any]], tls: ssl.SSLContext) -> int:
    """One coroutine with its own one-connection client, until ``source`` is empty."""
    done = 0
    if kind == "httpx":
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(limits=limits, trust_env=False, timeout=30.0, verify=tls) as client:
            for body in source:
                response = await client.post(url, json=body, headers=HEADERS)
                done += isinstance(_answer(response.content), str)
    elif kind == "aiohttp":
        connector = aiohttp.TCPConnector(limit=1, ssl=tls)
        async with aiohttp.ClientSession(connector=connector) as session:
            for body in source:
                async with session.post(url, json=body, headers=HEADERS) as response:
                    done += isinstance(_answer(await response.read()), str)
    else:
        async with (DirectClient if kind == "direct" else AioClient)(1, tls=tls) as client:
            for body in source:
                request = client.build_request("POST", url, json=body, headers=HEADERS, timeout=TIMEOUT)
                response = await client.send(request, stream=True)
                try:
                    data = b"".join([chunk async for chunk in response.aiter_bytes()])
                finally:
                    await response.aclose()
                done += isinstance(_answer(data), str)
    return done


async def _run(kind: str, url: str, bodies: list[dict[str, Any]], concurrency: int, tls: ssl.SSLContext) -> int:
    source = iter(bodies)
    return sum(await asyncio.gather(*[_lane(kind, url, source, tls) for _ in range(concurrency)]))


def _loop_runner(name: str) -> Callable[[Any], int]:
    if name == "asyncio":
        return asyncio.run
    import uvloop

    return uvloop.run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="calls per measurement")
    parser.add_argument("--levels", default="1,4,16,64", help="concurrency levels")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per client and level (median reported)")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                        help="uvloop: the local executor's loop; asyncio: the Celery worker's")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    run = _loop_runner(args.loop)
    tls = ssl.create_default_context()  # built once, outside the timing
    results: dict[tuple[str, int], list[tuple[float, float, float]]] = {(k, lv): [] for k in KINDS for lv in levels}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="irbench-bench-") as tmp:
        cfg = Path(tmp) / "sim.toml"
        cfg.write_text(SIM_TOML)
        with start_subprocess(cfg) as sim:
            url = f"{sim.base_url}/v1/chat/completions"
            bodies = request_bodies(make_tasks(sim.base_url, args.calls, 1, "http"))
            for kind in KINDS:  # warm-up (imports, simulator caches), not timed
                run(_run(kind, url, bodies[:50], 4, tls))
            for rep in range(args.repeats):
                for level in levels:
                    for kind in KINDS if rep % 2 == 0 else tuple(reversed(KINDS)):
                        t0, c0, s0 = time.perf_counter(), time.process_time(), cpu_s(sim.process.pid)
                        done = run(_run(kind, url, bodies, level, tls))
                        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                        sim_cpu = cpu_s(sim.process.pid) - s0
                        if done != args.calls:
                            raise SystemExit(f"{kind}: only {done} of {args.calls} calls answered")
                        results[(kind, level)].append(
                            (args.calls / wall, 1000 * cpu / args.calls, 1000 * sim_cpu / args.calls)
                        )
    load_after = os.getloadavg()

    def med(kind: str, level: int, i: int) -> float:
        return statistics.median(r[i] for r in results[(kind, level)])

    print(f"{args.calls} calls per measurement, {args.loop}, median of {args.repeats} repeats; load average "
          f"before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    print(f"{'concurrency':>11} " + " ".join(f"{k + '/s':>9}" for k in KINDS) + "   cpu_ms "
          + " ".join(f"{k:>7}" for k in KINDS) + "   sim_ms " + " ".join(f"{k:>7}" for k in KINDS))
    for level in levels:
        print(f"{level:>11} " + " ".join(f"{med(k, level, 0):>9.1f}" for k in KINDS) + "          "
              + " ".join(f"{med(k, level, 1):>7.3f}" for k in KINDS) + "          "
              + " ".join(f"{med(k, level, 2):>7.3f}" for k in KINDS))


if __name__ == "__main__":
    main()
