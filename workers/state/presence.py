"""Workers announce themselves in Redis: name, queues, which store they write to, and how many
messages and runs they take at once.

Each worker process publishes ``<prefix>:<worker name>`` (a JSON ``WorkerPresence``) every
``interval_s`` with a TTL of three intervals, from a daemon thread started when the worker is
ready (``install``, one line in the Celery app module), and lists its name in the ``<prefix>``
sorted set so readers find the live ones without scanning the keyspace (which holds a done
marker per run: 100k keys in a 100k-run campaign). The orchestrator reads them
(``read_presence``) to warn when no worker consumes its queue, to refuse to dispatch to workers
whose store differs from its own (``orchestrator.distributed.worker_checks``) and to size its messages
(``orchestrator.distributed.message_size``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from workers.state.connect import RedisTimeouts, sync_redis
from workers.state.broker_watch import BrokerWatch, broker_warn_after_s
import structlog
from redis.exceptions import RedisError

from storage.objectstore.location import is_store_url
from storage.parquet.store_marker import read_store_id

log = structlog.get_logger("irbench.presence")
PRESENCE_PREFIX = "irbench:presence"


@dataclass(frozen=True)
class WorkerPresence:
    """What one worker says about itself. ``data_dir`` is ``None`` when the worker writes where
    each task says (the orchestrator's path); ``store_id`` is the id found there."""

    name: str
    queues: tuple[str, ...]
    data_dir: str | None
    store_id: str | None
    host: str
    pid: int
    published_at_s: float  # unix time
    threads: int | None = None  # messages it holds at once (its -c, prefetch multiplier 1); None: not said
    run_slots: int | None = None  # runs it executes at once; None: not said

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> WorkerPresence | None:
        try:
            data = json.loads(text)
            return cls(
                name=str(data["name"]), queues=tuple(str(q) for q in data["queues"]),
                data_dir=data.get("data_dir"), store_id=data.get("store_id"), host=str(data["host"]),
                pid=int(data["pid"]), published_at_s=float(data["published_at_s"]),
                threads=_count(data.get("threads")), run_slots=_count(data.get("run_slots")),
            )
        except (ValueError, KeyError, TypeError):
            return None


def _count(value: Any) -> int | None:
    """A positive count from a presence's JSON, else None (an older worker, or nonsense)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


#: Index entries older than this are dropped by every publish: a worker that stopped without its
#: shutdown hook (SIGKILL) left its name there; its key is long gone by TTL.
INDEX_KEEP_S = 3600.0


def read_presence(client: redis.Redis, prefix: str = PRESENCE_PREFIX) -> list[WorkerPresence]:
    """Every live worker's presence (expired ones are gone by TTL): the names in the index,
    then their keys in one ``MGET`` — two commands, whatever the keyspace holds; it writes
    nothing."""
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in client.zrange(prefix, 0, -1)]
    if not names:
        return []
    out = []
    for value in client.mget([f"{prefix}:{n}" for n in names]):
        presence = WorkerPresence.from_json(value) if value is not None else None
        if presence is not None:
            out.append(presence)
    return sorted(out, key=lambda p: p.name)


@dataclass(frozen=True)
class WorkerSlots:
    """How much one worker takes at once: ``threads`` (messages it holds, its -c) and
    ``run_slots`` (runs it executes); ``None``: not said."""

    threads: int | None = None
    run_slots: int | None = None


def _absolute(data_dir: str) -> str:
    return data_dir if is_store_url(data_dir) else str(Path(data_dir).resolve())


def store_identity(data_dir: str) -> str | None:
    """The id of the store at ``data_dir``: a bucket store's URL, else its marker's id."""
    return data_dir if is_store_url(data_dir) else read_store_id(Path(data_dir))


class PresencePublisher:
    """Publishes one worker's presence (every ``interval_s`` seconds) until ``stop()``; Redis
    errors are logged and retried."""

    def __init__(self, client: redis.Redis, name: str, queues: tuple[str, ...], data_dir: str | None,
                 *, slots: WorkerSlots = WorkerSlots(), interval_s: float = 2.0, prefix: str = PRESENCE_PREFIX) -> None:
        self._client, self._name, self._queues, self._data_dir = client, name, queues, data_dir
        self._slots = slots
        self._interval_s, self._key, self._index = interval_s, f"{prefix}:{name}", prefix
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="irbench-presence", daemon=True)

    def presence(self) -> WorkerPresence:
        store_id = store_identity(self._data_dir) if self._data_dir else None
        return WorkerPresence(self._name, self._queues, self._data_dir, store_id, socket.gethostname(),
                              os.getpid(), time.time(), self._slots.threads, self._slots.run_slots)

    def publish_once(self) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.set(self._key, self.presence().to_json(), px=int(self._interval_s * 3000))
        pipe.zadd(self._index, {self._name: time.time()})
        pipe.zremrangebyscore(self._index, "-inf", time.time() - INDEX_KEEP_S)
        pipe.execute()

    def _loop(self) -> None:
        while True:
            try:
                self.publish_once()
            except RedisError as exc:
                log.warning("presence_publish_failed", error=str(exc))
            if self._stop.wait(self._interval_s):
                return

    def start(self) -> PresencePublisher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(2.0)
        try:
            self._client.delete(self._key)
            self._client.zrem(self._index, self._name)
        except RedisError:
            pass


def _queues_of(consumer: Any) -> tuple[str, ...]:
    try:
        return tuple(sorted(q.name for q in consumer.task_consumer.queues))
    except AttributeError:
        return tuple(sorted(consumer.app.amqp.queues.keys()))


def install(signals: Any, data_dir_for: Any, slots_for: Any, interval_for: Any) -> None:
    """Start a publisher when a worker is ready and stop it at shutdown.

    ``signals``: ``celery.signals``; ``data_dir_for(app) -> str | None``: the worker's store root;
    ``slots_for(app) -> (threads, run_slots)``: how many messages and runs it takes at once;
    ``interval_for(app) -> float``: seconds between publications.
    """
    running: list[PresencePublisher | BrokerWatch] = []

    def on_ready(sender: Any = None, **_: Any) -> None:
        app = sender.app
        client = sync_redis(app.conf.broker_url, RedisTimeouts(retries=0))  # the next beat retries
        interval = float(interval_for(app))
        data_dir = data_dir_for(app)
        threads, run_slots = slots_for(app)
        running.append(PresencePublisher(client, sender.hostname, _queues_of(sender),
                                         _absolute(data_dir) if data_dir else None,
                                         slots=WorkerSlots(threads, run_slots), interval_s=interval).start())
        # the worker's Redis calls retry a stalled broker silently: its log says so within seconds
        running.append(BrokerWatch(app.conf.broker_url, lambda text: log.warning("broker_watch", message=text),
                                   who=f"worker {sender.hostname}", warn_after_s=broker_warn_after_s()).start())

    def on_shutdown(**_: Any) -> None:
        while running:
            running.pop().stop()

    signals.worker_ready.connect(on_ready, weak=False, dispatch_uid="irbench-presence-ready")
    signals.worker_shutdown.connect(on_shutdown, weak=False, dispatch_uid="irbench-presence-stop")
