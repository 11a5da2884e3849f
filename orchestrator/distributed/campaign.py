"""One distributed campaign run by the orchestrator: dispatch, progress, completion, reconcile, cancel.

Every per-iteration cost grows with the work done since the last iteration, never with the
campaign or the store:

* **dispatch** publishes pending runs (task id = run_id, models interleaved) while fewer than
  ``max_outstanding`` are queued or running, and re-publishes deferred runs whose time has come
  (``CampaignState.pop_due``: the delayed set is ours, in Redis, not countdown messages inside
  workers that can die; a run due before the next look, at most ``poll_interval_s`` ahead, goes
  out with the remainder as a countdown, so a reserved rate slot is met exactly);
* **progress** comes from the campaign's Redis counters (O(models));
* **completion** reads the done log from a cursor (O(runs finished since)), then verifies the
  store once at the end with an incremental file cursor (``StoreCursor``): a done run whose
  record never shows up (lost) is sent again;
* **reconcile** (every ``reconcile_interval_s``) re-sends a running run whose claim expired (its
  worker died or stalled past ``claim_ttl_s``: recovery within ~claim TTL + interval) and a
  queued run the broker has lost (a Redis restart); after a Redis restart (its
  ``run_id`` changed) it re-sends every pending run Redis does not know. A run that failed
  ``max_task_failures`` times (its task raised or its worker died) is stored as ``worker_error``
  with the failure text and never sent again;
* **cancel** records never-dispatched runs ``cancelled`` (workers record the rest).

Side effects go through an injected :class:`Bundle` (clock, Redis, broker, store).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
import structlog
from celery import Celery

from orchestrator.campaign.prepared import PreparedCampaign
from orchestrator.distributed.options import CeleryOptions
from orchestrator.local.executor import ExecutionSummary, ModelProgress
from orchestrator.distributed.message_size import AUTO, MessageSizer
from orchestrator.distributed.store_cursor import StoreCursor
from storage.clock import utc_now
from storage.records import RunRecord
from storage.runs import RunStore
from storage.parquet.spool import recover_orphans
from workers.state.broker_view import RUN_IDS_HEADER, unacked_ids, waiting_ids
from workers.state.campaign_state import META_FIELDS, CampaignState
from workers.celery.message import encode_runs
from workers.state.presence import read_presence
from workers.state.redis_retry import with_retry
from workers.celery.tasks import RUN_TASK_NAME, RUNS_TASK_NAME
from workers.execute import worker_error_record
from workers.runtask import RunTask

log = structlog.get_logger("irbench.celery")


@dataclass
class CeleryModelProgress(ModelProgress):
    """``ModelProgress`` plus the completion rate (runs per second, smoothed)."""

    rate_per_s: float = 0.0


CeleryProgressCallback = Callable[[str, ModelProgress], None]
RecordsFor = Callable[[Sequence[RunTask], str, dict[str, str] | None], list[RunRecord]]


@dataclass
class Bundle:
    """What the campaign touches: a monotonic ``clock`` and its ``sleep``, the Redis client of
    the campaign state, the Celery app that publishes (``broker``) and the run ``store``."""

    redis: redis.Redis
    broker: Celery
    store: RunStore
    clock: Callable[[], float]
    sleep: Callable[[float], None]


def progress_from_counts(
    planned: dict[str, int], counts: dict[str, dict[str, int]], running: dict[str, int],
    prev: dict[str, CeleryModelProgress], dt_s: float,
) -> dict[str, CeleryModelProgress]:
    """Per-model progress from the campaign's counters (``CampaignState.counts``)."""
    out = {}
    for model, total in planned.items():
        c = counts.get(model, {})
        done = sum(v for k, v in c.items() if k not in META_FIELDS)
        old = prev.get(model)
        inst = (done - old.done) / dt_s if old is not None and dt_s > 0 else 0.0
        rate = inst if old is None else 0.7 * old.rate_per_s + 0.3 * inst
        out[model] = CeleryModelProgress(
            total=total, done=done, in_flight=running.get(model, 0),
            failed=max(c.get("_failed", 0) - c.get("cancelled", 0), 0), cancelled=c.get("cancelled", 0),
            outcomes=Counter({k: v for k, v in c.items() if k not in META_FIELDS}), rate_per_s=rate,
        )
    return out


@dataclass
class _Clocks:
    reconcile: float = 0.0
    poll: float = 0.0
    all_done: float | None = None  # when the done log covered every pending run
    orphans: float = 0.0
    cursor: float = 0.0  # the last store look while runs were still pending


@dataclass
class DistributedCampaign:
    """Drive one campaign to completion on the workers (see the module docstring).

    ``closed_records(tasks, reason, by_model)`` builds the records of runs never sent (cancelled
    or unavailable; ``orchestrator.distributed.executor`` passes one); ``unavailable`` maps the
    models closed for availability to the reason. ``retry_outcomes`` (``--retry-failed``):
    outcome values whose runs go again; each such run is done once a newer execution is stored.
    """

    prepared: PreparedCampaign
    bundle: Bundle
    options: CeleryOptions
    closed_records: RecordsFor
    unavailable: dict[str, str] = field(default_factory=dict)
    on_progress: CeleryProgressCallback | None = None
    retry_outcomes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        b = self.bundle
        self.campaign = self.prepared.spec.name
        self.state = CampaignState(b.redis, self.campaign)
        self.cursor = StoreCursor(b.store, self.campaign)
        self.by_id = {t.run_id: t for t in self.prepared.tasks}
        self.planned = dict(Counter(t.model for t in self.prepared.tasks))
        self.progress: dict[str, CeleryModelProgress] = {}
        self._clocks = _Clocks()
        self._done_cursor = 0
        self._redis_run_id: str | None = None
        self._today = utc_now().date()
        self.deadline: float | None = None
        self.resent = Counter[str]()  # why runs were published again: lost, claim_expired, ...
        self.poisoned: list[str] = []
        # the one read of the whole store, at start (resume): later looks read new files only
        self.cursor.refresh()
        latest = self.cursor.latest()
        self.again = {r: e for r, e, o in zip(*(latest.column(c).to_pylist() for c in ("run_id", "execution_id", "outcome")))
                      if r in self.by_id and o in self.retry_outcomes}
        self.stored_at_start = (self.cursor.run_ids & set(self.by_id)) - set(self.again)
        self._stale_done_until = 0  # set when the retried runs are reopened (start)
        self.remaining = {rid: t for rid, t in self.by_id.items() if rid not in self.stored_at_start}
        self.unverified: set[str] = set()  # done per Redis, not yet seen in the store
        self.to_send: list[RunTask] = []
        self.sizer = MessageSizer(lambda: read_presence(b.redis), self.options.queue, b.clock)
        self.message_sizes = Counter[int]()  # runs per message -> messages sent (first sends)

    # ------------------------------------------------------------------ helpers
    def _redis(self, fn, what: str):
        budget = None if self.deadline is None else max(0.0, self.deadline - self.bundle.clock())
        return with_retry(fn, what, budget_s=budget, max_backoff_s=self.options.redis_backoff_max_s,
                          sleep=self.bundle.sleep, clock=self.bundle.clock)

    def _publish(self, tasks: Sequence[RunTask], why: str | None = None,
                 countdown_s: dict[str, float] | None = None) -> None:
        """Record then publish (a kill between the two leaves queued entries that the reconciler
        finds missing from the broker and re-sends). Each message carries ``measured_on`` = the
        UTC dispatch date, so every redelivery of a run writes to the same partition."""
        if not tasks:
            return
        stamped = [t if t.measured_on is not None else t.model_copy(update={"measured_on": self._today})
                   for t in tasks]
        root = str(self.bundle.store.root)
        k = 1 if why is not None else self._runs_per_message()
        step = self.options.dispatch_batch * k  # dispatch_batch messages per producer round
        for i in range(0, len(stamped), step):
            batch = stamped[i : i + step]
            messages = self._messages(batch, k, countdown_s or {})

            def send(batch: list[RunTask] = batch, messages: list[tuple[list[RunTask], float]] = messages) -> None:
                self.state.record_dispatch(t.run_id for t in batch)
                with self.bundle.broker.producer_or_acquire() as producer:
                    for group, wait in messages:
                        self._send(producer, group, root, wait)

            self._redis(send, "dispatching")  # retried whole: counted once, below
            if why is None:
                self.message_sizes.update(len(group) for group, wait in messages if not wait)
        if why:
            self.resent[why] += len(stamped)
            log.info("runs_resent", campaign=self.campaign, why=why, runs=len(stamped))

    def _runs_per_message(self) -> int:
        """``runs_per_message``, or with 0 (auto) the size ``orchestrator.distributed.message_size`` picks
        for the live workers and the outstanding window (or the runs left, if fewer)."""
        if self.options.runs_per_message != AUTO:
            return self.options.runs_per_message
        return self.sizer.size(min(self.options.max_outstanding, len(self.remaining)))

    def _messages(self, batch: list[RunTask], k: int, countdown_s: dict[str, float]
                  ) -> list[tuple[list[RunTask], float]]:
        """``batch`` as broker messages: groups of up to ``k`` runs in dispatch order (``k`` is
        1 for re-sent runs); a run with a countdown alone. The plan interleaves
        the models, so a message holds runs of several models, whose permits do not compete,
        and the worker runs them concurrently: a model waiting on its limit holds one run slot
        per waiting run, never the others' runs."""
        alone = [([t], countdown_s[t.run_id]) for t in batch if countdown_s.get(t.run_id, 0.0) > 0.001]
        rest = [t for t in batch if countdown_s.get(t.run_id, 0.0) <= 0.001]
        return alone + [(rest[i : i + k], 0.0) for i in range(0, len(rest), k)]

    def _send(self, producer: Any, group: list[RunTask], root: str, wait_s: float) -> None:
        # argsrepr: Celery's default is a saferepr of the whole task JSON, ~a quarter of the
        # dispatch CPU; the run ids say enough
        ids = [t.run_id for t in group]
        common = {"queue": self.options.queue, "producer": producer, "countdown": wait_s if wait_s > 0.001 else None,
                  "argsrepr": repr(ids), "kwargsrepr": "{}"}
        if len(group) == 1:
            self.bundle.broker.send_task(RUN_TASK_NAME, args=(group[0].model_dump(mode="json"), root),
                                         task_id=group[0].run_id, **common)
        else:  # the run ids ride in a header too: the reconciler's broker listing reads them (broker_view)
            self.bundle.broker.send_task(RUNS_TASK_NAME, args=(encode_runs(group), root),
                                         task_id=f"{ids[0]}+{len(ids) - 1}", headers={RUN_IDS_HEADER: ids}, **common)

    def _store_closed(self, tasks: Sequence[RunTask], reason: str, by_model: dict[str, str] | None = None) -> None:
        records = self.closed_records(tasks, reason, by_model)
        self._store_final(records)

    def _store_final(self, records: Sequence[RunRecord]) -> None:
        """Records the orchestrator itself stores (never sent, or poison): durable, then done."""
        if not records:
            return
        self.bundle.store.write(records)
        for r in records:
            self._redis(lambda r=r: self.state.mark_done(r.run_id, r.model, r.outcome.value, True, len(r.attempts)),
                        "marking done")

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        """Write the plan and decide what to send: pending runs Redis does not know (the rest
        are queued, running, deferred or done from an earlier orchestrator)."""
        self._redis(lambda: self.state.set_planned(self.planned), "writing the plan")
        if self.again:
            self._redis(self._reopen_for_retry, "reopening retried runs")
        self._redis_run_id = self._redis(self._server_id, "reading the server id")
        known = self._redis(lambda: self.state.known(self.remaining), "reading the campaign state")
        self.to_send = [t for rid, t in self.remaining.items() if rid not in known]
        log.info("celery_campaign_start", campaign=self.campaign, planned=len(self.by_id),
                 pending=len(self.remaining), to_send=len(self.to_send))

    def _reopen_for_retry(self) -> None:
        """Drop the retried runs' done markers, the cancel flag and 'disabled' closures that would
        only cancel them again (a retired model stays closed: its runs are recorded cancelled)."""
        self.state.reopen({r: self.by_id[r].model for r in self.again})
        # done-log entries before this position announce the earlier executions (nothing of a
        # retried run is dispatched yet): completion skips them for the retried runs
        self._stale_done_until = int(self.state.client.llen(self.state.key("donelog")))
        self.state.clear_cancel()
        for model in {self.by_id[r].model for r in self.again}:
            reason = self.state.client.hget(self.state.key("gate"), model)
            if reason is not None and (reason.decode() if isinstance(reason, bytes) else reason).startswith("disabled"):
                self.state.client.hdel(self.state.key("gate"), model)
                self.state.client.hdel(self.state.key("streak"), model)

    def _stored(self, run_id: str) -> bool:
        """In the store; a retried run only with an execution newer than the one it had."""
        execs = self.cursor.executions.get(run_id)
        if not execs:
            return False
        return run_id not in self.again or bool(execs - {self.again[run_id]})

    def _server_id(self) -> str:
        return str(self.bundle.redis.info("server").get("run_id", ""))

    # ------------------------------------------------------------------ the five concerns
    def cancel(self) -> None:
        """Never-dispatched runs of a cancelled campaign or an unavailable model: recorded here
        (``cancelled`` with the reason, no call) so every planned run has a record."""
        reason = self._redis(self.state.cancel_reason, "reading the cancel flag")
        if reason is not None and self.to_send:
            self._store_closed(self.to_send, reason)
            self.to_send = []
        if self.unavailable and self.to_send:
            skip = [t for t in self.to_send if t.model in self.unavailable]
            if skip:
                self._store_closed(skip, "", {m: self.unavailable[m] for m in {t.model for t in skip}})
                self.to_send = [t for t in self.to_send if t.model not in self.unavailable]

    def dispatch(self) -> int:
        """Publish due deferred runs, then pending runs up to the outstanding window."""
        sent = 0
        ahead = self.options.poll_interval_s  # due before the next look: sent now, with the rest as countdown
        due = self._redis(lambda: self.state.pop_due(self.options.dispatch_batch * 10, ahead), "moving due runs")
        if due:
            tasks = [self.by_id[r] for r in due if r in self.by_id]
            tasks = self._drop_poisoned(tasks)
            self._publish(tasks, countdown_s=due)
            sent += len(tasks)
        if self.to_send:
            room = self.options.max_outstanding - self._redis(self.state.outstanding, "counting outstanding runs")
            batch, self.to_send = self.to_send[: max(room, 0)], self.to_send[max(room, 0) :]
            batch = [t for t in batch if t.run_id in self.remaining]
            self._publish(batch)
            sent += len(batch)
        return sent

    def _drop_poisoned(self, tasks: list[RunTask]) -> list[RunTask]:
        """Store ``worker_error`` for runs that failed ``max_task_failures`` times; keep the rest."""
        keep = []
        for t in tasks:
            n, text = self._redis(lambda t=t: self.state.failures(t.run_id), "reading failures")
            if n >= self.options.max_task_failures:
                self._poison(t, n, text)
            else:
                keep.append(t)
        return keep

    def _poison(self, task: RunTask, failures: int, text: str | None) -> None:
        record = worker_error_record(task, f"{failures} task failures; last: {text or 'unknown'}")
        self._store_final([record])
        self.poisoned.append(task.run_id)
        log.warning("run_poisoned", campaign=self.campaign, run_id=task.run_id, model=task.model,
                    failures=failures, error=text)

    def show_progress(self) -> None:
        """Per-model progress from the Redis counters, to ``on_progress``."""
        now = self.bundle.clock()
        counts = self._redis(self.state.counts, "reading counters")
        running = self._redis(self.state.running_by_model, "reading in-flight runs")
        self.progress = progress_from_counts(self.planned, counts, running, self.progress, now - self._clocks.poll)
        self._clocks.poll = now
        if self.on_progress:
            for m, p in self.progress.items():
                self.on_progress(m, p)

    def completion(self) -> bool:
        """Read the done log since the last look; once it covers every pending run, verify the
        store (new files only: the cursor also reads new files every ``reconcile_interval_s``
        while runs are pending). True when every planned run has a stored record."""
        while True:
            ids, self._done_cursor = self._redis(lambda: self.state.done_since(self._done_cursor), "reading done runs")
            if not ids:
                break
            first = self._done_cursor - len(ids)
            for i, rid in enumerate(ids):
                if rid in self.again and first + i < self._stale_done_until:
                    continue  # a retried run's earlier execution, not the retry
                if self.remaining.pop(rid, None) is not None:
                    self.unverified.add(rid)
        now = self.bundle.clock()
        if self.remaining:
            # keep the store cursor current while runs finish, so the look at the end reads only the
            # last files: one look over a 100k-run store (2,308 files) took 20 s and 480 MiB
            if now - self._clocks.cursor >= self.options.reconcile_interval_s:
                self._clocks.cursor = now
                self.cursor.refresh()
            return False
        if self._clocks.all_done is None:
            self._clocks.all_done = now
        self.cursor.refresh()
        self.unverified = {r for r in self.unverified if not self._stored(r)}
        if not self.unverified:
            return True
        waited = now - self._clocks.all_done
        if waited >= self.options.verify_grace_s / 4 and now - self._clocks.orphans >= 1.0:
            self._clocks.orphans = now
            if recover_orphans(self.bundle.store.dataset):  # a killed worker's spool: durable, acked
                self.cursor.refresh()
                self.unverified = {r for r in self.unverified if not self._stored(r)}
        if self.unverified and waited >= self.options.verify_grace_s:
            lost = sorted(self.unverified)
            log.warning("done_runs_missing_from_store", campaign=self.campaign, runs=len(lost))
            self._redis(lambda: self.state.undo_done(lost), "forgetting lost done markers")
            for rid in lost:
                self.remaining[rid] = self.by_id[rid]
            self.unverified.clear()
            self._clocks.all_done = None
            self._publish([self.by_id[r] for r in lost], "missing_from_store")
        return not self.remaining and not self.unverified

    def reconcile(self) -> int:
        """Re-send runs whose worker died (claim expired) or that the broker lost; after a Redis
        restart, every pending run Redis does not know. Returns runs re-sent."""
        now = self.bundle.clock()
        if now - self._clocks.reconcile < self.options.reconcile_interval_s:
            return 0
        self._clocks.reconcile = now
        resent = 0
        server = self._redis(self._server_id, "reading the server id")
        if server != self._redis_run_id:
            self._redis_run_id = server
            known = self._redis(lambda: self.state.known(self.remaining), "reading the campaign state")
            self._done_cursor = 0  # the log was rebuilt from the AOF: read it again
            sending = {t.run_id for t in self.to_send}
            lost = [t for rid, t in self.remaining.items() if rid not in known and rid not in sending]
            self._publish(lost, "redis_restart")
            resent += len(lost)
        running = self._redis(self.state.running, "reading running runs")
        if running:
            dead = self._redis(lambda: self.state.lost_running(running), "finding dead claims")
            tasks = [self.by_id[r] for r in dead if r in self.remaining]
            tasks = self._drop_poisoned(tasks)
            self._publish(tasks, "claim_expired")
            resent += len(tasks)
        resent += self._resend_missing_from_broker()
        return resent

    def _resend_missing_from_broker(self) -> int:
        queued = self._redis(self.state.queued, "reading queued runs")
        if not queued:
            return 0
        now_r = self._redis(self.state.now_s, "reading the Redis clock")
        ttl = self.options.claim_ttl_s
        old = {r: s for r, s in queued.items() if s < now_r - ttl and r in self.remaining}
        if not old:
            return 0
        client = self.bundle.redis
        waiting = self._redis(lambda: waiting_ids(client, self.options.queue), "listing the broker queue")
        unacked = self._redis(lambda: unacked_ids(client), "listing unacknowledged messages")
        # in a worker's hands but never claimed for 3 TTLs: that worker is gone (its prefetch)
        lost = [self.by_id[r] for r, s in old.items()
                if r not in waiting and (r not in unacked or s < now_r - 3 * ttl)]
        self._publish(lost, "missing_from_broker")
        return len(lost)

    # ------------------------------------------------------------------ the loop
    def run(self, timeout_s: float | None = None) -> ExecutionSummary:
        """Drive the campaign until every planned run is stored (or ``timeout_s`` passes:
        ``interrupted=True``, the workers carry on). The summary counts runs stored during
        this call, per model and outcome (the latest execution of each)."""
        clock = self.bundle.clock
        self.deadline = None if timeout_s is None else clock() + timeout_s
        interrupted = False
        self.start()
        self._clocks.reconcile = clock()
        try:
            while True:
                if self.deadline is not None and clock() > self.deadline:
                    interrupted = True
                    break
                self.cancel()
                self.dispatch()
                self.show_progress()
                if self.completion():
                    break
                self.reconcile()
                self.bundle.sleep(self._pause_s())
        except KeyboardInterrupt:
            interrupted = True
        if not interrupted:
            self.show_progress()
        return self.summary(interrupted)

    def _pause_s(self) -> float:
        """The loop's sleep: ``poll_interval_s``, or less when a deferred run falls due sooner, so
        a run whose rate slot is reserved goes out at its slot (late runs would arrive together)."""
        due = self._redis(self.state.next_due_in_s, "reading the next due run")
        if due is None:
            return self.options.poll_interval_s
        return min(self.options.poll_interval_s, max(due, 0.002))

    def summary(self, interrupted: bool) -> ExecutionSummary:
        table = self.cursor.latest()
        by_model: dict[str, Counter[str]] = {}
        executed = 0
        for rid, model, outcome in zip(*(table.column(c).to_pylist() for c in ("run_id", "model", "outcome"))):
            if rid in self.again and not self._stored(rid):
                continue  # retried, but no newer execution stored (yet): not this call's
            if rid in self.by_id and rid not in self.stored_at_start:
                executed += 1
                by_model.setdefault(model, Counter())[outcome] += 1
        log.info("celery_campaign_end", campaign=self.campaign, executed=executed, interrupted=interrupted,
                 resent=dict(self.resent), poisoned=len(self.poisoned), files_read=self.cursor.files_read,
                 runs_per_message={str(k): n for k, n in sorted(self.message_sizes.items())})
        return ExecutionSummary(executed=executed, by_model={m: dict(c) for m, c in by_model.items()},
                                interrupted=interrupted)
