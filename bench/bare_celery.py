"""The bare Celery reference of ``distributed_throughput.py``: plain Celery + Redis making the
same calls as irbench's workers, and nothing else.

It is to the distributed executor what the bare asyncio + httpx loop of ``local_throughput.py``
is to the local one: the floor of the framework on this machine. Same broker (Celery's stock
kombu Redis transport), same worker shape (threads pool, ``-c`` threads, late acks, prefetch
1), same calls (the request bodies irbench sends, through aiohttp on one uvloop per process,
at most ``-c`` calls in flight per process, as irbench's run slots), and several calls per
message with each distinct body carried once, as irbench's ``irbench.runs`` messages. What it
leaves out is everything that makes a run durable and recoverable: no claim, no limiter, no
record, no spool or fsync, no done marker; a message's only side effect is one ``INCRBY`` of
the calls it answered, which is how the sender sees completion.

    celery -A bench.bare_celery worker -P threads -c 8 -Q bare     # env IRBENCH_BROKER_URL
    send_calls(app, url, bodies, k); wait_for(client, n)          # in the measuring process
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Coroutine, Sequence
from typing import Any

import aiohttp
import redis
from celery import Celery
from celery.signals import worker_init

from workers.loops import new_event_loop

QUEUE = "bare"
DONE_KEY = "bare:done"
HEADERS = {"Cache-Control": "no-store", "Accept": "application/json"}  # what OpenAIProvider sends


def make_app(broker_url: str) -> Celery:
    app = Celery("bare", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_acks_late=True, worker_prefetch_multiplier=1, task_ignore_result=True, worker_pool="threads",
        task_serializer="json", accept_content=["json"], broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False, worker_send_task_events=False, task_default_queue=QUEUE,
    )
    return app


class _Process:
    """One worker process's loop thread, HTTP session and Redis client (made on first use)."""

    def __init__(self, slots: int, broker_url: str) -> None:
        self.loop = new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="bare-loop", daemon=True).start()
        self.slots = slots
        self.redis = redis.Redis.from_url(broker_url)
        self._session: aiohttp.ClientSession | None = None
        self._sem: asyncio.Semaphore | None = None

    def run(self, coro: Coroutine[Any, Any, int]) -> int:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def post_all(self, url: str, bodies: Sequence[Any], order: Sequence[int]) -> int:
        if self._session is None:
            self._sem = asyncio.Semaphore(self.slots)
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.slots))
        results = await asyncio.gather(*(self._post(url, bodies[i]) for i in order))
        return sum(results)

    async def _post(self, url: str, body: Any) -> int:
        assert self._session is not None and self._sem is not None
        async with self._sem, self._session.post(url, json=body, headers=HEADERS) as response:
            response.raise_for_status()
            content = json.loads(await response.read())["choices"][0]["message"]["content"]
            return int(isinstance(content, str))


_broker = os.environ.get("IRBENCH_BROKER_URL", "redis://127.0.0.1:6379/0")
app = make_app(_broker)
_state: dict[str, Any] = {"threads": 8}
_lock = threading.Lock()


@worker_init.connect(weak=False)
def _learn_threads(sender: Any = None, **_: Any) -> None:
    _state["threads"] = int(getattr(sender, "concurrency", 8) or 8)


def _process() -> _Process:
    with _lock:
        if "process" not in _state:
            _state["process"] = _Process(_state["threads"], _broker)
        return _state["process"]


@app.task(name="bare.calls", acks_late=True, ignore_result=True)
def calls(url: str, bodies: list[Any], order: list[int]) -> int:
    """POST ``bodies[i]`` for each ``i`` in ``order`` concurrently; count the answers in Redis."""
    p = _process()
    answered = p.run(p.post_all(url, bodies, order))
    p.redis.incrby(DONE_KEY, answered)
    return answered


def send_calls(sender: Celery, url: str, bodies: Sequence[Any], per_message: int) -> int:
    """Publish ``bodies`` in messages of ``per_message`` calls (each distinct body once per
    message); returns the number of messages."""
    messages = 0
    with sender.producer_or_acquire() as producer:
        for start in range(0, len(bodies), per_message):
            group = bodies[start : start + per_message]
            distinct: list[Any] = []
            index: dict[str, int] = {}
            order = []
            for body in group:
                key = json.dumps(body, sort_keys=True)
                if key not in index:
                    index[key] = len(distinct)
                    distinct.append(body)
                order.append(index[key])
            sender.send_task("bare.calls", args=(url, distinct, order), queue=QUEUE, producer=producer)
            messages += 1
    return messages


def wait_for(client: redis.Redis, calls_expected: int, timeout_s: float = 600.0, poll_s: float = 0.05) -> None:
    """Block until the workers have counted ``calls_expected`` answered calls."""
    deadline = time.monotonic() + timeout_s
    while int(client.get(DONE_KEY) or 0) < calls_expected:
        if time.monotonic() > deadline:
            raise TimeoutError(f"bare Celery: {int(client.get(DONE_KEY) or 0)}/{calls_expected} calls in {timeout_s} s")
        time.sleep(poll_s)
