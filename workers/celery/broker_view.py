"""Which run messages the Redis broker holds: queued in a list or delivered and unacknowledged.

kombu's Redis transport keeps a queue as a list named after it (plus one list per priority
step, ``<queue>\\x06\\x16<step>``) and every delivered, unacknowledged message in the ``unacked``
hash (delivery tag -> ``[message, exchange, routing_key]``). A message's Celery task id (our
run_id) is ``message["headers"]["id"]``. Reading both costs O(messages the broker holds), which
the orchestrator bounds with its outstanding window, never O(campaign).
"""

from __future__ import annotations

import json
from typing import Any

import redis

PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)  # kombu.transport.redis.PRIORITY_STEPS
UNACKED_KEY = "unacked"


def _task_id(raw: Any) -> str | None:
    try:
        msg = json.loads(raw)
        if isinstance(msg, list):  # unacked entries are [message, exchange, routing_key]
            msg = msg[0]
        return str(msg["headers"]["id"])
    except (ValueError, KeyError, TypeError, IndexError):
        return None


def queue_keys(queue: str) -> list[str]:
    return [queue if step == 0 else f"{queue}{PRIORITY_SEP}{step}" for step in PRIORITY_STEPS]


def waiting_ids(client: redis.Redis, queue: str) -> set[str]:
    """Task ids of the messages waiting in ``queue`` (not yet delivered to a worker)."""
    pipe = client.pipeline(transaction=False)
    for key in queue_keys(queue):
        pipe.lrange(key, 0, -1)
    return {t for batch in pipe.execute() for raw in batch if (t := _task_id(raw)) is not None}


def unacked_ids(client: redis.Redis) -> set[str]:
    """Task ids delivered to some worker (alive or dead) and not acknowledged yet."""
    return {t for raw in client.hvals(UNACKED_KEY) if (t := _task_id(raw)) is not None}
