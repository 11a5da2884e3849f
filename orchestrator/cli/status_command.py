"""``irbench status``'s work: planned against stored runs per model, what is retryable, and with
``--broker`` the live Redis state (in flight, rates, closed models)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.cli.shell import console, no_store_note, setup_logging, warn
from orchestrator.cli.user_errors import fail
from workers.errors import IrbenchError

if TYPE_CHECKING:
    from orchestrator.campaign.prepared import PreparedCampaign
    from orchestrator.campaign.status import CampaignStatus
    from orchestrator.distributed.executor import CeleryCampaignStatus
    from storage.runs import RunStore

__all__ = ["StatusRequest", "show_status"]


@dataclass(frozen=True)
class StatusRequest:
    """What ``irbench status`` was asked (``broker`` None: the store only)."""

    campaign: Path
    data: Path
    max_planned_runs: int
    broker: str | None = None
    as_json: bool = False
    broker_wait_s: float = 10.0
    skip_corrupt: bool = False


def show_status(req: StatusRequest) -> None:
    """Print the status table (or one JSON object with ``as_json``); exits 2 on a user error.
    A ``--data`` without a store is said on stderr (the planned runs are still shown)."""
    if req.as_json:
        from orchestrator.cli.status_report import print_status_json

        print_status_json(req.campaign, req.data, max_planned_runs=req.max_planned_runs, skip_corrupt=req.skip_corrupt)
        return
    from orchestrator.campaign.spec import load_campaign
    from orchestrator.campaign.status import campaign_status
    from orchestrator.campaign.waves import prepare_wave
    from storage.runs import RunStore

    setup_logging(None, False)
    store = RunStore(req.data)
    try:
        prepared = prepare_wave(load_campaign(req.campaign), req.data, max_planned_runs=req.max_planned_runs,
                                source=req.campaign.name)  # the latest wave
        st = campaign_status(prepared, store, skip_corrupt=req.skip_corrupt)
        live = _live_status(req, prepared, store) if req.broker else None
    except IrbenchError as exc:
        fail(exc)
    if (note := no_store_note(req.data)) is not None:
        warn(note)
    for path in st.skipped_files:
        warn(f"skipped unreadable file {path}")
    _print_table(prepared, st)
    _print_retryable(prepared, store, req, st)
    _print_spent(prepared, store, req)
    if live is not None:
        _print_live(prepared, store, st, live)


def _live_status(req: StatusRequest, prepared: PreparedCampaign, store: RunStore) -> CeleryCampaignStatus:
    from orchestrator.distributed.executor import campaign_status_celery
    from orchestrator.distributed.worker_checks import wait_with_countdown

    assert req.broker is not None
    wait_with_countdown(req.broker, req.broker_wait_s, sys.stderr)
    return campaign_status_celery(prepared, store, req.broker, skip_corrupt=req.skip_corrupt)


def _print_table(prepared: PreparedCampaign, st: CampaignStatus) -> None:
    from rich.table import Table

    # a line of its own: a longer table title wraps at the table's width
    console.print(f"wave {prepared.wave.number} (the campaign's latest)")
    table = Table(title=f"campaign {prepared.spec.name}: {st.stored}/{st.planned} runs stored")
    for col in ("model", "planned", "stored", "outcomes"):
        table.add_column(col)
    for model, planned in st.planned_by_model.items():
        outcomes = st.stored_by_model.get(model, {})
        table.add_row(model, str(planned), str(sum(outcomes.values())),
                      ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) or "-")
    console.print(table)


def _print_spent(prepared: PreparedCampaign, store: RunStore, req: StatusRequest) -> None:
    from orchestrator.cli.spend_table import spend_lines
    from orchestrator.cli.status_report import spend_report

    for line in spend_lines(spend_report(prepared, store, skip_corrupt=req.skip_corrupt)):
        console.print(line, soft_wrap=True, markup=False)


def _print_retryable(prepared: PreparedCampaign, store: RunStore, req: StatusRequest, st: CampaignStatus) -> None:
    from orchestrator.campaign.retry import retry_command, retryable, retryable_of

    again = (retryable_of(prepared.plan, st.latest) if st.latest is not None
             else retryable(prepared, store, skip_corrupt=req.skip_corrupt))
    if again.total:
        console.print(f"{again.total} runs retryable (latest execution {again.describe()}): "
                      f"{retry_command(req.campaign, req.data)}", soft_wrap=True)


def _print_live(prepared: PreparedCampaign, store: RunStore, st: CampaignStatus, live: CeleryCampaignStatus) -> None:
    from orchestrator.cli.rates import model_rates, rates_table

    remaining = {m: n - sum(st.stored_by_model.get(m, {}).values()) for m, n in st.planned_by_model.items()}
    rates = model_rates(store, prepared.spec.name, remaining)
    console.print(rates_table(rates, {m: p.in_flight for m, p in live.progress.items()}))
    console.print(f"outstanding (dispatched, not done): {live.outstanding}")
    if live.cancel_reason:
        console.print(f"cancelled: {live.cancel_reason}")
    for model, reason in live.closed_models.items():
        console.print(f"closed model {model}: {reason}")
