"""Campaign-level operations the CLI calls: prepare (spec → corpus → plan), run, status.

Everything here takes explicit objects (spec, store, secrets) and returns values; the CLI
does the printing.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from orchestrator.campaign.limits import DEFAULT_MAX_PLANNED_RUNS, check_plan_size
from orchestrator.campaign.corpus import Corpus, load_corpus
from orchestrator.campaign.instruction import Instruction, load_instruction
from orchestrator.local.executor import ExecutionSummary, LocalOptions, ProgressCallback, run_event_loop, run_local
from orchestrator.campaign.plan import pending, plan_runs
from orchestrator.campaign.retry import latest_outcomes, retryable_tasks
from orchestrator.campaign.spec import CampaignSpec
from storage.availability import AvailabilityRecord, AvailabilityStore
from storage.records import Outcome
from storage.runs import RunStore
from storage.parquet.unreadable import read_checked
from workers.gate import MemoryGate
from workers.errors import ConfigError
from workers.runtask import RunTask

log = structlog.get_logger("irbench.campaign")


@dataclass(frozen=True)
class PreparedCampaign:
    spec: CampaignSpec
    corpus: Corpus
    instruction: Instruction
    tasks: list[RunTask]  # the whole plan


def prepare(
    spec: CampaignSpec, *, max_planned_runs: int | None = DEFAULT_MAX_PLANNED_RUNS, source: str | None = None
) -> PreparedCampaign:
    """Load the corpus and instruction and plan every run of ``spec``.

    ``max_planned_runs``: a plan larger than this is a ``ConfigError`` raised before any task is
    built (``runs = 10**20`` must not hang planning); ``None`` = no bound. ``source``: the
    campaign file's name, for messages.
    """
    corpus = load_corpus(spec.corpus, spec.base_dir)
    check_plan_size(spec, len(corpus.prompts), max_planned_runs, source)
    instruction = load_instruction(spec.instruction)
    tasks = plan_runs(spec, corpus, instruction)
    return PreparedCampaign(spec, corpus, instruction, tasks)


def resolve_secrets(spec: CampaignSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Read each endpoint's API key from the environment variable it names.

    A named variable that is unset is a ConfigError (say which endpoint and variable), since
    every call would otherwise fail with auth_error.
    """
    environ = os.environ if environ is None else environ
    secrets: dict[str, str] = {}
    missing: list[str] = []
    for name, endpoint in spec.endpoints.items():
        if endpoint.api_key_env:
            value = environ.get(endpoint.api_key_env)
            if value:
                secrets[endpoint.api_key_env] = value
            else:
                missing.append(
                    f"endpoints.{name}.api_key_env: environment variable {endpoint.api_key_env} is not set;"
                    f" export it (the key itself never goes in the campaign file)"
                )
    if missing:
        raise ConfigError("API keys missing", missing)
    return secrets


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
    done = store.completed_run_ids(prepared.spec.name)
    todo = pending(prepared.tasks, done)
    if retry_outcomes:
        again = {t.run_id for t in retryable_tasks(prepared.tasks, latest_outcomes(prepared, store), retry_outcomes)}
        todo = [t for t in prepared.tasks if t.run_id in again or t.run_id not in done]  # planned order
    skipped = len(prepared.tasks) - len(todo)
    log.info("campaign_start", campaign=prepared.spec.name, planned=len(prepared.tasks), pending=len(todo))
    options = options or LocalOptions(max_in_flight=prepared.spec.executor.concurrency)
    gate = MemoryGate(prepared.spec.retry.disable_after_consecutive)
    availability = AvailabilityStore(store.root)
    for model, timeline in availability.unavailable_models().items():
        # a model an availability check found gone is not called; its runs are recorded cancelled
        gate.close(model, f"{timeline.latest_status.value} (availability check {timeline.latest_check})")
    summary = run_event_loop(
        run_local(todo, store, secrets=secrets, options=options, on_progress=on_progress, gate=gate)
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


@dataclass(frozen=True)
class CampaignStatus:
    planned_by_model: Mapping[str, int]
    stored_by_model: Mapping[str, Mapping[str, int]]  # model -> outcome -> count
    skipped_files: tuple[Path, ...] = ()  # unreadable files left out (``skip_corrupt``)

    @property
    def planned(self) -> int:
        return sum(self.planned_by_model.values())

    @property
    def stored(self) -> int:
        return sum(sum(c.values()) for c in self.stored_by_model.values())


def campaign_status(prepared: PreparedCampaign, store: RunStore, *, skip_corrupt: bool = False) -> CampaignStatus:
    """Planned vs stored runs per model, by outcome (counts only runs of the current plan).

    An unreadable Parquet file is a ``StorageError`` naming it, unless ``skip_corrupt``: then
    the other files are counted and the skipped ones listed in ``skipped_files``."""
    planned_ids = {t.run_id for t in prepared.tasks}
    table, skipped = read_checked(
        store.dataset, skip=skip_corrupt, filters={"campaign": [prepared.spec.name]},
        columns=["run_id", "model", "outcome"],
    )
    stored: dict[str, Counter[str]] = {}
    for run_id, model, outcome in zip(
        table.column("run_id").to_pylist(), table.column("model").to_pylist(), table.column("outcome").to_pylist()
    ):
        if run_id in planned_ids:
            stored.setdefault(model, Counter())[outcome] += 1
    return CampaignStatus(
        planned_by_model=dict(Counter(t.model for t in prepared.tasks)),
        stored_by_model={m: dict(c) for m, c in stored.items()},
        skipped_files=tuple(skipped),
    )
