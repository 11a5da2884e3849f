"""What a distributed campaign still has to send, and sending it.

* **dispatch** publishes pending runs (models interleaved) while fewer than ``max_outstanding``
  are queued or running, and re-publishes deferred runs whose time has come
  (``DelayedRuns.pop_due``: the delayed set is ours, in Redis, not countdown messages inside
  workers that can die; a run due before the next look, at most ``poll_interval_s`` ahead, goes
  out with the remainder as a countdown, so a reserved rate slot is met exactly);
* **poison**: a run that failed ``max_task_failures`` times (its task raised or its worker died)
  is stored as ``worker_error`` with the failure text and never sent again;
* **cancel** records never-dispatched runs ``cancelled`` (workers record the rest).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from functools import partial

import structlog

from orchestrator.distributed.completion import CompletionTracker
from orchestrator.distributed.context import CampaignContext
from orchestrator.distributed.publisher import Publisher
from storage.records import RunRecord
from storage.runs import RunStore
from workers.execute import worker_error_record
from workers.runtask import RunTask
from workers.spend import CAMPAIGN_SCOPE

log = structlog.get_logger("irbench.celery")

RecordsFor = Callable[[Sequence[RunTask], str, dict[str, str] | None], list[RunRecord]]


class Dispatcher:
    """Sends one campaign's runs through ``publisher``, the pending ones as ``tracker`` says.

    ``closed_records(tasks, reason, by_model)`` builds the records of runs never sent (cancelled
    or unavailable); ``unavailable`` maps the models closed for availability to the reason.
    Records the dispatcher makes itself (never sent, poison) are written to ``store``.
    """

    def __init__(self, ctx: CampaignContext, publisher: Publisher, tracker: CompletionTracker,
                 store: RunStore, closed_records: RecordsFor, unavailable: dict[str, str]) -> None:
        self._ctx = ctx
        self._publisher = publisher
        self._tracker = tracker
        self._store = store
        self._closed_records = closed_records
        self._unavailable = unavailable
        self._to_send: list[RunTask] = []
        self._spend_capped = any(t.spend_capped for t in ctx.by_id.values())
        self.poisoned: list[str] = []

    def start(self) -> None:
        """Decide what to send: pending runs Redis does not know (the rest are queued, running,
        deferred or done from an earlier orchestrator)."""
        pending = self._tracker.pending
        known = self._ctx.call(lambda: self._ctx.state.known(pending), "reading the campaign state")
        self._to_send = [t for rid, t in pending.items() if rid not in known]

    @property
    def to_send(self) -> Collection[RunTask]:
        """The runs not sent yet, in dispatch order (read only)."""
        return self._to_send

    def close_unsendable(self) -> None:
        """Never-dispatched runs of a cancelled campaign, an unavailable model or a spend cap
        reached: recorded here (``cancelled`` with the reason, no call) so every planned run has
        a record."""
        reason = self._ctx.call(self._ctx.state.flags.cancel_reason, "reading the cancel flag")
        if reason is not None and self._to_send:
            self._store_closed(self._to_send, reason)
            self._to_send = []
        self._close_models(self._unavailable)
        if self._spend_capped and self._to_send:
            closed = self._ctx.call(self._ctx.state.spend.closed, "reading the spend cap")
            if CAMPAIGN_SCOPE in closed:
                self._store_closed(self._to_send, closed[CAMPAIGN_SCOPE])
                self._to_send = []
            self._close_models(closed)

    def _close_models(self, closed: dict[str, str]) -> None:
        """Record the never-dispatched runs of the models in ``closed`` (model -> reason)."""
        if closed and self._to_send:
            skip = [t for t in self._to_send if t.model in closed]
            if skip:
                self._store_closed(skip, "", {m: closed[m] for m in {t.model for t in skip}})
                self._to_send = [t for t in self._to_send if t.model not in closed]

    def dispatch(self) -> int:
        """Publish due deferred runs, then pending runs up to the outstanding window; returns runs sent."""
        ctx, state, options = self._ctx, self._ctx.state, self._ctx.options
        sent = 0
        ahead = options.poll_interval_s  # due before the next look: sent now, with the rest as countdown
        due = ctx.call(lambda: state.delayed.pop_due(options.dispatch_batch * 10, ahead), "moving due runs")
        if due:
            tasks = self.drop_poisoned([ctx.by_id[r] for r in due if r in ctx.by_id])
            self._publisher.send(tasks, len(self._tracker.pending), countdown_s=due)
            sent += len(tasks)
        if self._to_send:
            room = max(options.max_outstanding - ctx.call(state.outstanding, "counting outstanding runs"), 0)
            batch, self._to_send = self._to_send[:room], self._to_send[room:]
            batch = [t for t in batch if t.run_id in self._tracker.pending]
            self._publisher.send(batch, len(self._tracker.pending))
            sent += len(batch)
        return sent

    def pause_s(self) -> float:
        """The loop's sleep: ``poll_interval_s``, or less when a deferred run falls due sooner, so
        a run whose rate slot is reserved goes out at its slot (late runs would arrive together)."""
        due = self._ctx.call(self._ctx.state.delayed.next_due_in_s, "reading the next due run")
        if due is None:
            return self._ctx.options.poll_interval_s
        return min(self._ctx.options.poll_interval_s, max(due, 0.002))

    def drop_poisoned(self, tasks: list[RunTask]) -> list[RunTask]:
        """Store ``worker_error`` for runs that failed ``max_task_failures`` times; keep the rest."""
        keep = []
        for t in tasks:
            n, text = self._ctx.call(partial(self._ctx.state.claims.failures, t.run_id), "reading failures")
            if n >= self._ctx.options.max_task_failures:
                self._poison(t, n, text)
            else:
                keep.append(t)
        return keep

    def _poison(self, task: RunTask, failures: int, text: str | None) -> None:
        record = worker_error_record(task, f"{failures} task failures; last: {text or 'unknown'}")
        self._store_final([record])
        self.poisoned.append(task.run_id)
        log.warning("run_poisoned", campaign=self._ctx.campaign, run_id=task.run_id, model=task.model,
                    failures=failures, error=text)

    def _store_closed(self, tasks: Sequence[RunTask], reason: str, by_model: dict[str, str] | None = None) -> None:
        self._store_final(self._closed_records(tasks, reason, by_model))

    def _store_final(self, records: Sequence[RunRecord]) -> None:
        """Records the orchestrator itself stores (never sent, or poison): durable, then done."""
        if not records:
            return
        self._store.write(records)
        state = self._ctx.state
        for r in records:
            self._ctx.call(partial(state.done.mark, r.run_id, r.model, r.outcome.value, True, len(r.attempts),
                                   self._ctx.dispatch),
                           "marking done")
