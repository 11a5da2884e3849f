"""Which planned runs of a distributed campaign are still pending, and whether every one is stored.

The tracker reads Redis's done log from a cursor (O(runs finished since its last look)) and
verifies the store once the log covers every pending run, with an incremental file cursor
(``StoreCursor``): a done run whose record never shows up (lost) is pending again and sent again.
The whole store is read once, at start (what is stored already; with ``--retry-failed``, which
stored runs go again); later looks read only the files published since.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

import structlog

from orchestrator.campaign.retry import retryable_tasks
from orchestrator.distributed.context import CampaignContext
from orchestrator.distributed.publisher import Publisher
from orchestrator.distributed.store_cursor import StoreCursor
from storage.parquet.spool import recover_orphans
from storage.outcomes import Outcome
from storage.runs import RunStore
from workers.runtask import RunTask

log = structlog.get_logger("irbench.celery")


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
        self.cursor = StoreCursor(store, ctx.campaign, follow_store)
        # the one read of the whole store, at start (resume): later looks read new files only
        self.cursor.refresh()
        latest = self.cursor.latest()
        by_id = ctx.by_id
        rows = list(zip(*(latest.column(c).to_pylist() for c in ("run_id", "execution_id", "outcome"))))
        outcome_of = {r: o for r, _, o in rows if r in by_id}
        # the same selection as the local executor and ``status`` (cancelled runs of closed models stay)
        chosen = {t.run_id for t in retryable_tasks(by_id.values(), outcome_of,
                                                     frozenset(Outcome(o) for o in retry_outcomes))}
        self.again = {r: e for r, e, _ in rows if r in chosen}
        self.stored_at_start = (self.cursor.run_ids & set(by_id)) - set(self.again)
        self._pending = {rid: t for rid, t in by_id.items() if rid not in self.stored_at_start}
        self._unverified: set[str] = set()  # done per Redis, not yet seen in the store
        self._done_cursor = 0
        self._stale_done_until = 0  # set when the retried runs are reopened (reopen_retried)
        self._all_done_at: float | None = None  # when the done log covered every pending run
        self._orphans_at = 0.0
        self._cursor_at = 0.0  # the last store look while runs were still pending

    @property
    def pending(self) -> Mapping[str, RunTask]:
        """run_id -> task of the runs not yet announced done (read only)."""
        return self._pending

    def reopen_retried(self) -> None:
        """Drop the retried runs' done markers, the cancel flag and 'disabled' closures that would
        only cancel them again (a retired model stays closed: its runs are recorded cancelled)."""
        if not self.again:
            return
        self._ctx.call(self._reopen_retried, "reopening retried runs")

    def _reopen_retried(self) -> None:
        state, by_id = self._ctx.state, self._ctx.by_id
        state.done.reopen({r: by_id[r].model for r in self.again})
        # done-log entries before this position announce the earlier executions (nothing of a
        # retried run is dispatched yet): completion skips them for the retried runs
        self._stale_done_until = state.done.log_length()
        state.flags.clear_cancel()
        state.flags.reopen_disabled({by_id[r].model for r in self.again})

    def restart_log(self) -> None:
        """Redis restarted: its done log was rebuilt from the AOF, read it again from the start."""
        self._done_cursor = 0

    def stored(self, run_id: str) -> bool:
        """In the store; a retried run only with an execution newer than the one it had."""
        execs = self.cursor.executions.get(run_id)
        if not execs:
            return False
        return run_id not in self.again or bool(execs - {self.again[run_id]})

    def check(self) -> bool:
        """Read the done log since the last look; once it covers every pending run, verify the
        store (new files only: the cursor also reads new files every ``reconcile_interval_s``
        while runs are pending). True when every planned run has a stored record."""
        self._follow_done_log()
        now = self._ctx.clock()
        if self._pending:
            # keep the store cursor current while runs finish, so the look at the end reads only the
            # last files: one look over a 100k-run store (2,308 files) took 20 s and 480 MiB
            if now - self._cursor_at >= self._ctx.options.reconcile_interval_s:
                self._cursor_at = now
                self.cursor.refresh()
            return False
        if self._all_done_at is None:
            self._all_done_at = now
        self.cursor.refresh()
        self._unverified = {r for r in self._unverified if not self.stored(r)}
        if not self._unverified:
            # killed workers' spools: the calls they had in flight become worker_died executions
            # (older than the runs' stored ones, so nothing above changes)
            recover_orphans(self._store.dataset)
            return True
        self._verify(now, now - self._all_done_at)
        return not self._pending and not self._unverified

    def _follow_done_log(self) -> None:
        state = self._ctx.state
        while True:
            ids, self._done_cursor = self._ctx.call(lambda: state.done.since(self._done_cursor), "reading done runs")
            if not ids:
                break
            first = self._done_cursor - len(ids)
            for i, rid in enumerate(ids):
                if rid in self.again and first + i < self._stale_done_until:
                    continue  # a retried run's earlier execution, not the retry
                if self._pending.pop(rid, None) is not None:
                    self._unverified.add(rid)

    def _verify(self, now: float, waited: float) -> None:
        """Done runs not in the store ``waited`` seconds after the log covered every run: a
        killed worker's spool is published (from a quarter of ``verify_grace_s`` on); past the
        grace, the rest is lost and sent again."""
        grace_s = self._ctx.options.verify_grace_s
        if waited >= grace_s / 4 and now - self._orphans_at >= 1.0:
            self._orphans_at = now
            if recover_orphans(self._store.dataset):  # a killed worker's spool: durable, acked
                self.cursor.refresh()
                self._unverified = {r for r in self._unverified if not self.stored(r)}
        if self._unverified and waited >= grace_s:
            lost = sorted(self._unverified)
            log.warning("done_runs_missing_from_store", campaign=self._ctx.campaign, runs=len(lost))
            self._ctx.call(lambda: self._ctx.state.done.undo(lost), "forgetting lost done markers")
            for rid in lost:
                self._pending[rid] = self._ctx.by_id[rid]
            self._unverified.clear()
            self._all_done_at = None
            self._publisher.resend([self._ctx.by_id[r] for r in lost], "missing_from_store")

    def executed(self) -> tuple[int, dict[str, dict[str, int]]]:
        """Runs stored since the start, and per model outcome -> runs (the latest execution of each)."""
        table = self.cursor.latest()
        by_model: dict[str, Counter[str]] = {}
        executed = 0
        for rid, model, outcome in zip(*(table.column(c).to_pylist() for c in ("run_id", "model", "outcome"))):
            if rid in self.again and not self.stored(rid):
                continue  # retried, but no newer execution stored (yet): not this call's
            if rid in self._ctx.by_id and rid not in self.stored_at_start:
                executed += 1
                by_model.setdefault(model, Counter())[outcome] += 1
        return executed, {m: dict(c) for m, c in by_model.items()}
