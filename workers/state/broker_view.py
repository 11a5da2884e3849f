"""Which run messages the Redis broker holds: queued in a list or delivered and unacknowledged.

kombu's Redis transport keeps a queue as a list named after it (plus one list per priority
step, ``<queue>\\x06\\x16<step>``) and every delivered, unacknowledged message in the ``unacked``
hash (delivery tag -> ``[message, exchange, routing_key]``). A one-run message's Celery task id
is its run_id (``message["headers"]["id"]``); a several-runs message lists them in its
``irbench_runs`` header. Reading both costs O(messages the broker holds), which
the orchestrator bounds with its outstanding window, never O(campaign).
"""

from __future__ import annotations

import json
from typing import Any

import redis

PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)  # kombu.transport.redis.PRIORITY_STEPS
UNACKED_KEY = "unacked"
#: Message header listing the run ids of a several-runs message (``workers.celery.tasks``).
RUN_IDS_HEADER = "irbench_runs"


def _run_ids(raw: Any) -> list[str]:
    """The run ids a message carries: its ``irbench_runs`` header (a several-runs message,
    ``irbench.runs``), else its task id (one run)."""
    try:
        msg = json.loads(raw)
        if isinstance(msg, list):  # unacked entries are [message, exchange, routing_key]
            msg = msg[0]
        headers = msg["headers"]
        ids = headers.get(RUN_IDS_HEADER)
        return [str(r) for r in ids] if isinstance(ids, list) else [str(headers["id"])]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return []


def queue_keys(queue: str) -> list[str]:
    return [queue if step == 0 else f"{queue}{PRIORITY_SEP}{step}" for step in PRIORITY_STEPS]


def waiting_ids(client: redis.Redis, queue: str) -> set[str]:
    """Task ids of the messages waiting in ``queue`` (not yet delivered to a worker)."""
    pipe = client.pipeline(transaction=False)
    for key in queue_keys(queue):
        pipe.lrange(key, 0, -1)
    return {t for batch in pipe.execute() for raw in batch for t in _run_ids(raw)}


def unacked_ids(client: redis.Redis) -> set[str]:
    """Task ids delivered to some worker (alive or dead) and not acknowledged yet."""
    return {t for raw in client.hvals(UNACKED_KEY) for t in _run_ids(raw)}
