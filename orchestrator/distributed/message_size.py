"""How many runs one broker message carries when ``runs_per_message`` is 0 (auto, the default).

A message costs a worker a fixed amount whatever it carries (kombu's delivery and late ack, the
task's decoding, a thread hand-off), and its runs' claims and finishes share Redis batches: on
the zero-latency simulator 16 runs per message gave 1.8x the runs/s of 1, 64 more again
(bench/distributed_throughput.py measures this). Large messages have one cost: a worker holds its messages' runs until it has
executed them, so at the end of a campaign one worker can still hold runs while others idle.
The orchestrator already keeps at most ``max_outstanding`` runs queued or executing, so the auto
size splits that window (or what is left of the campaign, if less) into **twice as many
messages as the live workers take at once**: every worker thread holds one message and as many
again wait in the broker for whichever worker is free first. Many workers, or a campaign's last
runs, get smaller messages; a few workers on a large campaign get up to ``MAX_AUTO_RUNS``.

A worker's message slots are its threads (Celery's prefetch multiplier is 1), as it publishes
them in its presence (``workers.state.presence``); a worker too old to say counts as
``irbench worker``'s default (``DEFAULT_THREADS``). With no live worker on the queue the size is 1: nothing is known about who
will take the runs.

A worker also publishes its call slots (what its memory budget holds, or its ``run_slots``):
the size is at most the smallest worker's call slots over its threads, so the messages a
worker holds never carry more runs than it can call at once. A worker at its budget takes no
message it could not start, and the runs that would not fit stay in the broker, free for any
worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from redis.exceptions import RedisError

from workers.celery import DEFAULT_THREADS
from workers.state.presence import WorkerPresence

AUTO = 0  # ``runs_per_message`` value that asks for this module's size
MAX_AUTO_RUNS = 64


def auto_runs_per_message(message_slots: int, window_runs: int, cap: int = MAX_AUTO_RUNS) -> int:
    """Runs per message: ``window_runs`` (runs that may be queued or executing) over twice
    ``message_slots`` (messages the live workers hold at once, all together), between 1 and
    ``cap``; 1 when no worker is known (``message_slots`` 0)."""
    if message_slots <= 0 or window_runs <= 0:
        return 1
    return max(1, min(cap, window_runs // (2 * message_slots)))


def message_slots(workers: Sequence[WorkerPresence], queue: str) -> int:
    """Messages the live workers consuming ``queue`` hold at once, all together."""
    return sum(w.threads or DEFAULT_THREADS for w in workers if queue in w.queues)


def runs_held_cap(workers: Sequence[WorkerPresence], queue: str) -> int:
    """The most runs a message may carry so that no live worker consuming ``queue`` holds more
    runs than its call slots (``run_slots`` over threads, the smallest; at least 1);
    ``MAX_AUTO_RUNS`` when no worker says its slots."""
    caps = [max(1, w.run_slots // (w.threads or DEFAULT_THREADS))
            for w in workers if queue in w.queues and w.run_slots is not None]
    return min([MAX_AUTO_RUNS, *caps])


class MessageSizer:
    """The auto size for the next dispatch; the workers' presence is read through
    ``read_workers`` at most every ``refresh_s`` seconds of ``clock`` (a read that fails keeps the
    last figure)."""

    def __init__(self, read_workers: Callable[[], Sequence[WorkerPresence]], queue: str,
                 clock: Callable[[], float] = time.monotonic, refresh_s: float = 2.0) -> None:
        self._read, self._queue, self._clock, self._refresh_s = read_workers, queue, clock, refresh_s
        self._slots = 0
        self._cap = MAX_AUTO_RUNS
        self._read_at: float | None = None

    def size(self, window_runs: int) -> int:
        """Runs per message for a dispatch with ``window_runs`` runs that may be out at once."""
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self._refresh_s:
            self._read_at = now
            try:
                workers = self._read()
                self._slots, self._cap = message_slots(workers, self._queue), runs_held_cap(workers, self._queue)
            except (RedisError, OSError):  # Redis away: the caller's own Redis calls say so
                pass
        return auto_runs_per_message(self._slots, window_runs, self._cap)
