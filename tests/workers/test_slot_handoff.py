"""A worker hands a run slot on as the finishing run's record is queued for the next batch:
the next run's claim rides in that batch (one Redis round trip for both), and still cannot
call before the finished run is durable and marked done. Real ``WorkerRuntime``, real
redis-server, a real endpoint on loopback that counts what it received and, at each request,
how many runs Redis already holds as done."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from deploy.redis_server import RedisServer
from storage.runs import RunStore
from tests.support.distributed import executions_per_run
from tests.support.raw_http import serve_in_thread
from workers.state.campaign_state import CampaignState
from workers.celery.coalesce import Coalescer
from workers.celery.runtime import RuntimeHolder, WorkerSettings
from workers.celery.tasks import run_message
from workers.runtask import EndpointRef, ModelLimits, RunTask

_BODY = json.dumps({"model": "m", "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": "[]"}}]}).encode()
_RESPONSE = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
             + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY)


@dataclass
class _Endpoint:
    """What the endpoint saw: per request, the calls in flight (itself included) and the done
    markers Redis held when it arrived."""

    base_url: str = ""
    in_flight: int = 0
    seen: list[tuple[int, int]] = field(default_factory=list)


@contextmanager
def _endpoint(done_count, delay_s: float) -> Iterator[_Endpoint]:
    ep = _Endpoint()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                ep.in_flight += 1
                ep.seen.append((ep.in_flight, done_count()))
                await asyncio.sleep(delay_s)
                ep.in_flight -= 1
                writer.write(_RESPONSE)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    with serve_in_thread(lambda: asyncio.start_server(handle, "127.0.0.1", 0)) as base_url:
        ep.base_url = base_url
        yield ep


def _task(i: int, base_url: str) -> RunTask:
    return RunTask(run_id=f"r{i}", campaign="sh", panel="sh", model="m", run_index=i,
                   endpoint=EndpointRef(name="ep", base_url=base_url), prompt_sha256="a" * 64,
                   prompt_name="p", user_message="hello", instruction_version="v", instruction_sha256="b" * 64,
                   limits=ModelLimits(max_concurrency=64))


@pytest.mark.parametrize("slots", [1, 3])
def test_a_finish_and_the_next_runs_claim_share_a_batch_and_the_next_call_waits_for_durability(
        tmp_path: Path, slots: int) -> None:
    runs = 12
    with RedisServer() as srv:
        plain = redis.Redis.from_url(srv.url)
        state_key = "irbench:camp:{sh}:done:*"
        with _endpoint(lambda: len(plain.keys(state_key)), delay_s=0.01) as ep:
            holder = RuntimeHolder(srv.url, WorkerSettings(redis_url=srv.url, run_slots=slots))
            try:
                rt = holder.get()
                state = CampaignState(rt.redis, "sh", prefix="irbench:camp")
                assert state.key("done:x").startswith(state_key[:-1])  # the endpoint counts the right keys
                tasks = [_task(i, ep.base_url) for i in range(runs)]
                state.queued.record(t.run_id for t in tasks)
                results = run_message(holder, "w", tasks, str(tmp_path / "data"))
                flushes = rt.batcher("redis", lambda: pytest.fail("the runs had no batcher")).flushes
            finally:
                holder.close()
        plain.close()
    assert all(r not in ("deferred", "failed", "unclaimed", "busy", "done") for r in results), results
    # the endpoint side: every run called once, never more than the slots at once, and each call
    # sent only once every run but (slots - 1) before it was durable and marked done
    assert len(ep.seen) == runs
    assert max(n for n, _ in ep.seen) <= slots
    assert all(done >= k - (slots - 1) for k, (_, done) in enumerate(ep.seen)), ep.seen
    # the store side: every run's record, once
    assert executions_per_run(RunStore(tmp_path / "data")) == Counter({t.run_id: 1 for t in tasks})
    # one batch per run (its claim with the previous run's finish) and one for the last finish;
    # holding the slot through the finish took two per run (claim, finish)
    if slots == 1:
        assert flushes == runs + 1, flushes
    else:
        assert flushes < 2 * runs, flushes


def test_what_is_queued_before_the_caller_suspends_goes_out_in_one_flush() -> None:
    batches: list[list[int]] = []

    async def flush(items: list[int]) -> list[int]:
        batches.append(items)
        await asyncio.sleep(0)
        return [i * 10 for i in items]

    async def main() -> list[int]:
        c: Coalescer[int, int] = Coalescer(flush)
        first = c.enqueue(1)
        second = c.enqueue(2)  # same step: same flush
        got = [await first, await second]
        got.append(await c.submit(3))
        return got

    assert asyncio.run(main()) == [10, 20, 30]
    assert batches == [[1, 2], [3]]
