"""What a distributed campaign still has to send, and sending it.

* **dispatch** publishes pending runs (models interleaved) while fewer than the window (``max_outstanding``, or auto)
  are queued or running, and re-publishes deferred runs whose time has come
  (``DelayedRuns.pop_due``: the delayed set is ours, in Redis, not countdown messages inside
  workers that can die; a run due before the next look, at most ``poll_interval_s`` ahead, goes
  out with the remainder as a countdown, so a reserved rate slot is met exactly);
* **poison**: a run that failed ``max_task_failures`` times (its task raised or its worker died)
  is stored as ``worker_error`` with the failure text and never sent again;
* **cancel** records never-dispatched runs ``cancelled`` (workers record the rest).

The plan is never materialised: a cursor walks it in plan order (the models interleaved) and each
look builds the tasks of the next window only, as many as the outstanding window has room for; a
bitmap (``handled``) says which runs were sent, found out at start or recorded closed. Closing a
model or the campaign records its never-sent runs a chunk of ``CLOSE_CHUNK`` at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial

import numpy as np
import structlog

from orchestrator.campaign.run_bitmap import RunBitmap
from orchestrator.distributed.completion import CompletionTracker
from orchestrator.distributed.context import CampaignContext
from orchestrator.distributed.known_runs import KnownRuns, known_runs
from orchestrator.distributed.publisher import Publisher
from storage.records import RunRecord
from storage.runs import RunStore
from workers.execute import worker_error_record
from workers.runtask import RunTask
from workers.spend import CAMPAIGN_SCOPE

log = structlog.get_logger("irbench.celery")

RecordsFor = Callable[[Sequence[RunTask], str, dict[str, str] | None], list[RunRecord]]

SCAN_RUNS = 65536  # plan positions read from the bitmaps per step of the window's cursor
CLOSE_CHUNK = 4096  # never-sent runs recorded closed per store write


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
        self.handled = RunBitmap(len(ctx.plan))  # sent, out at start, or recorded closed
        self._next = 0  # the window's cursor: every plan index below it is handled or not pending
        self.known = KnownRuns()
        self._closed: set[str] = set()  # models whose never-sent runs are recorded
        self._all_closed = False
        self._spend_capped = ctx.plan.spend_capped()
        self.poisoned: list[str] = []

    def start(self) -> None:
        """Note what Redis has out already (queued or running runs of an earlier orchestrator):
        the window skips those runs (the rest are sent)."""
        self.known = self._ctx.call(lambda: known_runs(self._ctx.state), "reading the campaign state")

    def forget_known(self) -> None:
        """Redis restarted: what it knew at start is gone, those runs are sent when their window comes."""
        self.known.clear()

    @property
    def unsent(self) -> bool:
        """Whether some pending run is not sent yet."""
        return self._next < len(self._ctx.plan)

    def close_unsendable(self) -> None:
        """Never-dispatched runs of a cancelled campaign, an unavailable model or a spend cap
        reached: recorded here (``cancelled`` with the reason, no call) so every planned run has
        a record."""
        reason = self._ctx.call(self._ctx.state.flags.cancel_reason, "reading the cancel flag")
        if reason is not None and not self._all_closed:
            self._close(None, reason, None)
            self._all_closed = True
        self._close_models(self._unavailable)
        if self._spend_capped and not self._all_closed:
            closed = self._ctx.call(self._ctx.state.spend.closed, "reading the spend cap")
            if CAMPAIGN_SCOPE in closed:
                self._close(None, closed[CAMPAIGN_SCOPE], None)
                self._all_closed = True
            self._close_models(closed)

    def _close_models(self, closed: dict[str, str]) -> None:
        """Record the never-dispatched runs of the models in ``closed`` (model -> reason), once."""
        new = {m: why for m, why in closed.items() if m in self._ctx.plan.models and m not in self._closed}
        if new and not self._all_closed:
            self._closed |= set(new)
            self._close({self._ctx.plan.models.index(m) for m in new}, "", new)

    def _close(self, models: set[int] | None, reason: str, by_model: dict[str, str] | None) -> None:
        """Record the pending, never-sent runs of ``models`` (positions; None: every model)."""
        plan, n = self._ctx.plan, len(self._ctx.plan)
        for start in range(self._next, n, SCAN_RUNS):
            stop = min(start + SCAN_RUNS, n)
            idx = np.flatnonzero(self._tracker.pending_mask(start, stop) & ~self.handled.mask(start, stop)) + start
            if models is not None:
                idx = idx[np.isin(plan.model_positions(idx), list(models))]
            for k in range(0, idx.size, CLOSE_CHUNK):
                chunk = idx[k:k + CLOSE_CHUNK]
                self.handled.add(chunk)
                tasks = [plan.task(int(i)) for i in chunk]
                self._store_final(self._closed_records(tasks, reason, by_model), chunk)

    def _window(self, room: int) -> list[RunTask]:
        """Up to ``room`` pending runs from the cursor on, in plan order, as tasks noted out; a
        run Redis had out at start is noted out, not sent (:meth:`_out_at_start`)."""
        plan, n, tracker = self._ctx.plan, len(self._ctx.plan), self._tracker
        out: list[RunTask] = []
        earlier: dict[str, int] = {}
        while len(out) < room and self._next < n:
            stop = min(self._next + SCAN_RUNS, n)
            idx = np.flatnonzero(tracker.pending_mask(self._next, stop) & ~self.handled.mask(self._next, stop))
            take = (idx + self._next)[: room - len(out)]
            self._next = int(take[-1]) + 1 if take.size and take.size < idx.size else stop
            self.handled.add(take)
            for i in take.tolist():
                task = plan.task(i)
                plan.inflight[task.run_id] = i
                if task.run_id in self.known.busy:
                    self.known.busy.discard(task.run_id)
                    earlier[task.run_id] = i
                else:
                    out.append(task)
        if earlier:
            self._out_at_start(earlier)
        return out

    def _out_at_start(self, runs: dict[str, int]) -> None:
        """``runs`` (run_id -> index) were out when this orchestrator started; those done since
        (their done-log entry came before they were noted out) are announced, so the store
        confirms them or completion sends them again."""
        state = self._ctx.state
        done = self._ctx.call(lambda: state.done.among(runs), "reading done markers")
        for rid in done:
            self._ctx.plan.settled(rid)
        self._tracker.announce([runs[r] for r in done])

    def dispatch(self) -> int:
        """Publish due deferred runs, then pending runs up to the outstanding window; returns runs sent."""
        ctx, state, options = self._ctx, self._ctx.state, self._ctx.options
        sent = 0
        ahead = options.poll_interval_s  # due before the next look: sent now, with the rest as countdown
        due = ctx.call(lambda: state.delayed.pop_due(options.dispatch_batch * 10, ahead), "moving due runs")
        if due:
            tasks = self.drop_poisoned(self.pending_out(due))
            self._publisher.send(tasks, self._tracker.pending_count, countdown_s=due)
            sent += len(tasks)
        if self.unsent and not self._all_closed:
            room = max(ctx.window_runs - ctx.call(state.outstanding, "counting outstanding runs"), 0)
            batch = self._window(room) if room else []
            self._publisher.send(batch, self._tracker.pending_count)
            sent += len(batch)
        return sent

    def pending_out(self, run_ids: Iterable[str]) -> list[int]:
        """The plan indices of ``run_ids`` that are out (this orchestrator's) and still pending;
        another orchestrator's runs are left to it (or to this one's window, when it gets there)."""
        found = (self._ctx.plan.index_of(r) for r in run_ids)
        return [i for i in found if i is not None and self._tracker.is_pending(i)]

    def pause_s(self) -> float:
        """The loop's sleep: ``poll_interval_s``, or less when a deferred run falls due sooner, so
        a run whose rate slot is reserved goes out at its slot (late runs would arrive together)."""
        due = self._ctx.call(self._ctx.state.delayed.next_due_in_s, "reading the next due run")
        if due is None:
            return self._ctx.options.poll_interval_s
        return min(self._ctx.options.poll_interval_s, max(due, 0.002))

    def drop_poisoned(self, indices: list[int]) -> list[RunTask]:
        """Store ``worker_error`` for runs that failed ``max_task_failures`` times; the tasks of
        the rest (noted out)."""
        keep = []
        for task, i in zip(self._ctx.plan.out(indices), indices):
            n, text = self._ctx.call(partial(self._ctx.state.claims.failures, task.run_id), "reading failures")
            if n >= self._ctx.options.max_task_failures:
                self._poison(task, i, n, text)
            else:
                keep.append(task)
        return keep

    def _poison(self, task: RunTask, i: int, failures: int, text: str | None) -> None:
        record = worker_error_record(task, f"{failures} task failures; last: {text or 'unknown'}")
        self._store_final([record], np.array([i]))
        self.poisoned.append(task.run_id)
        log.warning("run_poisoned", campaign=self._ctx.campaign, run_id=task.run_id, model=task.model,
                    failures=failures, error=text)

    def _store_final(self, records: Sequence[RunRecord], indices: np.ndarray) -> None:
        """Records the orchestrator itself stores (never sent, or poison) for the runs of plan
        ``indices``: durable, then done."""
        if not records:
            return
        self._store.write(records)
        state = self._ctx.state
        for r in records:
            self._ctx.plan.settled(r.run_id)
            self._ctx.call(partial(state.done.mark, r.run_id, r.model, r.outcome.value, True, len(r.attempts),
                                   self._ctx.dispatch),
                           "marking done")
        self._tracker.announce(indices)
