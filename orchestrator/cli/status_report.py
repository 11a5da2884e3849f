"""``irbench status CAMPAIGN --data D --json``: what the store holds for a campaign, as one object.

Per model and in total: ``planned`` runs, ``stored`` runs (with at least one execution),
``executions`` (every stored execution: more than ``stored`` when runs were executed twice
under at-least-once delivery or retried), ``attempts`` (every HTTP attempt of every stored
execution) and ``outcomes`` (the latest execution of each stored run,
``storage.runs.EXECUTION_RULE``). Only runs of the current plan count: the campaign's latest
``wave``, which the object names.

``spend``: tokens and cost (at the prices recorded when the campaign ran; ``cost_usd`` null when
a model has none) of every stored execution, per model and in total, for the latest wave and
under ``waves`` for each wave; ``caps``: the campaign's spend caps (``workers.spend``), by scope
(``"campaign"`` or a model id).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, Field

from orchestrator.campaign.plan import LOCATE_COLUMNS
from orchestrator.campaign.prepared import PreparedCampaign
from orchestrator.cli.spend_table import SpendFigures, SpendReport, WaveSpend, campaign_spend
from storage.prices import TokenTotals, spend_total
from storage.runs import RunStore, latest_executions
from storage.parquet.unreadable import RowSelection, read_checked


class StatusCounts(BaseModel):
    planned: int = 0
    stored: int = 0
    executions: int = 0
    attempts: int = 0
    outcomes: dict[str, int] = Field(default_factory=dict)


class CampaignStatusReport(BaseModel):
    campaign: str
    wave: int = 1  # the wave counted (the campaign's latest)
    total: StatusCounts
    models: dict[str, StatusCounts]
    skipped_files: list[str] = Field(default_factory=list)  # unreadable files left out (--skip-corrupt)
    spend: SpendReport = SpendReport()


def status_report(prepared: PreparedCampaign, store: RunStore, *, skip_corrupt: bool = False) -> CampaignStatusReport:
    """Counts from one read of the campaign's executions (columns needed only).

    An unreadable Parquet file is a ``StorageError`` naming it, unless ``skip_corrupt``: then
    the other files are counted and the skipped ones listed in ``skipped_files``."""
    name = prepared.spec.name
    plan = prepared.plan
    models = {m: StatusCounts(planned=n) for m, n in sorted(plan.planned_by_model().items())}
    execs, skipped = read_checked(store.dataset, skip=skip_corrupt, dedupe="executions", selection=RowSelection(
        filters={"campaign": [name]},
        columns=list(dict.fromkeys([*LOCATE_COLUMNS, "outcome", "attempts", "execution_id", "finished_at",
                                    "measured_at"])),
    ))
    if execs.num_rows:
        execs = execs.filter(pa.array(plan.locate(execs) >= 0))
    n_attempts = pc.fill_null(pc.list_value_length(execs.column("attempts")), 0).to_pylist() if execs.num_rows else []
    for model, n in zip(execs.column("model").to_pylist(), n_attempts):
        c = models.setdefault(model, StatusCounts())
        c.executions += 1
        c.attempts += int(n)
    latest = latest_executions(execs.select(["run_id", "model", "outcome", "execution_id", "finished_at",
                                             "measured_at"])) if execs.num_rows else execs
    for model, outcome in zip(latest.column("model").to_pylist(), latest.column("outcome").to_pylist()):
        c = models[model]
        c.stored += 1
        c.outcomes[outcome] = c.outcomes.get(outcome, 0) + 1
    total = StatusCounts()
    for c in models.values():
        c.outcomes = dict(sorted(c.outcomes.items()))
        total.planned += c.planned
        total.stored += c.stored
        total.executions += c.executions
        total.attempts += c.attempts
        for k, v in c.outcomes.items():
            total.outcomes[k] = total.outcomes.get(k, 0) + v
    total.outcomes = dict(sorted(total.outcomes.items()))
    return CampaignStatusReport(
        campaign=name, wave=prepared.wave.number, total=total, models=models, skipped_files=[str(p) for p in skipped],
        spend=spend_report(prepared, store, skip_corrupt=skip_corrupt),
    )


def _figures(t: TokenTotals) -> SpendFigures:
    return SpendFigures(executions=t.executions, prompt_tokens=t.prompt_tokens, completion_tokens=t.completion_tokens,
                        total_tokens=t.total_tokens, cost_usd=t.cost_usd)


def _wave_spend(by_model: dict[str, TokenTotals]) -> WaveSpend:
    return WaveSpend(total=_figures(spend_total(by_model)), models={m: _figures(t) for m, t in by_model.items()})


def spend_report(prepared: PreparedCampaign, store: RunStore, *, skip_corrupt: bool = False) -> SpendReport:
    """Tokens and cost per model and in total, of the latest wave and of each wave, and the caps."""
    from orchestrator.campaign.spend_cap import spend_plan
    name = prepared.spec.name
    # waves are numbered 1..latest (``--new-wave`` adds one): no extra read of the store to list them
    waves = {w: _wave_spend(campaign_spend(store, name, w, skip_corrupt=skip_corrupt))
             for w in range(1, prepared.wave.number + 1)}
    latest = waves.get(prepared.wave.number, WaveSpend())
    caps = {scope or "campaign": {k: v for k, v in (("max_cost_usd", cap.max_cost_usd),
                                                   ("max_total_tokens", cap.max_total_tokens)) if v is not None}
            for scope, cap in spend_plan(prepared.spec, prepared.wave.number, store).caps.items()}
    return SpendReport(total=latest.total, models=latest.models, waves=waves, caps=caps)


def print_status_json(campaign_toml, data_dir, *, max_planned_runs: int, skip_corrupt: bool = False) -> None:
    """The ``--json`` branch of ``irbench status``: the report on stdout; a user error is one
    line on stderr and exit code 2; each skipped unreadable file is named on stderr too."""
    import sys
    from pathlib import Path

    from orchestrator.campaign.spec import load_campaign
    from orchestrator.campaign.waves import prepare_wave
    from orchestrator.cli.user_errors import fail
    from workers.errors import IrbenchError

    try:
        prepared = prepare_wave(load_campaign(Path(campaign_toml)), Path(data_dir), max_planned_runs=max_planned_runs,
                                source=Path(campaign_toml).name)
        report = status_report(prepared, RunStore(Path(data_dir)), skip_corrupt=skip_corrupt)
    except IrbenchError as exc:
        fail(exc)
    from orchestrator.cli.shell import no_store_note

    if (note := no_store_note(Path(data_dir))) is not None:
        print(f"warning: {note}", file=sys.stderr)
    for path in report.skipped_files:
        print(f"warning: skipped unreadable file {path}", file=sys.stderr)
    sys.stdout.write(report.model_dump_json() + "\n")
