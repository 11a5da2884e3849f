"""What a campaign will cost before it runs: counts, tokens, time and money, per model and in
total, computed from the axes and one column-projected scan of the store, with no call made
and no ``RunTask`` built (a 10M-run plan previews in seconds: ``bench/plan_preview.py``).

Per model: runs planned (prompts × budgets × runs), already stored, still to run (stored runs
whose latest execution was ``cancelled`` count as still to run: a plain ``irbench run`` resumes
them); prompt tokens of the planned and of the still-to-run runs; the completion-token upper
bound of the still-to-run runs (the budget, else the model's ``max_tokens``; None = no cap); the
cost range of the still-to-run runs (lower: their prompt tokens at the input price; upper: plus
every completion token they may produce at the output price; None without prices or a cap); and
the makespan's lower bound for them (``makespan_bound_s``). With spend caps, each cap against
those bounds (``orchestrator.campaign.cap_preview``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel

from orchestrator.campaign.cap_preview import CapCheck, ScopeFigures, cap_checks
from orchestrator.campaign.corpus import Corpus
from orchestrator.campaign.instruction import Instruction
from orchestrator.campaign.cost import campaign_prices
from orchestrator.campaign.spec import CampaignSpec, ModelSpec
from orchestrator.campaign.tokens import CharsPerToken, TokenCounter
from storage.outcomes import UNFINISHED, Outcome
from storage.parquet.unreadable import RowSelection, read_checked
from storage.prices import TokenPrice
from storage.runs import RunStore
from workers.spend import CAMPAIGN_SCOPE

_STORED_COLUMNS = ["run_id", "model", "prompt_sha256", "budget_max_tokens", "run_index", "outcome",
                   "measured_at", "execution_id", "finished_at"]


class ModelPreview(BaseModel):
    """One model's figures (tokens in tokens, money in US dollars, times in seconds)."""

    model: str
    planned: int
    stored: int
    to_run: int
    prompt_tokens_planned: int
    prompt_tokens_to_run: int
    completion_tokens_max_to_run: int | None  # None: no max_tokens, no budget: unbounded
    cost_usd_min: float | None = None
    cost_usd_max: float | None = None
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    max_concurrency: int | None = None
    latency_ms_median: float | None = None  # of the model's stored ok executions; None: unknown
    makespan_min_s: float | None = None  # None: no bound known (no rate limit, latency unknown)


class PlanPreview(BaseModel):
    """The whole campaign: per model, and the totals (``total.model`` is ``"total"``)."""

    campaign: str
    wave: int | None  # the wave counted as stored; None: every stored row
    token_count: str  # how prompt tokens were counted, with its error bound
    models: dict[str, ModelPreview]
    total: ModelPreview
    caps: list[CapCheck] = []  # one per spend cap (scope and limit), against the wave planned


@dataclass(frozen=True)
class _Axes:
    """The plan's axes: per corpus prompt its sha256 and token count, the budgets, the runs."""

    shas: list[str]
    prompt_tokens: np.ndarray  # int64, one per prompt
    budgets: Sequence[int | None]
    runs: int


def preview_plan(
    spec: CampaignSpec, corpus: Corpus, instruction: Instruction, store: RunStore, *,
    counter: TokenCounter | None = None, wave: int | None = None,
) -> PlanPreview:
    """The preview of ``spec`` over ``corpus`` against what ``store`` holds (``wave``: count only
    that wave's rows as stored, and its spend against the caps; None: every row, and the spend of
    wave 1). Makes no call."""
    counter = counter or CharsPerToken()
    messages = [instruction.render(p.name, p.text) for p in corpus.prompts]
    axes = _Axes([p.sha256 for p in corpus.prompts], np.asarray(counter.count_many(messages), dtype=np.int64),
                 list(spec.budgets) if spec.budgets else [None], spec.runs)
    stored = _stored_rows(spec, store, wave)
    latency = _median_ok_latency(store, [m.name for m in spec.models.values()])
    prices = campaign_prices(spec)
    models = {m.name: _model_preview(m, axes, _rows_of(stored, m.name, axes), prices[m.name], latency.get(m.name))
              for m in spec.models.values()}
    total = _total(list(models.values()))
    figures = {name: _figures(m) for name, m in [(CAMPAIGN_SCOPE, total), *models.items()]}
    return PlanPreview(campaign=spec.name, wave=wave, token_count=counter.describe(), models=models, total=total,
                       caps=cap_checks(spec, store, wave or 1, figures))


def _figures(m: ModelPreview) -> ScopeFigures:
    return ScopeFigures(runs=m.to_run, prompt_tokens=m.prompt_tokens_to_run,
                        completion_tokens_max=m.completion_tokens_max_to_run, cost_usd_min=m.cost_usd_min,
                        cost_usd_max=m.cost_usd_max)


def _stored_rows(spec: CampaignSpec, store: RunStore, wave: int | None) -> pa.Table:
    """The latest execution of each stored run of this campaign (projected columns)."""
    filters: dict[str, list[object]] = {"campaign": [spec.name]}
    if wave is not None:
        filters["wave"] = [wave]
    table, _ = read_checked(store.dataset, skip=False, selection=RowSelection(filters=filters, columns=_STORED_COLUMNS))
    return table


def _rows_of(stored: pa.Table, model: str, axes: _Axes) -> pa.Table:
    """``stored`` rows of ``model`` that belong to the plan (prompt in the corpus, budget on the
    axis, run index below ``runs``), with the prompt's index in ``axes.shas`` as ``prompt_ix``."""
    if stored.num_rows == 0:
        return stored.append_column("prompt_ix", pa.array([], pa.int32()))
    rows = stored.filter(pc.equal(stored.column("model"), model))
    ix = pc.index_in(rows.column("prompt_sha256"), value_set=pa.array(axes.shas, pa.string()))
    budgets = [b for b in axes.budgets if b is not None]
    budget_ok = (pc.is_in(rows.column("budget_max_tokens"), value_set=pa.array(budgets, pa.int64())) if budgets
                 else pc.is_null(rows.column("budget_max_tokens")))
    keep = pc.and_(pc.and_(pc.is_valid(ix), pc.fill_null(budget_ok, False)), pc.less(rows.column("run_index"), axes.runs))
    return rows.append_column("prompt_ix", ix).filter(keep)


def _completion_cap(model: ModelSpec, budget: int | None) -> int | None:
    return budget if budget is not None else model.max_tokens


def _model_preview(model: ModelSpec, axes: _Axes, rows: pa.Table, price: TokenPrice,
                   latency_ms: float | None) -> ModelPreview:
    n_prompts, n_budgets = len(axes.shas), len(axes.budgets)
    planned = n_prompts * n_budgets * axes.runs
    planned_prompt = int(axes.prompt_tokens.sum()) * n_budgets * axes.runs
    unfinished = pa.array(sorted(o.value for o in UNFINISHED))
    done = rows.filter(pc.invert(pc.is_in(rows.column("outcome"), value_set=unfinished))) if rows.num_rows else rows
    done_ix = done.column("prompt_ix").to_numpy(zero_copy_only=False) if done.num_rows else np.zeros(0, np.int64)
    to_run = planned - done.num_rows
    prompt_to_run = planned_prompt - int(axes.prompt_tokens[done_ix].sum())
    caps = [_completion_cap(model, b) for b in axes.budgets]
    completion: int | None = None
    if all(c is not None for c in caps):
        per_budget_done = {b: 0 for b in axes.budgets}
        if done.num_rows:
            for b, n in zip(*_value_counts(done.column("budget_max_tokens"))):
                per_budget_done[b] = n
        completion = sum(int(c or 0) * (n_prompts * axes.runs - per_budget_done[b]) for b, c in zip(axes.budgets, caps))
    low = price.cost_usd(prompt_to_run, 0)
    high = price.cost_usd(prompt_to_run, completion) if completion is not None else None
    return ModelPreview(
        model=model.name, planned=planned, stored=rows.num_rows, to_run=to_run,
        prompt_tokens_planned=planned_prompt, prompt_tokens_to_run=prompt_to_run,
        completion_tokens_max_to_run=completion, cost_usd_min=low, cost_usd_max=high,
        requests_per_minute=model.requests_per_minute, tokens_per_minute=model.tokens_per_minute,
        max_concurrency=model.max_concurrency, latency_ms_median=latency_ms,
        makespan_min_s=makespan_bound_s(model, to_run, prompt_to_run, latency_ms),
    )


def _value_counts(column: pa.ChunkedArray) -> tuple[list[int | None], list[int]]:
    counts = pc.value_counts(column).to_pylist()
    return [c["values"] for c in counts], [c["counts"] for c in counts]


def makespan_bound_s(model: ModelSpec, runs: int, prompt_tokens: int, latency_ms: float | None) -> float | None:
    """The least time ``runs`` calls of ``model`` can take (seconds): the largest of ``runs`` at
    ``requests_per_minute``, ``prompt_tokens`` at ``tokens_per_minute`` (completion tokens only
    add to it) and ``runs`` × latency ÷ ``max_concurrency``; None when none of them is known."""
    if runs <= 0:
        return 0.0
    bounds = []
    if model.requests_per_minute:
        bounds.append(runs / model.requests_per_minute * 60.0)
    if model.tokens_per_minute:
        bounds.append(prompt_tokens / model.tokens_per_minute * 60.0)
    if latency_ms is not None:
        bounds.append(math.ceil(runs / (model.max_concurrency or 1)) * latency_ms / 1000.0 if model.max_concurrency
                      else latency_ms / 1000.0)
    return max(bounds) if bounds else None


def _median_ok_latency(store: RunStore, models: Sequence[str]) -> dict[str, float]:
    """Model → median ``latency_ms`` of its stored ``ok`` executions (any campaign)."""
    table, _ = read_checked(store.dataset, skip=False, dedupe=False, selection=RowSelection(
        filters={"model": list(models), "outcome": [Outcome.OK.value]}, columns=["model", "latency_ms"]))
    if table.num_rows == 0:
        return {}
    out: dict[str, float] = {}
    model_col = table.column("model").to_numpy(zero_copy_only=False)
    lat = table.column("latency_ms").to_numpy(zero_copy_only=False).astype(np.float64)
    for name in np.unique(model_col):
        values = lat[(model_col == name) & ~np.isnan(lat)]
        if values.size:
            out[str(name)] = float(np.median(values))
    return out


def _sum_or_none(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else float(sum(v for v in values if v is not None))


def _total(ms: Sequence[ModelPreview]) -> ModelPreview:
    completions = [m.completion_tokens_max_to_run for m in ms]
    spans = [m.makespan_min_s for m in ms if m.makespan_min_s is not None]
    return ModelPreview(
        model="total", planned=sum(m.planned for m in ms), stored=sum(m.stored for m in ms),
        to_run=sum(m.to_run for m in ms), prompt_tokens_planned=sum(m.prompt_tokens_planned for m in ms),
        prompt_tokens_to_run=sum(m.prompt_tokens_to_run for m in ms),
        completion_tokens_max_to_run=None if any(c is None for c in completions) else sum(c or 0 for c in completions),
        cost_usd_min=_sum_or_none([m.cost_usd_min for m in ms]), cost_usd_max=_sum_or_none([m.cost_usd_max for m in ms]),
        # models run side by side: the campaign takes at least as long as its slowest model
        makespan_min_s=max(spans) if spans else None,
    )
