"""A campaign on the in-process executor: what is pending (or retried), the gate primed from the
availability dataset, the run, and the retirements it saw recorded."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace

import structlog

from orchestrator.campaign.plan import LazyPlan
from orchestrator.campaign.plan_state import PlanSelection, latest_runs, retryable_bitmap, stored_bitmap
from orchestrator.campaign.prepared import PreparedCampaign, record_campaign
from orchestrator.campaign.run_bitmap import RunBitmap
from orchestrator.campaign.spend_cap import spend_plan
from orchestrator.local.campaign_lock import campaign_lock
from orchestrator.local.executor import (
    ExecutionSummary, LocalOptions, ProgressCallback, RunServices, run_event_loop, run_local,
)
from storage.availability import AvailabilityRecord, AvailabilityStore
from storage.records import Outcome
from storage.runs import RunStore
from workers.gate import MemoryGate
from workers.spend import MemorySpendMeter

log = structlog.get_logger("irbench.campaign")


def run_campaign_local(
    prepared: PreparedCampaign,
    store: RunStore,
    secrets: Mapping[str, str],
    *,
    options: LocalOptions | None = None,
    on_progress: ProgressCallback | None = None,
    retry_outcomes: frozenset[Outcome] = frozenset(),
    on_wait: Callable[[str], None] = lambda line: None,
) -> tuple[int, ExecutionSummary]:
    """Execute the runs of ``prepared`` that have no stored record, and (``retry_outcomes``,
    i.e. ``--retry-failed``) those whose latest execution ended in one of those classes; the
    earlier executions stay stored. Returns (skipped: runs stored before this call, summary).

    Under the campaign's lock (``campaign_lock``; ``on_wait`` hears a wait for another
    orchestrator): the runs that one stored meanwhile are not executed again, and the summary
    counts them in ``by_others``."""
    plan = prepared.plan
    at_start = _todo(plan, store, retry_outcomes)
    with campaign_lock(store.root, prepared.spec.name, on_wait) as waited:
        todo = _todo(plan, store, retry_outcomes) if waited else at_start
        summary = _execute(prepared, store, secrets, todo, options, on_progress)
    by_others = at_start.bits.difference(todo.bits) if waited else RunBitmap(len(plan))
    return len(plan) - len(at_start), _with_others(summary, plan, by_others, store)


def _todo(plan: LazyPlan, store: RunStore, retry_outcomes: frozenset[Outcome]) -> PlanSelection:
    """What is pending, enumerated model by model as the pools drain it."""
    done = stored_bitmap(plan, store)
    again = retryable_bitmap(plan, latest_runs(plan, store), retry_outcomes) if retry_outcomes else None
    return PlanSelection.pending(plan, done, again)


def _execute(prepared: PreparedCampaign, store: RunStore, secrets: Mapping[str, str], todo: PlanSelection,
             options: LocalOptions | None, on_progress: ProgressCallback | None) -> ExecutionSummary:
    record_campaign(prepared, store.root, fsync=store.dataset.fsync)
    log.info("campaign_start", campaign=prepared.spec.name, planned=len(prepared.plan), pending=len(todo))
    options = options or LocalOptions(max_in_flight=prepared.spec.executor.concurrency)
    gate = MemoryGate(prepared.spec.retry.disable_after_consecutive)
    availability = AvailabilityStore(store.root)
    for model, timeline in availability.unavailable_models().items():
        # a model an availability check found gone is not called; its runs are recorded cancelled
        gate.close(model, f"{timeline.latest_status.value} (availability check {timeline.latest_check})")
    spend = spend_plan(prepared.spec, prepared.wave.number, store)
    services = RunServices(gate=gate, spend=MemorySpendMeter(spend) if spend.capped else None)
    summary = run_event_loop(
        run_local(todo, store, secrets=secrets, options=options, services=services, on_progress=on_progress)
    )
    _record_retirements(summary, prepared, availability)
    return summary


def _with_others(summary: ExecutionSummary, plan: LazyPlan, others: RunBitmap, store: RunStore) -> ExecutionSummary:
    """``summary`` with the runs in ``others`` (stored by another orchestrator while this one
    waited) counted as ``by_others``, under their latest outcome."""
    if not others.count():
        return summary
    latest = latest_runs(plan, store)
    outcome_of = dict(zip(latest.indices.tolist(), latest.outcomes.tolist()))
    by_model = {m: Counter(o) for m, o in summary.by_model.items()}
    counted: Counter[str] = Counter()
    for i in others.indices().tolist():
        outcome = outcome_of.get(i, Outcome.CANCELLED.value)
        by_model.setdefault(plan.models[i % len(plan.models)], Counter())[outcome] += 1  # the plan interleaves models
        counted[outcome] += 1
    return replace(summary, executed=summary.executed + others.count(),
                   by_model={m: dict(c) for m, c in by_model.items()}, by_others=dict(counted))


def _record_retirements(summary: ExecutionSummary, prepared: PreparedCampaign, availability: AvailabilityStore) -> None:
    """A 410 seen during the campaign becomes an event in the availability dataset."""
    events = [
        AvailabilityRecord.from_campaign_410(
            campaign=prepared.spec.name, endpoint=r.endpoint, model=r.model, measured_at=r.measured_at,
            status_code=r.status_code, retired_on=r.retired_on,
        )
        for r in summary.retired
    ]
    if events:
        availability.write(events)
