"""Planning: cross prompts × models × budgets × runs into ``RunTask`` values with stable ids.

``run_id`` is the sha256 of a canonical JSON array (so no two distinct inputs can encode the
same: strings are quoted and escaped, ``null`` differs from any integer), truncated to 32 hex
characters (128 bits). It never depends on anything that may legitimately change between a run
and its resume (timeouts, limits, endpoint URL, instruction text), only on *what* is measured.
A wave ``k >= 2`` (a re-measurement of every run) appends ``k`` to the array, so each wave's runs
have their own ids while wave 1's stay what they always were (older stores stay valid).

**The plan is never materialised.** A prepared campaign's plan is a ``LazyPlan``: index
arithmetic over its axes, no task and no run id held for it. Run ``i`` of a plan of ``M`` models,
``P`` prompts, ``B`` budgets and ``R`` runs is model ``i % M`` (spec order) and, within that model, position ``j = i // M`` in prompt (corpus order),
budget (as listed), run index order: ``p = j // (B R)``, ``b = (j // R) % B``, ``k = j % R``. That
is exactly the order ``plan_runs`` always had (one task of each model in turn, since every model
has the same ``P B R`` tasks), so a plan of 10**8 runs costs its axes and nothing more: its
``RunTask`` and ``run_id`` are built when asked for. The reverse, a stored row back to its index,
is :meth:`LazyPlan.locate` (vectorised over a table of rows, the id checked).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from orchestrator.campaign.corpus import Corpus
from orchestrator.campaign.instruction import Instruction
from orchestrator.campaign.spec import CampaignSpec, ModelSpec
from workers.runtask import ModelLimits, RunTask

if TYPE_CHECKING:
    import pyarrow as pa

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
    prepared campaign holds the same plan as ``orchestrator.campaign.plan.LazyPlan``).

    Within one model the order is prompt (corpus order), then budget (as listed), then run
    index; the output takes the first task of each model (in spec order), then the second of
    each, and so on, so one model's rate limit never serialises the whole campaign.
    ``budget_max_tokens`` is None when the campaign has no ``budgets`` axis; a budget, when
    present, replaces the model's ``max_tokens``. ``wave``: every task is of that wave (its run ids
    and its ``wave``/``wave_started_at`` fields).
    """
    return list(LazyPlan(spec, corpus, instruction, measured_on, wave))


def pending(tasks: Iterable[RunTask], completed_ids: set[str]) -> list[RunTask]:
    """The tasks whose run_id is not yet completed, in planned order (resume)."""
    return [t for t in tasks if t.run_id not in completed_ids]


#: The columns of a stored row that :meth:`LazyPlan.locate` reads.
LOCATE_COLUMNS = ("run_id", "model", "prompt_sha256", "budget_max_tokens", "run_index")
_LOCATE_SLICE_ROWS = 65536


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class _ModelFields:
    """What every task of one model shares (``RunTask`` keyword arguments), and its id part."""

    fields: dict[str, Any]
    options: dict[str, Any]
    max_tokens: int | None
    id_part: str  # ',"<model>",' in the run id's canonical JSON


def _model_fields(spec: CampaignSpec, m: ModelSpec, instruction: Instruction, measured_on: dt.date | None,
                  wave: WaveStart) -> _ModelFields:
    fields: dict[str, Any] = dict(
        campaign=spec.name, panel=spec.panel, model=m.name, endpoint=spec.endpoint_ref(m),
        limits=m.to_limits(), timeouts=m.to_timeouts(), retry=spec.retry.to_policy(), response=m.to_response_limits(),
        temperature=m.temperature, reasoning=m.reasoning, structured_output=m.structured_output, stream=m.stream,
        instruction_version=instruction.version, instruction_sha256=instruction.sha256,
        measured_on=measured_on, wave=wave.number, wave_started_at=wave.started_at,
        spend_capped=spec.spend_cap().capped or m.spend_cap().capped,
    )
    return _ModelFields(fields, dict(m.options), m.max_tokens, f",{_json(m.name)},")


class LazyPlan(Sequence[RunTask]):
    """Every run of one wave of a campaign, enumerated on demand (a ``Sequence`` of ``RunTask``:
    ``len`` and ``plan[i]`` are O(1), iteration builds one task at a time)."""

    def __init__(self, spec: CampaignSpec, corpus: Corpus, instruction: Instruction,
                 measured_on: dt.date | None = None, wave: WaveStart = WaveStart()) -> None:
        self.campaign = spec.name
        self.wave = wave
        self.models: tuple[str, ...] = tuple(m.name for m in spec.models.values())
        self.budgets: tuple[int | None, ...] = tuple(spec.budgets) if spec.budgets else (None,)
        self.runs = spec.runs
        self._prompts = tuple(corpus.prompts)
        self.prompt_shas: tuple[str, ...] = tuple(p.sha256 for p in self._prompts)
        self._messages = tuple(instruction.render(p.name, p.text) for p in self._prompts)
        self._models = tuple(_model_fields(spec, m, instruction, measured_on, wave) for m in spec.models.values())
        # the run id's canonical JSON up to the prompt, hashed once per prompt (copied per run)
        self._id_heads = tuple(hashlib.sha256(f"[{_json(RUN_ID_SCHEME)},{_json(spec.name)},{_json(s)}".encode())
                               for s in self.prompt_shas)
        self._id_tail = f",{wave.number}]" if wave.number > 1 else "]"
        self.per_model = len(self._prompts) * len(self.budgets) * self.runs

    def __len__(self) -> int:
        return len(self.models) * self.per_model

    def axes(self, i: int) -> tuple[int, int, int, int]:
        """(model, prompt, budget, run) positions of run ``i``."""
        m_count, r, b_count = len(self.models), self.runs, len(self.budgets)
        j = i // m_count
        return i % m_count, j // (b_count * r), (j // r) % b_count, j % r

    def index_of(self, model: int, prompt: int, budget: int, run: int) -> int:
        """The plan index of those axis positions (the inverse of :meth:`axes`)."""
        return model + len(self.models) * ((prompt * len(self.budgets) + budget) * self.runs + run)

    def _checked(self, i: int) -> int:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"plan index {i} out of range ({n} runs)")
        return i

    def run_id(self, i: int) -> str:
        """The ``run_id`` of run ``i`` (``plan.run_id`` of its axes, without the task)."""
        m, p, b, k = self.axes(self._checked(i))
        return self._run_id(m, p, b, k)

    def _run_id(self, m: int, p: int, b: int, k: int) -> str:
        h = self._id_heads[p].copy()
        budget = self.budgets[b]
        h.update(f"{self._models[m].id_part}{'null' if budget is None else budget},{k}{self._id_tail}".encode())
        return h.hexdigest()[:RUN_ID_HEX_CHARS]

    def model_of(self, i: int) -> str:
        return self.models[self._checked(i) % len(self.models)]

    def task(self, i: int) -> RunTask:
        """The ``RunTask`` of run ``i`` (negative ``i`` counts from the end)."""
        m, p, b, k = self.axes(self._checked(i))
        model, prompt, budget = self._models[m], self._prompts[p], self.budgets[b]
        return RunTask(
            run_id=self._run_id(m, p, b, k), **model.fields, options=dict(model.options),
            max_tokens=budget if budget is not None else model.max_tokens, budget_max_tokens=budget,
            prompt_sha256=prompt.sha256, prompt_name=prompt.name, prompt_license=prompt.license,
            prompt_source=prompt.source, run_index=k, user_message=self._messages[p],
        )

    @overload
    def __getitem__(self, i: int) -> RunTask: ...
    @overload
    def __getitem__(self, i: slice) -> list[RunTask]: ...
    def __getitem__(self, i: int | slice) -> RunTask | list[RunTask]:
        if isinstance(i, slice):
            return [self.task(j) for j in range(*i.indices(len(self)))]
        return self.task(i)

    def __iter__(self) -> Iterator[RunTask]:
        return (self.task(i) for i in range(len(self)))

    def spend_capped(self) -> bool:
        """Whether a spend cap covers any run of the plan (the campaign's or one model's)."""
        return any(m.fields["spend_capped"] for m in self._models)

    def model_limits(self) -> dict[str, ModelLimits]:
        """Each model's limits (spec order), without building a task."""
        return {name: m.fields["limits"] for name, m in zip(self.models, self._models)}

    def planned_by_model(self) -> dict[str, int]:
        """Runs planned per model (spec order)."""
        return {m: self.per_model for m in self.models}

    def locate(self, table: pa.Table) -> np.ndarray:
        """The plan index of each row of ``table`` (columns ``LOCATE_COLUMNS``), -1 for a row that
        is not a run of this plan: its model, prompt, budget or run index is off the axes, or its
        ``run_id`` is not the one its axes give (another wave, another campaign). int64."""
        import pyarrow as pa
        import pyarrow.compute as pc

        n = table.num_rows
        if n == 0 or len(self) == 0:
            return np.full(n, -1, dtype=np.int64)

        def position(column: str, values: pa.Array) -> np.ndarray:
            found = pc.index_in(table.column(column), value_set=values, skip_nulls=False)
            return np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), dtype=np.int64)

        m = position("model", pa.array(self.models, pa.string()))
        p = position("prompt_sha256", pa.array(self.prompt_shas, pa.string()))
        b = position("budget_max_tokens", pa.array(self.budgets, pa.int64()))
        k = np.asarray(pc.fill_null(table.column("run_index"), -1).to_numpy(zero_copy_only=False), dtype=np.int64)
        on_axes = (m >= 0) & (p >= 0) & (b >= 0) & (k >= 0) & (k < self.runs)
        out = np.full(n, -1, dtype=np.int64)
        on = np.flatnonzero(on_axes)
        run_ids = table.column("run_id")
        for start in range(0, on.size, _LOCATE_SLICE_ROWS):  # the ids as Python strings a slice at a time
            rows = on[start:start + _LOCATE_SLICE_ROWS]
            ids = run_ids.take(pa.array(rows)).to_pylist()
            for row, rid, mi, pi, bi, ki in zip(rows.tolist(), ids, m[rows].tolist(), p[rows].tolist(),
                                                b[rows].tolist(), k[rows].tolist()):
                if rid == self._run_id(mi, pi, bi, ki):
                    out[row] = self.index_of(mi, pi, bi, ki)
        return out

    def model_positions(self, indices: np.ndarray) -> np.ndarray:
        """The model position (spec order) of each plan index."""
        return np.asarray(indices, dtype=np.int64) % max(len(self.models), 1)


def planned_models(plan: Sequence[RunTask]) -> dict[str, int]:
    """Runs planned per model of any plan (a ``LazyPlan`` answers from its axes)."""
    if isinstance(plan, LazyPlan):
        return plan.planned_by_model()
    counts: dict[str, int] = {}
    for t in plan:
        counts[t.model] = counts.get(t.model, 0) + 1
    return counts

