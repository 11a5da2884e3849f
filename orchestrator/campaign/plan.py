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
from orchestrator.campaign.spec import CampaignSpec
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
    """Every run of the campaign, models interleaved round-robin, as a list (small plans; a
    prepared campaign holds the same plan as ``orchestrator.campaign.lazy_plan.LazyPlan``).

    Within one model the order is prompt (corpus order), then budget (as listed), then run
    index; the output takes the first task of each model (in spec order), then the second of
    each, and so on, so one model's rate limit never serialises the whole campaign.
    ``budget_max_tokens`` is None when the campaign has no ``budgets`` axis; a budget, when
    present, replaces the model's ``max_tokens``. ``wave``: every task is of that wave (its run ids
    and its ``wave``/``wave_started_at`` fields).
    """
    from orchestrator.campaign.lazy_plan import LazyPlan

    return list(LazyPlan(spec, corpus, instruction, measured_on, wave))


def pending(tasks: Iterable[RunTask], completed_ids: set[str]) -> list[RunTask]:
    """The tasks whose run_id is not yet completed, in planned order (resume)."""
    return [t for t in tasks if t.run_id not in completed_ids]
