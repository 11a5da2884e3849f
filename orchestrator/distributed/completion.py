"""Which planned runs of a distributed campaign are still pending, and whether every one is stored.

State is kept as bitmaps of plan indices (``RunBitmap``), never as sets of run ids: ``todo`` (the
runs this call has to see stored: not stored at start, or retried), ``done`` (announced done by
the done log, or seen stored) and ``stored`` (a counting execution seen in the store). A 10**7-run
plan costs 3.75 MB of them. The done log's run ids map back to indices through the runs out
(``PlanView.inflight``); the store's rows through their axes (``PlanView.locate``).

The tracker reads Redis's done log from a cursor (O(runs finished since its last look)) and
verifies the store once the log covers every pending run, with an incremental file cursor
(``StoreCursor``): a done run whose record never shows up (lost) is pending again and sent again.
The whole store is read once, at start (what is stored already; with ``--retry-failed``, which
stored runs go again); later looks read only the files published since.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import structlog

from orchestrator.campaign.plan_state import LatestRuns, retryable_mask
from orchestrator.campaign.run_bitmap import RunBitmap
from orchestrator.distributed.context import CampaignContext
from orchestrator.distributed.executed_tally import ExecutedTally
from orchestrator.distributed.publisher import Publisher
from orchestrator.distributed.store_cursor import PLAN_INDEX, StoreCursor
from storage.parquet.spool import recover_orphans
from storage.outcomes import Outcome
from storage.runs import RunStore

log = structlog.get_logger("irbench.celery")


def _column(table: pa.Table, name: str) -> np.ndarray:
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False))


class CompletionTracker:
    """Pending runs of one campaign, followed to a stored record.

    ``retry_outcomes`` (``--retry-failed``): outcome values whose stored runs go again; each
    such run is done once a newer execution is stored. Lost runs go back through ``publisher``.
    ``follow_store``: called before each store look (a bucket store's mirror fetching new uploads).
    """

    def __init__(self, ctx: CampaignContext, store: RunStore, publisher: Publisher,
                 retry_outcomes: frozenset[str] = frozenset(), follow_store: Callable[[], object] | None = None) -> None:
        self._ctx = ctx
        self._store = store
        self._publisher = publisher
        n = len(ctx.plan)
        self.cursor = StoreCursor(store, ctx.campaign, follow_store, locate=ctx.plan.locate)
        # the one read of the whole store, at start (resume): later looks read new files only
        self.cursor.refresh()
        latest = self.cursor.latest()
        index = _column(latest, PLAN_INDEX).astype(np.int64)
        keep = np.flatnonzero(index >= 0)
        order = keep[np.argsort(index[keep], kind="stable")]
        runs = LatestRuns(index[order], _column(latest, "outcome").astype(object)[order])
        # the same selection as the local executor and ``status`` (cancelled runs of closed models stay)
        chosen = order[retryable_mask(ctx.plan, runs, frozenset(Outcome(o) for o in retry_outcomes))]
        self.again = dict(zip(index[chosen].tolist(), _column(latest, "execution_id").astype(object)[chosen].tolist()))
        self.again_bits = RunBitmap.of(n, index[chosen])
        self.stored_at_start = RunBitmap.of(n, index[keep]).difference(self.again_bits)
        self.todo = RunBitmap.full(n).difference(self.stored_at_start)
        self.done = RunBitmap(n)
        self.stored = self.stored_at_start.copy()
        self.pending_count = self.todo.count()
        self.tally = ExecutedTally(n)
        self.cursor.forget_rows()  # from here on the tally holds what the summary needs
        self._done_cursor = 0
        self._stale_done_until = 0  # set when the retried runs are reopened (reopen_retried)
        self._all_done_at: float | None = None  # when the done log covered every pending run
        self._orphans_at = 0.0
        self._cursor_at = 0.0  # the last store look while runs were still pending

    def pending_mask(self, start: int, stop: int) -> np.ndarray:
        """Which plan indices of ``[start, stop)`` are pending (bool array)."""
        return self.todo.mask(start, stop) & ~self.done.mask(start, stop)

    def is_pending(self, i: int) -> bool:
        return i in self.todo and i not in self.done

    def announce(self, indices: np.ndarray | list[int]) -> int:
        """Note ``indices`` done (their record is durable, or the done log says so); returns how
        many were pending."""
        idx = np.unique(np.asarray(indices, dtype=np.int64))
        if idx.size == 0:
            return 0
        idx = idx[self.todo.test(idx) & ~self.done.test(idx)]
        self.done.add(idx)
        self.pending_count -= int(idx.size)
        return int(idx.size)

    def reopen_retried(self) -> None:
        """Drop the retried runs' done markers, the cancel flag and 'disabled' closures that would
        only cancel them again (a retired model stays closed: its runs are recorded cancelled)."""
        if not self.again:
            return
        self._ctx.call(self._reopen_retried, "reopening retried runs")

    def _reopen_retried(self) -> None:
        state, plan = self._ctx.state, self._ctx.plan
        models = {i: plan.models[int(m)] for i, m in zip(self.again, plan.model_positions(np.array(list(self.again))))}
        state.done.reopen({plan.run_id(i): m for i, m in models.items()})
        # done-log entries before this position announce the earlier executions (nothing of a
        # retried run is dispatched yet): completion skips them for the retried runs
        self._stale_done_until = state.done.log_length()
        state.flags.clear_cancel()
        state.flags.reopen_disabled(set(models.values()))

    def restart_log(self) -> None:
        """Redis restarted: its done log was rebuilt from the AOF, read it again from the start."""
        self._done_cursor = 0

    def _refresh(self) -> None:
        """One store look: the new rows' runs are stored (a retried run: by a newer execution)
        and so done; the runs out among them are out no more. A ``worker_died`` row (a killed
        worker's call in flight, stored by its spool's recovery) is an execution for the
        summary but settles nothing: its run has no done marker, stays pending and out, and the
        reconciler sends it again when its claim expires (``max_task_failures`` makes it poison)."""
        table = self.cursor.refresh()
        if table is None or table.num_rows == 0:
            return
        index = _column(table, PLAN_INDEX).astype(np.int64)
        on = index >= 0
        retried = np.zeros(index.size, dtype=bool)
        retried[on] = self.again_bits.test(index[on])
        counts = on & ~retried
        if retried.any():
            eids = table.column("execution_id").to_pylist()
            for row in np.flatnonzero(retried).tolist():
                counts[row] = eids[row] != self.again[int(index[row])]
        self.tally.add(index[counts], table.filter(pa.array(counts)))
        settles = counts & (_column(table, "outcome") != Outcome.WORKER_DIED.value)
        self.stored.add(index[settles])
        self.announce(index[settles])
        plan = self._ctx.plan
        for rid, settled in zip(table.column("run_id").to_pylist(), settles.tolist()):
            if settled:
                plan.settled(rid)

    def check(self) -> bool:
        """Read the done log since the last look; once it covers every pending run, verify the
        store (new files only: the cursor also reads new files every ``reconcile_interval_s``
        while runs are pending). True when every planned run has a stored record."""
        self._follow_done_log()
        now = self._ctx.clock()
        if self.pending_count:
            # keep the store cursor current while runs finish, so the look at the end reads only the
            # last files: one look over a 100k-run store (2,308 files) took 20 s and 480 MiB
            if now - self._cursor_at >= self._ctx.options.reconcile_interval_s:
                self._cursor_at = now
                self._refresh()
            return False
        if self._all_done_at is None:
            self._all_done_at = now
        self._refresh()
        if not self.unverified().size:
            # killed workers' spools: the calls they had in flight become worker_died executions
            # (older than the runs' stored ones, so nothing above changes)
            recover_orphans(self._store.dataset)
            return True
        self._verify(now, now - self._all_done_at)
        return not self.pending_count and not self.unverified().size

    def unverified(self) -> np.ndarray:
        """Plan indices done per Redis whose record the store does not show yet."""
        return self.done.difference(self.stored).indices()

    def _follow_done_log(self) -> None:
        state, plan = self._ctx.state, self._ctx.plan
        while True:
            ids, self._done_cursor = self._ctx.call(lambda: state.done.since(self._done_cursor), "reading done runs")
            if not ids:
                break
            first = self._done_cursor - len(ids)
            done = []
            for k, rid in enumerate(ids):
                i = plan.index_of(rid)
                if i is None:
                    continue  # not out: seen done already, or another orchestrator's (the store says)
                if first + k < self._stale_done_until and i in self.again_bits:
                    continue  # a retried run's earlier execution, not the retry
                plan.settled(rid)
                done.append(i)
            self.announce(done)

    def _verify(self, now: float, waited: float) -> None:
        """Done runs not in the store ``waited`` seconds after the log covered every run: a
        killed worker's spool is published (from a quarter of ``verify_grace_s`` on); past the
        grace, the rest is lost and sent again."""
        grace_s = self._ctx.options.verify_grace_s
        if waited >= grace_s / 4 and now - self._orphans_at >= 1.0:
            self._orphans_at = now
            if recover_orphans(self._store.dataset):  # a killed worker's spool: durable, acked
                self._refresh()
        lost = self.unverified()
        if lost.size and waited >= grace_s:
            plan = self._ctx.plan
            log.warning("done_runs_missing_from_store", campaign=self._ctx.campaign, runs=int(lost.size))
            ids = [plan.run_id(int(i)) for i in lost]
            self._ctx.call(lambda: self._ctx.state.done.undo(ids), "forgetting lost done markers")
            self.done.discard(lost)
            self.pending_count += int(lost.size)
            self._all_done_at = None
            self._publisher.resend(plan.out(lost.tolist()), "missing_from_store")

    def executed(self) -> tuple[int, dict[str, dict[str, int]]]:
        """Runs stored since the start, and per model outcome -> runs (the latest execution of
        each; a retried run once a newer execution is stored)."""
        return self.tally.summary(self._ctx.plan.models, self._ctx.plan.model_positions)
