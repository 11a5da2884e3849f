"""The workers' kombu transport (``workers.celery.transport``) against a real redis-server: a
delivery is recorded in ``unacked`` before the task can run, acks are gathered (sent with the
next delivery, by the flusher, or at close), and a process that dies with an ack not yet sent
leaves its message in ``unacked`` (delivered again later), never lost."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu import Connection

from deploy.redis_server import RedisServer
from workers.celery.transport import TRANSPORT, QoS

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def srv() -> Iterator[RedisServer]:
    with RedisServer() as s:
        yield s


def _connection(url: str, ack_flush_s: float) -> Connection:
    return Connection(url, transport=TRANSPORT, transport_options={"ack_flush_s": ack_flush_s})


def _publish(url: str, n: int) -> None:
    with _connection(url, 0.05) as conn:
        q = conn.SimpleQueue("q")
        for i in range(n):
            q.put({"i": i})
        q.close()


def _wait_for(cond, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_a_delivery_is_recorded_and_its_gathered_ack_reaches_redis(srv: RedisServer) -> None:
    r = redis.Redis.from_url(srv.url)
    _publish(srv.url, 3)
    with _connection(srv.url, 0.2) as conn:
        q = conn.SimpleQueue("q")
        m1 = q.get(timeout=5)
        assert isinstance(q.channel.qos, QoS)
        assert r.hlen("unacked") == 1 and r.zcard("unacked_index") == 1  # recorded before the task runs
        m1.ack()
        assert r.hlen("unacked") == 1  # gathered, not sent yet
        m2 = q.get(timeout=5)  # the gathered ack rides with this delivery
        assert r.hlen("unacked") == 1 and r.zcard("unacked_index") == 1
        assert m2.payload == {"i": 1}
        m2.ack()
        t0 = time.monotonic()
        assert _wait_for(lambda: r.hlen("unacked") == 0)  # the flusher sends it
        assert time.monotonic() - t0 < 2.0
        assert r.zcard("unacked_index") == 0
        m3 = q.get(timeout=5)
        m3.ack()
        q.close()
    assert r.hlen("unacked") == 0 and r.zcard("unacked_index") == 0  # sent at close at the latest
    assert r.llen("q") == 0


def test_a_death_before_the_ack_is_sent_leaves_the_message_in_unacked(srv: RedisServer) -> None:
    r = redis.Redis.from_url(srv.url)
    _publish(srv.url, 1)
    code = textwrap.dedent(f"""
        import os
        from kombu import Connection
        conn = Connection({srv.url!r}, transport={TRANSPORT!r}, transport_options={{"ack_flush_s": 30.0}})
        q = conn.SimpleQueue("q")
        m = q.get(timeout=5)
        m.ack()          # gathered: not sent within 30 s
        os._exit(9)      # as a SIGKILL: no close, no flush
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=60)
    assert proc.returncode == 9
    assert r.llen("q") == 0
    assert r.hlen("unacked") == 1  # kept: restored to the queue after the visibility timeout
    with _connection(srv.url, 0.05) as conn:  # kombu's own restore of visible-timeout messages
        ch = conn.default_channel
        ch.visibility_timeout = 0
        ch.qos.restore_visible(num=10, interval=1)
    assert r.llen("q") == 1 and r.hlen("unacked") == 0


def test_closing_after_the_broker_went_away_leaves_the_message_in_unacked() -> None:
    """A worker's consumer closes its connection after a Redis restart; kombu clears the
    transport's connection details, drops the channel's pools, then restores the unacknowledged
    messages through ``conn_or_acquire``. That must end in a connection error (ignored by the
    close path), not an AttributeError: one stopped every worker's consumer for good in a Redis
    restart test under load (the campaign stalled with 81 runs queued)."""
    with RedisServer(aof=True) as srv:  # AOF: what the deployment runs; the data outlives the kill
        _closing_after_the_broker_went_away(srv)


def _closing_after_the_broker_went_away(srv: RedisServer) -> None:
    from kombu.common import ignore_errors

    _publish(srv.url, 1)
    conn = _connection(srv.url, 0.05)
    ch = conn.default_channel
    assert ch.basic_get("q", no_ack=False) is not None and len(ch.qos._delivered) == 1
    srv.stop(kill=True)
    conn.transport.client = None  # what Connection._do_close_transport did first, in that worker
    ignore_errors(conn, conn.close)  # raises if anything but a connection/channel error comes out
    srv.start()
    client = redis.Redis.from_url(srv.url)
    assert client.hlen("unacked") == 1 and client.llen("q") == 0  # kept for redelivery, not lost
    client.close()
