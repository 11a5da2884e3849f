"""A campaign on the in-process executor: what is pending (or retried), the gate primed from the
availability dataset, the run, and the retirements it saw recorded."""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from orchestrator.campaign.plan_state import PlanSelection, latest_runs, retryable_bitmap, stored_bitmap
from orchestrator.campaign.prepared import PreparedCampaign, record_campaign
from orchestrator.campaign.spend_cap import spend_plan
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
) -> tuple[int, ExecutionSummary]:
    """Execute the runs of ``prepared`` that have no stored record, and (``retry_outcomes``,
    i.e. ``--retry-failed``) those whose latest execution ended in one of those classes; the
    earlier executions stay stored. Returns (skipped, summary)."""
    plan = prepared.plan
    done = stored_bitmap(plan, store)
    again = retryable_bitmap(plan, latest_runs(plan, store), retry_outcomes) if retry_outcomes else None
    todo = PlanSelection.pending(plan, done, again)  # enumerated model by model as the pools drain it
    skipped = len(plan) - len(todo)
    record_campaign(prepared, store.root, fsync=store.dataset.fsync)
    log.info("campaign_start", campaign=prepared.spec.name, planned=len(plan), pending=len(todo))
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
    return skipped, summary


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
