"""One distributed campaign run by the orchestrator: a loop over collaborators, one concern each.

Every per-iteration cost grows with the work done since the last iteration, never with the
campaign or the store:

* **cancel** and **dispatch** (``dispatcher.Dispatcher``): never-dispatched runs of a cancelled
  campaign or an unavailable model are recorded ``cancelled``; pending runs go out while fewer
  than the window (``max_outstanding``, or auto) are queued or running, due deferred runs go out again, poison runs
  are stored as ``worker_error``;
* **progress** (``progress.ProgressView``) comes from the campaign's Redis counters (O(models));
* **completion** (``completion.CompletionTracker``) reads the done log from a cursor (O(runs
  finished since)), then verifies the store once at the end with an incremental file cursor: a
  done run whose record never shows up (lost) is sent again;
* **reconcile** (``reconciler.Reconciler``, every ``reconcile_interval_s``) re-sends runs whose
  claim expired, that the broker lost, or that a Redis restart forgot.

All of them publish through one ``publisher.Publisher`` and call Redis through the campaign's
``context.CampaignContext`` (retried until the deadline). Side effects go through an injected
:class:`Bundle` (clock, Redis, broker, store).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
import structlog
from celery import Celery

from orchestrator.campaign.prepared import PreparedCampaign
from orchestrator.distributed.completion import CompletionTracker
from orchestrator.distributed.context import CampaignContext
from orchestrator.distributed.dispatcher import Dispatcher, RecordsFor
from orchestrator.distributed.message_size import MessageSizer
from orchestrator.distributed.options import CeleryOptions, window_runs
from orchestrator.distributed.plan_view import PlanView
from orchestrator.distributed.progress import CeleryModelProgress, CeleryProgressCallback, ProgressView
from orchestrator.distributed.publisher import Publisher
from orchestrator.distributed.reconciler import Reconciler
from orchestrator.local.executor import ExecutionSummary
from storage.runs import RunStore
from workers.state.campaign_state import CampaignState
from workers.state.presence import read_presence

log = structlog.get_logger("irbench.celery")


@dataclass
class Bundle:
    """What the campaign touches: a monotonic ``clock`` and its ``sleep``, the Redis client of
    the campaign state, the Celery app that publishes (``broker``) and the run ``store``; for a
    bucket store, its URL (``store_url``) and what brings new uploads into the mirror
    (``follow_store``)."""

    redis: redis.Redis
    broker: Celery
    store: RunStore
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    store_url: str | None = None  # what tasks carry as the store (None: the store's root)
    follow_store: Callable[[], object] | None = None  # called before each look at the store


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
        b, plan = self.bundle, PlanView(self.prepared.tasks)
        self.campaign = self.prepared.spec.name
        self.ctx = CampaignContext(self.campaign, CampaignState(b.redis, self.campaign), plan,
                                   self.options, b.clock, b.sleep,
                                   window_runs=window_runs(self.options.max_outstanding, plan.allowed_calls()))
        self.planned = plan.planned()  # from the axes: no pass over the tasks
        sizer = MessageSizer(lambda: read_presence(b.redis), self.options.queue, b.clock)
        self.publisher = Publisher(self.ctx, b.broker, b.store_url or str(b.store.root), sizer)
        self.completion = CompletionTracker(self.ctx, b.store, self.publisher, self.retry_outcomes, b.follow_store)
        self.dispatcher = Dispatcher(self.ctx, self.publisher, self.completion, b.store, self.closed_records,
                                     self.unavailable)
        self.reconciler = Reconciler(self.ctx, self.publisher, self.completion, self.dispatcher, b.redis)
        self.view = ProgressView(self.ctx, self.planned, self.on_progress)

    @property
    def progress(self) -> dict[str, CeleryModelProgress]:
        """model -> progress at the last look."""
        return self.view.progress

    def start(self) -> None:
        """Write the plan, reopen the retried runs, note the Redis server and decide what to send."""
        self.ctx.call(lambda: self.ctx.state.done.set_planned(self.planned), "writing the plan")
        self.completion.reopen_retried()
        self.reconciler.start()
        self.dispatcher.start()
        log.info("celery_campaign_start", campaign=self.campaign, planned=len(self.ctx.plan),
                 pending=self.completion.pending_count, known=len(self.dispatcher.known))

    def run(self, timeout_s: float | None = None) -> ExecutionSummary:
        """Drive the campaign until every planned run is stored (or ``timeout_s`` passes:
        ``interrupted=True``, the workers carry on). The summary counts runs stored during
        this call, per model and outcome (the latest execution of each)."""
        clock = self.bundle.clock
        self.ctx.deadline = None if timeout_s is None else clock() + timeout_s
        interrupted = False
        self.start()
        self.reconciler.wait_from_now()
        try:
            while True:
                if self.ctx.deadline is not None and clock() > self.ctx.deadline:
                    interrupted = True
                    break
                self.dispatcher.close_unsendable()
                self.dispatcher.dispatch()
                self.view.show()
                if self.completion.check():
                    break
                self.reconciler.reconcile()
                self.bundle.sleep(self.dispatcher.pause_s())
        except KeyboardInterrupt:
            interrupted = True
        if not interrupted:
            self.view.show()
        return self.summary(interrupted)

    def summary(self, interrupted: bool) -> ExecutionSummary:
        """Runs stored during this call, per model and outcome; logs what was sent again."""
        executed, by_model = self.completion.executed()
        by_others = self._by_others(by_model)
        log.info("celery_campaign_end", campaign=self.campaign, executed=executed, interrupted=interrupted,
                 by_others=sum(by_others.values()),
                 resent=dict(self.publisher.resent), poisoned=len(self.dispatcher.poisoned),
                 files_read=self.completion.cursor.files_read,
                 runs_per_message={str(k): n for k, n in sorted(self.publisher.message_sizes.items())})
        return ExecutionSummary(executed=executed, by_model=by_model, interrupted=interrupted, by_others=by_others)

    def _by_others(self, by_model: dict[str, dict[str, int]]) -> dict[str, int]:
        """outcome -> runs stored during this call that another orchestrator's messages executed:
        what the store gained, less what Redis counted for this run's dispatch token (its workers'
        executions and the records it stored itself). Cancelled runs are nobody's work."""
        stored: Counter[str] = Counter()
        for outcomes in by_model.values():
            stored.update(outcomes)
        mine = Counter(self.ctx.call(lambda: self.ctx.state.done.by_dispatch(self.ctx.dispatch), "reading own counts"))
        others = {o: n - mine[o] for o, n in stored.items() if o != "cancelled" and n > mine[o]}
        return others
