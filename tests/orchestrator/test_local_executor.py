"""The local executor's connection use (``PooledProvider``) and batch writer, over real loopback HTTP.

A minimal HTTP/1.1 keep-alive server (asyncio streams, same event loop) answers every chat
request with one fixed OpenAI-format completion and counts the TCP connections it accepted and
the requests it served, so each test can check both sides: what the endpoint saw and what the
store holds.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.local.executor import ExecutionSummary, LocalOptions, run_local
from storage.records import RunRecord
from storage.runs import RunStore
from workers.providers.base import ChatRequest
from workers.providers.openai_compat import OpenAIProvider
from workers.providers.pooled import PooledProvider
from workers.providers.registry import make_tls_context
from tests.support.raw_http import serve_fixed
from workers.runtask import EndpointRef, ModelLimits, RetryPolicy, RunTask, TimeoutPolicy

_IR = {"version": 1, "nodes": [{"id": "RULE:A", "kind": "rule", "label": "a", "meta": {"priority": 1}}]}
_BODY = json.dumps({
    "id": "x", "object": "chat.completion", "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": json.dumps(_IR)}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
}).encode()


@dataclass
class _Counts:
    connections: int = 0
    requests: int = 0


async def _serve(counts: _Counts, delay_s: float) -> asyncio.Server:
    def connected() -> None:
        counts.connections += 1

    def requested(_head: bytes) -> None:
        counts.requests += 1

    return await serve_fixed(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(_BODY), _BODY), delay_s=delay_s, on_connect=connected, on_request=requested)


def _tasks(base_url: str, n: int, concurrency: int, model: str = "m") -> list[RunTask]:
    return [
        RunTask(
            run_id=f"{model}-{i:04d}", campaign="t", panel="t", model=model,
            endpoint=EndpointRef(name="fixed", base_url=base_url),
            limits=ModelLimits(max_concurrency=concurrency),
            retry=RetryPolicy(max_attempts=1),
            prompt_sha256="a" * 64, prompt_name="p", run_index=i, user_message="hello",
            instruction_version="v", instruction_sha256="b" * 64,
        )
        for i in range(n)
    ]


def _run(
    tasks_for: Callable[[str], list[RunTask]], store: RunStore, options: LocalOptions, response_delay_s: float = 0.0
) -> tuple[ExecutionSummary, _Counts]:
    """``run_local`` over ``tasks_for(base_url)`` against a fresh counting server."""
    counts = _Counts()

    async def main() -> ExecutionSummary:
        server = await _serve(counts, response_delay_s)
        port = server.sockets[0].getsockname()[1]
        try:
            return await run_local(tasks_for(f"http://127.0.0.1:{port}"), store, secrets={}, options=options)
        finally:
            server.close()
            await server.wait_closed()

    return asyncio.run(main()), counts


def test_connections_follow_the_calls_in_flight_and_are_reused(tmp_path: Path) -> None:
    def tasks(url: str) -> list[RunTask]:
        return _tasks(url, 60, concurrency=4, model="a") + _tasks(url, 30, concurrency=2, model="b")

    store = RunStore(tmp_path / "data", fsync=False)
    summary, counts = _run(tasks, store, LocalOptions())
    assert counts.requests == 90 == summary.executed
    assert len(store.completed_run_ids()) == 90
    assert summary.by_model == {"a": {"ok": 60}, "b": {"ok": 30}}
    # at most one connection per call in flight (4 + 2 coroutines), each kept alive and reused
    assert 1 <= counts.connections <= 6

    capped = RunStore(tmp_path / "capped", fsync=False)
    summary, counts = _run(tasks, capped, LocalOptions(max_in_flight=2))
    assert counts.requests == 90 == summary.executed
    # six coroutines, but never more than 2 calls at once: never more than 2 connections
    # (a client per coroutine would open 6)
    assert 1 <= counts.connections <= 2


def test_pooled_provider_makes_a_client_per_concurrent_call_and_reuses_them() -> None:
    counts = _Counts()

    async def main() -> tuple[int, int]:
        server = await _serve(counts, 0.05)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        pool = PooledProvider(lambda c: OpenAIProvider(c, url, None), tls=make_tls_context())
        request = ChatRequest(model="m", user_message="hello", timeouts=TimeoutPolicy(total_timeout_s=10.0))
        try:
            replies = await asyncio.gather(*[pool.complete(request) for _ in range(3)])
            after_burst = pool.clients_made
            for _ in range(5):  # one at a time: the same idle client every time
                replies.append(await pool.complete(request))
            assert all(r.answer_text for r in replies)
            return after_burst, pool.clients_made
        finally:
            await pool.aclose()
            server.close()
            await server.wait_closed()

    after_burst, total = asyncio.run(main())
    assert after_burst == total == 3
    assert counts.connections == 3 and counts.requests == 8


class _SlowFirstWriteStore(RunStore):
    """A store whose first write takes ``delay_s`` (in the writer's thread) and the others none,
    so the executor closes while its first batch is still being written and the last batch has
    already gone."""

    def __init__(self, root: Path, delay_s: float) -> None:
        super().__init__(root, fsync=False)
        self.delay_s = delay_s
        self.writes = 0

    def write(self, records: Sequence[RunRecord]) -> int:
        self.writes += 1
        if self.writes == 1:
            time.sleep(self.delay_s)
        return super().write(records)


def test_executed_counts_the_batch_still_being_written_when_the_runs_end(tmp_path: Path) -> None:
    store = _SlowFirstWriteStore(tmp_path / "data", delay_s=1.5)
    # 20 runs of >= 10 ms each: the first flush (after 10 ms) is still writing when they end
    summary, counts = _run(lambda url: _tasks(url, 20, concurrency=1), store,
                           LocalOptions(flush_interval_s=0.01), response_delay_s=0.01)
    assert counts.requests == 20
    assert store.writes >= 2
    assert len(store.completed_run_ids()) == 20
    assert summary.executed == 20
