"""kombu's Redis transport with one reused sync client per channel.

kombu's ``redis`` channel builds a new ``redis.Redis`` object (parsers, response-callback
tables, …) for every operation that has no client at hand: each late ack, each unacked-index
entry made on delivery and each publish. The connection pool is shared, so those objects buy
nothing; building them costs about 7 % of a worker's CPU and 9 % of the orchestrator's
dispatch (py-spy during ``bench/distributed_throughput.py``). This channel keeps one client per connection pool (a
``redis.Redis`` is thread-safe; every operation still takes a pooled connection of its own) and
rebuilds it when kombu replaces the pool (after a connection loss).

Its QoS (kombu's ack emulation: a delivered message waits in the ``unacked`` hash, indexed by
time, until acknowledged) also costs fewer round trips. kombu records a delivery with a
MULTI/ZADD/HSET/EXEC transaction and an ack with MULTI/ZREM/HDEL/EXEC, each a blocking round
trip on the worker's consumer thread — the thread that fetches the next message. Here a delivery
is one script call, and acks are *gathered*: an ack is sent with the next delivery's call, or
by a flusher thread at most ``ack_flush_s`` later (transport option; default 0.05 s), or when
the channel closes. Acknowledging later never loses anything: a message whose ack had not
reached Redis when its worker died stays in ``unacked`` and is delivered again after the
visibility timeout, and the task is idempotent (``workers.celery.tasks``: the claim finds the
run done). The ack itself still happens only after the task returned, i.e. after its records
are durable.

Selected by ``broker_transport`` in ``workers.celery.app.make_celery_app`` for ``redis://`` broker
URLs only (:func:`transport_for`); any other scheme (``rediss://``, ``sentinel://``, …) keeps
kombu's own transport for it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps
from redis.exceptions import ConnectionError as RedisConnectionError

#: What ``broker_transport`` names (kombu imports ``module:Class`` transport names).
TRANSPORT = "workers.celery.transport:Transport"


def transport_for(broker_url: str) -> str | None:
    """``TRANSPORT`` for a plain ``redis://`` URL, else None (kombu picks by scheme)."""
    return TRANSPORT if broker_url.split("://", 1)[0].lower() == "redis" else None


#: Default of the ``ack_flush_s`` transport option: longest delay before a gathered ack is sent.
ACK_FLUSH_S = 0.05

# KEYS: unacked index ZSET, unacked HASH. ARGV: delivery tag to record ('' = none), its time,
# its payload, then the delivery tags acknowledged since the last call.
_DELIVER_AND_ACK = """
if ARGV[1] ~= '' then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
end
for i = 4, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
return #ARGV - 3
"""

log = logging.getLogger("irbench.transport")


class QoS(kombu_redis.QoS):
    """kombu's Redis ack emulation with one script call per delivery and gathered acks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = self.channel.connection.client.transport_options or {}
        self.ack_flush_s = float(options.get("ack_flush_s", ACK_FLUSH_S))
        self._acks: list[str] = []
        self._cond = threading.Condition()
        self._flusher: threading.Thread | None = None
        self._closing = False
        self._script: Any = None

    def _call(self, tag: str, score: float, payload: str, acks: list[str]) -> None:
        with self.channel.conn_or_acquire() as client:
            if self._script is None:
                self._script = client.register_script(_DELIVER_AND_ACK)  # an object only: no round trip
            try:
                self._script(keys=[self.unacked_index_key, self.unacked_key], args=[tag, score, payload, *acks],
                             client=client)
            except BaseException:
                with self._cond:
                    self._acks[:0] = acks  # not sent: they go with the next call
                raise

    def _take_acks(self) -> list[str]:
        with self._cond:
            acks, self._acks = self._acks, []
        return acks

    def append(self, message: Any, delivery_tag: str) -> None:
        delivery = message.delivery_info
        payload = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
        self._call(delivery_tag, time.time(), payload, self._take_acks())
        virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        with self._cond:
            self._acks.append(delivery_tag)
            if self._flusher is None and not self._closing:
                self._flusher = threading.Thread(target=self._flush_loop, name="irbench-acks", daemon=True)
                self._flusher.start()
            self._cond.notify()
        virtual.QoS.ack(self, delivery_tag)

    def flush_acks(self) -> int:
        """Send the gathered acks now; returns how many were sent."""
        acks = self._take_acks()
        if acks:
            self._call("", 0.0, "", acks)
        return len(acks)

    def _flush_loop(self) -> None:
        while True:
            with self._cond:
                while not self._acks and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
            time.sleep(self.ack_flush_s)  # gather: acks that come meanwhile ride along (or with a delivery)
            try:
                self.flush_acks()
            except Exception as exc:
                log.warning("ack flush failed (%s); retrying", exc)
                time.sleep(self.ack_flush_s)

    def stop(self) -> None:
        """Stop the flusher and send what it still holds (best effort: an unsent ack only means
        a redelivery after the visibility timeout)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        try:
            self.flush_acks()
        except Exception as exc:
            log.warning("acks not sent at close (%s): those messages are delivered again later", exc)


class Channel(kombu_redis.Channel):
    """A kombu Redis channel whose client-less operations share one client per pool."""

    QoS = QoS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._shared: tuple[Any, Any] | None = None  # (pool, client built on it)
        self._shared_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def _shared_client(self) -> Any:
        with self._shared_lock:
            if self._pool is None and self.connection.client is None:
                # Closing after the broker connection was lost: kombu has dropped the pools and
                # then restores the channel's unacknowledged messages, but it cannot build a pool
                # without the connection's details (an AttributeError that stopped the worker's
                # consumer for good after a Redis restart under load). Use the client we had, or
                # report a connection error, which the consumer's close path ignores: the
                # messages stay in ``unacked`` and come back after the visibility timeout.
                if self._shared is not None:
                    return self._shared[1]
                raise RedisConnectionError("the broker connection is closed")
            pool = self.pool
            if self._shared is None or self._shared[0] is not pool:
                self._shared = (pool, self._create_client())
            return self._shared[1]

    @contextlib.contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        yield client if client else self._shared_client()

    def close(self) -> None:
        qos = self.__dict__.get("_qos")
        if isinstance(qos, QoS):
            qos.stop()
        try:
            super().close()  # restores unacknowledged messages through the shared client
        finally:
            self._shared = None


class Transport(kombu_redis.Transport):
    Channel = Channel
