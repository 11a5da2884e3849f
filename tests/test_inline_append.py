"""Where a worker appends finished runs' records to its spool: on its event loop while the
spool's fsyncs are fast (``inline_append_max_ms``), else in a thread; a spool not yet fsynced
goes to a thread. Real ``WorkerRuntime`` and redis-server, a real endpoint on loopback; every
call the endpoint received is a record in the store, whichever thread wrote it."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.redis_server import RedisServer
from storage.runs import RunStore
from tests.support.raw_http import serve_fixed
from workers.celery.campaign_state import CampaignState
from workers.celery.runtime import RuntimeHolder, WorkerSettings
from workers.celery.tasks import run_message
from workers.errors import ConfigError
from workers.runtask import EndpointRef, ModelLimits, RunTask

_BODY = json.dumps({"choices": [{"message": {"content": '{"nodes": []}'}, "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 3, "completion_tokens": 4}}).encode()
_RESPONSE = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
             + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY)


def _task(i: int, base_url: str) -> RunTask:
    return RunTask(run_id=f"r{i}", campaign="ia", panel="ia", model="m", run_index=i,
                   endpoint=EndpointRef(name="ep", base_url=base_url), prompt_sha256="a" * 64,
                   prompt_name="p", user_message="hello", instruction_version="v", instruction_sha256="b" * 64,
                   limits=ModelLimits(max_concurrency=8))


@pytest.fixture()
def endpoint() -> Iterator[tuple[str, list[bytes]]]:
    """A chat endpoint on loopback answering every call at once; yields (base URL, requests)."""
    requests: list[bytes] = []
    ready, stop = threading.Event(), threading.Event()
    port: list[int] = []

    def serve() -> None:
        async def main() -> None:
            server = await serve_fixed(_RESPONSE, on_request=requests.append)
            port.append(server.sockets[0].getsockname()[1])
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.02)
            server.close()

        asyncio.run(main())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert ready.wait(5)
    yield f"http://127.0.0.1:{port[0]}", requests
    stop.set()
    t.join(5)


def _appends(limit_ms: float, base_url: str, data: Path, messages: int) -> tuple[list[str], float]:
    """Run ``messages`` messages of 4 runs on a fresh runtime; return the name of the thread each
    spool append ran on, and the spool's ``sync_s`` at the end."""
    threads: list[str] = []
    with RedisServer() as srv:
        holder = RuntimeHolder(srv.url, WorkerSettings(redis_url=srv.url, inline_append_max_ms=limit_ms))
        try:
            rt = holder.get()
            spool = rt.spool(str(data))
            append = spool.append

            def recording(records):  # noqa: ANN001, ANN202 - the spool's own signature
                threads.append(threading.current_thread().name)
                return append(records)

            spool.append = recording  # type: ignore[method-assign]  # this instance only
            tasks = [_task(i, base_url) for i in range(4 * messages)]
            CampaignState(rt.redis, "ia", prefix="irbench:camp").record_dispatch(t.run_id for t in tasks)
            for m in range(messages):
                assert run_message(holder, "w", tasks[4 * m: 4 * m + 4], str(data)) == ["ok"] * 4
            sync_s = spool.sync_s
        finally:
            holder.close()
    return threads, sync_s


def test_fast_fsyncs_append_on_the_loop_after_the_first_in_a_thread(tmp_path: Path, endpoint) -> None:  # noqa: ANN001
    base_url, requests = endpoint
    threads, sync_s = _appends(10_000.0, base_url, tmp_path / "data", messages=6)
    assert 0 < sync_s < 10.0  # measured: finite once an fsync happened
    assert threads[0] != "irbench-loop"  # nothing known of the storage yet: a thread
    assert "irbench-loop" in threads[1:]  # then the loop itself
    stored = RunStore(tmp_path / "data").read_executions(columns=["run_id"])
    assert len(requests) == 24 and stored.num_rows == 24  # every call received is a stored record
    assert set(stored.column("run_id").to_pylist()) == {f"r{i}" for i in range(24)}


def test_slow_fsyncs_and_zero_keep_the_thread(tmp_path: Path, endpoint) -> None:  # noqa: ANN001
    base_url, requests = endpoint
    for limit_ms, data in ((0.0, tmp_path / "zero"), (1e-9, tmp_path / "slow")):
        threads, sync_s = _appends(limit_ms, base_url, data, messages=3)
        assert threads and "irbench-loop" not in threads, (limit_ms, threads)
        assert math.isfinite(sync_s)
        assert RunStore(data).read_executions(columns=["run_id"]).num_rows == 12
    assert len(requests) == 24


def test_a_negative_limit_is_refused_with_its_variable() -> None:
    with pytest.raises(ConfigError, match="IRBENCH_INLINE_APPEND_MAX_MS"):
        WorkerSettings(redis_url="redis://x", inline_append_max_ms=-1)
    env = {"IRBENCH_INLINE_APPEND_MAX_MS": "2.5"}
    assert WorkerSettings.from_env("redis://x", env).inline_append_max_ms == 2.5
