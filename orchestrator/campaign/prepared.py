"""A campaign made ready to run: spec -> corpus -> instruction -> the plan (its axes), and its secrets."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from orchestrator.campaign.corpus import Corpus, load_corpus
from orchestrator.campaign.instruction import Instruction, load_instruction
from orchestrator.campaign.limits import DEFAULT_MAX_PLANNED_RUNS, check_plan_size
from orchestrator.campaign.plan import LazyPlan, WaveStart
from orchestrator.campaign.spec import CampaignSpec
from storage.errors import StorageError
from storage.prompts import PromptStore, PromptText
from workers.errors import ConfigError
from workers.runtask import RunTask

log = structlog.get_logger("irbench.campaign")


@dataclass(frozen=True)
class PreparedCampaign:
    spec: CampaignSpec
    corpus: Corpus
    instruction: Instruction
    tasks: Sequence[RunTask]  # the whole plan (of one wave): a LazyPlan, built task by task when read
    wave: WaveStart = WaveStart()

    @property
    def plan(self) -> LazyPlan:
        """The plan as axes (a prepared campaign's ``tasks``; a list put in their place by hand
        has no axes, so only the paths that take ``tasks`` accept it)."""
        if not isinstance(self.tasks, LazyPlan):
            raise TypeError("this campaign's tasks are a list, not its plan: prepare() it")
        return self.tasks


def prepare(
    spec: CampaignSpec, *, max_planned_runs: int | None = DEFAULT_MAX_PLANNED_RUNS, source: str | None = None,
    wave: WaveStart = WaveStart(),
) -> PreparedCampaign:
    """Load the corpus and instruction and plan every run of ``spec`` (a ``LazyPlan``: no task built).

    ``max_planned_runs``: a plan larger than this is a ``ConfigError`` raised before any task is
    built (``runs = 10**20`` must not hang planning); ``None`` = no bound. ``source``: the
    campaign file's name, for messages. ``wave``: the wave planned (its run ids; default wave 1).
    """
    from orchestrator.campaign.spend_cap import spend_cap_problems

    problems = spend_cap_problems(source or spec.name, spec)
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else f"{len(problems)} spend cap problems", problems)
    corpus = load_corpus(spec.corpus, spec.base_dir)
    check_plan_size(spec, len(corpus.prompts), max_planned_runs, source)
    instruction = load_instruction(spec.instruction)
    return PreparedCampaign(spec, corpus, instruction, LazyPlan(spec, corpus, instruction, wave=wave), wave)


def record_prompts(prepared: PreparedCampaign, data_root: Path, *, fsync: bool = True) -> int:
    """Store the text of each prompt of ``prepared`` and the user message it renders to in
    ``data_root/prompts/`` (only those not stored yet), so the store can show what was asked.
    Returns the rows written. Best effort: the runs are the record and these texts a reading
    aid, so a failed write (a full disk) is logged and the campaign goes on; the next run of
    the campaign writes them, since their keys are still missing."""
    texts = [PromptText(p.sha256, p.name, prepared.instruction.sha256, prepared.instruction.version,
                        p.text, prepared.instruction.render(p.name, p.text))
             for p in prepared.corpus.prompts]
    try:
        return PromptStore(data_root, fsync=fsync).add(texts)
    except (StorageError, OSError) as exc:
        # info, not a warning: the same cause (disk full, permissions) stops the runs' own
        # writes, which say so in one line
        log.info("prompts_not_recorded", campaign=prepared.spec.name, error=str(exc))
        return 0


def record_campaign(prepared: PreparedCampaign, data_root: Path, *, fsync: bool = True) -> None:
    """What an executor writes beside the runs before its first call: the campaign's prices
    (``orchestrator.campaign.cost.record_prices``: the report and status cost the runs with them;
    a failed write stops the campaign, as a failed run write would) and its prompt texts
    (:func:`record_prompts`, best effort)."""
    from orchestrator.campaign.cost import record_prices

    record_prices(prepared.spec, data_root, fsync=fsync)
    record_prompts(prepared, data_root, fsync=fsync)


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
