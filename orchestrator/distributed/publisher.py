"""Runs onto the broker: recorded as queued in Redis, then published as ``irbench.run(s)`` messages.

First sends go as messages of several runs (``runs_per_message``, or the auto size of
``orchestrator.distributed.message_size``); runs sent again (lost, claim expired, ...) go one
per message, so a poison run cannot take its message-mates with it more than once.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import structlog
from celery import Celery

from orchestrator.distributed.context import CampaignContext
from orchestrator.distributed.message_size import AUTO, MessageSizer
from storage.clock import utc_now
from workers.celery.message import encode_runs
from workers.celery.tasks import RUN_TASK_NAME, RUNS_TASK_NAME
from workers.runtask import RunTask
from workers.state.broker_view import RUN_IDS_HEADER

log = structlog.get_logger("irbench.celery")

#: a countdown shorter than this (seconds) is no countdown
_NO_WAIT_S = 0.001
#: runs due within this many seconds of each other share a message, sent with the latest
#: countdown of them (late, never early: a reserved rate slot is never run into early)
COUNTDOWN_STEP_S = 0.1


class Publisher:
    """Publishes runs of one campaign to ``broker`` for the store at ``root``; ``sizer`` picks
    the auto message size. Counts what it sent: ``message_sizes`` (runs per message ->
    messages, first sends) and ``resent`` (why -> runs sent again)."""

    def __init__(self, ctx: CampaignContext, broker: Celery, root: str, sizer: MessageSizer) -> None:
        self._ctx = ctx
        self._broker = broker
        self._root = root
        self._sizer = sizer
        self._today = utc_now().date()
        self.message_sizes = Counter[int]()
        self.resent = Counter[str]()

    def send(self, tasks: Sequence[RunTask], runs_left: int, countdown_s: dict[str, float] | None = None) -> None:
        """First sends of ``tasks`` (``runs_left``: the campaign's runs still pending, for the
        auto size); runs in ``countdown_s`` (run_id -> seconds) go with their countdown, those
        due together in one message (``_messages``)."""
        if tasks:
            self._publish(tasks, self._runs_per_message(runs_left), countdown_s or {}, first=True)

    def resend(self, tasks: Sequence[RunTask], why: str) -> None:
        """Send ``tasks`` again, one run per message; ``why`` is counted and logged."""
        if not tasks:
            return
        self._publish(tasks, 1, {}, first=False)
        self.resent[why] += len(tasks)
        log.info("runs_resent", campaign=self._ctx.campaign, why=why, runs=len(tasks))

    def _publish(self, tasks: Sequence[RunTask], k: int, countdown_s: dict[str, float], first: bool) -> None:
        """Record then publish (a kill between the two leaves queued entries that the reconciler
        finds missing from the broker and re-sends). Each message carries ``measured_on`` = the
        UTC dispatch date, so every redelivery of a run writes to the same partition."""
        stamped = [t if t.measured_on is not None else t.model_copy(update={"measured_on": self._today})
                   for t in tasks]
        step = self._ctx.options.dispatch_batch * k  # dispatch_batch messages per producer round
        for i in range(0, len(stamped), step):
            batch = stamped[i : i + step]
            messages = _messages(batch, k, countdown_s)

            def send(batch: list[RunTask] = batch, messages: list[tuple[list[RunTask], float]] = messages) -> None:
                self._ctx.state.queued.record(t.run_id for t in batch)
                with self._broker.producer_or_acquire() as producer:
                    for group, wait in messages:
                        self._send(producer, group, wait)

            self._ctx.call(send, "dispatching")  # retried whole: counted once, below
            if first:
                self.message_sizes.update(len(group) for group, wait in messages if not wait)

    def _runs_per_message(self, runs_left: int) -> int:
        """``runs_per_message``, or with 0 (auto) the size ``orchestrator.distributed.message_size`` picks
        for the live workers and the outstanding window (or the runs left, if fewer)."""
        options = self._ctx.options
        if options.runs_per_message != AUTO:
            return options.runs_per_message
        return self._sizer.size(min(self._ctx.window_runs, runs_left))

    def _send(self, producer: Any, group: list[RunTask], wait_s: float) -> None:
        # argsrepr: Celery's default is a saferepr of the whole task JSON, ~a quarter of the
        # dispatch CPU; the run ids say enough
        ids = [t.run_id for t in group]
        common = {"queue": self._ctx.options.queue, "producer": producer,
                  "countdown": wait_s if wait_s > _NO_WAIT_S else None, "argsrepr": repr(ids), "kwargsrepr": "{}",
                  "kwargs": {"dispatch": self._ctx.dispatch}}
        if len(group) == 1:
            self._broker.send_task(RUN_TASK_NAME, args=(group[0].model_dump(mode="json"), self._root),
                                   task_id=group[0].run_id, **common)
        else:  # the run ids ride in a header too: the reconciler's broker listing reads them (broker_view)
            self._broker.send_task(RUNS_TASK_NAME, args=(encode_runs(group), self._root),
                                   task_id=f"{ids[0]}+{len(ids) - 1}", headers={RUN_IDS_HEADER: ids}, **common)


def _messages(batch: list[RunTask], k: int, countdown_s: dict[str, float]) -> list[tuple[list[RunTask], float]]:
    """``batch`` as broker messages: groups of up to ``k`` runs in dispatch order (``k`` is
    1 for re-sent runs); runs with a countdown grouped by it, in steps of ``COUNTDOWN_STEP_S``
    (a deferred run sent alone would take a worker thread for one call). The plan interleaves
    the models, so a message holds runs of several models, whose permits do not compete,
    and the worker runs them concurrently: a model waiting on its limit holds one run slot
    per waiting run, never the others' runs."""
    steps: dict[int, list[RunTask]] = {}
    rest = []
    for t in batch:
        wait_s = countdown_s.get(t.run_id, 0.0)
        if wait_s > _NO_WAIT_S:
            steps.setdefault(math.ceil(wait_s / COUNTDOWN_STEP_S), []).append(t)
        else:
            rest.append(t)
    waiting = [(group[i : i + k], step * COUNTDOWN_STEP_S) for step, group in sorted(steps.items())
               for i in range(0, len(group), k)]
    return waiting + [(rest[i : i + k], 0.0) for i in range(0, len(rest), k)]
