"""Planning: cross prompts × models × budgets × runs into ``RunTask`` values with stable ids.

``run_id`` is the sha256 of a canonical JSON array (so no two distinct inputs can encode the
same: strings are quoted and escaped, ``null`` differs from any integer), truncated to 32 hex
characters (128 bits). It never depends on anything that may legitimately change between a run
and its resume (timeouts, limits, endpoint URL, instruction text), only on *what* is measured.
A wave ``k >= 2`` (a re-measurement of every run) appends ``k`` to the array, so each wave's runs
have their own ids while wave 1's stay what they always were (older stores stay valid).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.campaign.corpus import Corpus
from orchestrator.campaign.instruction import Instruction
from orchestrator.campaign.spec import CampaignSpec, ModelSpec
from workers.runtask import RunTask

RUN_ID_SCHEME = "irbench-run-v1"
RUN_ID_HEX_CHARS = 32


@dataclass(frozen=True)
class WaveStart:
    """The wave a plan is for: its ``number`` (from 1) and UTC ``started_at`` (None: a wave 1 that
    was never declared, i.e. every campaign run without ``--new-wave``)."""

    number: int = 1
    started_at: dt.datetime | None = None


def run_id(
    campaign: str, prompt_sha256: str, model: str, budget_max_tokens: int | None, run_index: int, wave: int = 1
) -> str:
    """Deterministic id of one run: 32 lowercase hex chars (wave 1: the id it always had)."""
    parts: list[object] = [RUN_ID_SCHEME, campaign, prompt_sha256, model, budget_max_tokens, run_index]
    if wave > 1:
        parts.append(wave)
    canonical = json.dumps(
        parts,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:RUN_ID_HEX_CHARS]


def plan_runs(
    spec: CampaignSpec, corpus: Corpus, instruction: Instruction, measured_on: dt.date | None = None,
    wave: WaveStart = WaveStart(),
) -> list[RunTask]:
    """Every run of the campaign, models interleaved round-robin.

    Within one model the order is prompt (corpus order), then budget (as listed), then run
    index; the output takes the first task of each model (in spec order), then the second of
    each, and so on, so one model's rate limit never serialises the whole campaign.
    ``budget_max_tokens`` is None when the campaign has no ``budgets`` axis; a budget, when
    present, replaces the model's ``max_tokens``. ``wave``: every task is of that wave (its run ids
    and its ``wave``/``wave_started_at`` fields).
    """
    budgets: list[int | None] = list(spec.budgets) if spec.budgets else [None]
    messages = {p.sha256: instruction.render(p.name, p.text) for p in corpus.prompts}
    per_model = [_model_tasks(spec, m, corpus, instruction, _Shared(budgets, messages, measured_on, wave))
                 for m in spec.models.values()]
    out: list[RunTask] = []
    for i in range(max((len(t) for t in per_model), default=0)):
        out.extend(t[i] for t in per_model if i < len(t))
    return out


def pending(tasks: Iterable[RunTask], completed_ids: set[str]) -> list[RunTask]:
    """The tasks whose run_id is not yet completed, in planned order (resume)."""
    return [t for t in tasks if t.run_id not in completed_ids]


@dataclass(frozen=True)
class _Shared:
    """What every model's tasks share: the budgets axis, the rendered messages, the date, the wave."""

    budgets: list[int | None]
    messages: dict[str, str]
    measured_on: dt.date | None
    wave: WaveStart


def _model_tasks(spec: CampaignSpec, m: ModelSpec, corpus: Corpus, instruction: Instruction, shared: _Shared
                 ) -> list[RunTask]:
    """One model's tasks: prompt (corpus order), then budget, then run index."""
    retry, endpoint = spec.retry.to_policy(), spec.endpoint_ref(m)
    limits, timeouts, response = m.to_limits(), m.to_timeouts(), m.to_response_limits()
    capped = spec.spend_cap().capped or m.spend_cap().capped
    wave = shared.wave
    return [
        RunTask(
            run_id=run_id(spec.name, p.sha256, m.name, budget, k, wave.number),
            campaign=spec.name, panel=spec.panel, model=m.name, endpoint=endpoint,
            limits=limits, timeouts=timeouts, retry=retry, response=response,
            max_tokens=budget if budget is not None else m.max_tokens, budget_max_tokens=budget,
            temperature=m.temperature, reasoning=m.reasoning, structured_output=m.structured_output,
            stream=m.stream, options=dict(m.options),
            prompt_sha256=p.sha256, prompt_name=p.name, prompt_license=p.license, prompt_source=p.source,
            run_index=k, user_message=shared.messages[p.sha256],
            instruction_version=instruction.version, instruction_sha256=instruction.sha256,
            measured_on=shared.measured_on, wave=wave.number, wave_started_at=wave.started_at,
            spend_capped=capped,
        )
        for p in corpus.prompts
        for budget in shared.budgets
        for k in range(spec.runs)
    ]
