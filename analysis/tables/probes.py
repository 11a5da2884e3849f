"""Failure attribution of a budget probe (``../shared/spec/failures.md``, "Failure-attribution probe").

A probe crosses models × token budgets × runs under a *generous* total timeout. Per
(model, budget) cell we count outcome classes and measure latency, reasoning and answer
sizes; a cell **works** when at least ``works_min_share`` of its runs gave a usable IR, and
**works under the reference timeout** when that share is reached counting only usable runs
whose recorded latency is ≤ ``reference_timeout_s`` (the harness timeout being audited, e.g.
the study's 60 s). Per model, with ``tight`` = the smallest budget and ``room`` = the largest:

* the budget **binds** when the tight cell fails mostly by truncation and the room cell works;
* the timeout **binds** when some cell works but not under the reference timeout;
* attribution: budget only → ``budget_bound``; timeout only → ``timeout_bound``; both, or no
  cell works at all → ``fails_under_both``; neither and every cell works under the reference
  timeout → ``works_under_both``; anything else (e.g. the tight cell fails by server errors
  while the room cell works) → ``inconclusive``, with the evidence saying why.

Input: a table with columns ``model, budget_max_tokens, outcome, succeeded, latency_ms,
reasoning_chars, answer_chars`` (``probe_input_from_runs`` builds it from a runs table).
Output: rows with :data:`storage.probes.PROBE_SCHEMA`.
"""

from __future__ import annotations

import csv
import datetime as dt
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.errors import AnalysisError
from storage.probes import PROBE_SCHEMA, PROBE_SCHEMA_VERSION, probe_key
from storage.outcomes import TIMEOUT_OUTCOMES, succeeded_mask

INPUT_COLUMNS = ("model", "budget_max_tokens", "outcome", "succeeded", "latency_ms", "reasoning_chars", "answer_chars")


class Attribution(StrEnum):
    BUDGET_BOUND = "budget_bound"
    TIMEOUT_BOUND = "timeout_bound"
    WORKS_UNDER_BOTH = "works_under_both"
    FAILS_UNDER_BOTH = "fails_under_both"
    INCONCLUSIVE = "inconclusive"


class CellVerdict(StrEnum):
    WORKS = "works"  # works under the reference timeout
    TOO_SLOW = "too_slow"  # works only with the generous timeout
    BUDGET_EXHAUSTED = "budget_exhausted"  # fails, mostly truncated at the budget
    FAILS = "fails"  # fails for other reasons


@dataclass(frozen=True)
class ProbeSettings:
    """``reference_timeout_s``: the total timeout whose effect is attributed (s);
    ``works_min_share``: share of usable runs for a cell to count as working (0 < x ≤ 1)."""

    reference_timeout_s: float = 60.0
    works_min_share: float = 0.5

    def __post_init__(self) -> None:
        if not self.reference_timeout_s > 0:
            raise AnalysisError(f"reference_timeout_s must be > 0 s, got {self.reference_timeout_s}")
        if not 0 < self.works_min_share <= 1:
            raise AnalysisError(f"works_min_share must be in (0, 1], got {self.works_min_share}")


@dataclass(frozen=True)
class ProbeCell:
    """Summary of one (model, budget) cell; latencies in ms, sizes in characters."""

    model: str
    budget_max_tokens: int | None
    runs: int
    succeeded: int
    within_reference: int
    outcomes: dict[str, int]
    latency_ms_median: float | None
    latency_ms_max: float | None
    reasoning_chars_median: float | None
    answer_chars_median: float | None
    settings: ProbeSettings

    @property
    def works(self) -> bool:
        return self.runs > 0 and self.succeeded >= self.settings.works_min_share * self.runs

    @property
    def works_under_reference(self) -> bool:
        return self.runs > 0 and self.within_reference >= self.settings.works_min_share * self.runs

    @property
    def n_truncated(self) -> int:
        return self.outcomes.get("truncated", 0)

    @property
    def verdict(self) -> CellVerdict:
        if self.works_under_reference:
            return CellVerdict.WORKS
        if self.works:
            return CellVerdict.TOO_SLOW
        failures = self.runs - self.succeeded
        if self.n_truncated > 0 and 2 * self.n_truncated >= failures:
            return CellVerdict.BUDGET_EXHAUSTED
        return CellVerdict.FAILS

    @property
    def label(self) -> str:
        return "no cap" if self.budget_max_tokens is None else f"{self.budget_max_tokens} tok"

    def evidence(self) -> str:
        ref = self.settings.reference_timeout_s
        parts = [
            f"{self.runs} runs ({outcome_text(self.outcomes)})",
            f"{self.succeeded} usable, {self.within_reference} within {ref:g} s",
        ]
        if self.latency_ms_median is not None and self.latency_ms_max is not None:  # both or neither
            parts.append(f"latency median {self.latency_ms_median / 1000:.3g} s, max {self.latency_ms_max / 1000:.3g} s")
        if self.reasoning_chars_median is not None:
            parts.append(f"reasoning median {self.reasoning_chars_median:.0f} chars")
        if self.answer_chars_median is not None:
            parts.append(f"answer median {self.answer_chars_median:.0f} chars")
        return "; ".join(parts)


def outcome_text(counts: dict[str, int]) -> str:
    """``"ok=5, truncated=1"``, most frequent first, then by name."""
    return ", ".join(f"{k}={v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def probe_input_from_runs(runs: pa.Table) -> pa.Table:
    """Normalise a runs table (``storage.runs.RunStore.read_table``) to the probe input columns.

    ``succeeded`` follows :attr:`storage.records.RunRecord.succeeded` (a parsed IR). A run that
    timed out keeps its elapsed time in ``latency_ms``.
    """
    succeeded = succeeded_mask(runs)
    return pa.table(
        {
            "model": runs.column("model"),
            "budget_max_tokens": runs.column("budget_max_tokens").cast(pa.int64()),
            "outcome": runs.column("outcome"),
            "succeeded": pc.fill_null(succeeded, False),
            "latency_ms": runs.column("latency_ms").cast(pa.float64()),
            "reasoning_chars": runs.column("reasoning_chars").cast(pa.float64()),
            "answer_chars": runs.column("answer_chars").cast(pa.float64()),
        }
    )


def _median(values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    return float(np.median(values)) if values.size else None


def summarise_cells(table: pa.Table, settings: ProbeSettings = ProbeSettings()) -> list[ProbeCell]:
    """One :class:`ProbeCell` per (model, budget), sorted by model then budget (no cap last)."""
    missing = [c for c in INPUT_COLUMNS if c not in table.column_names]
    if missing:
        raise AnalysisError(f"probe input lacks columns {missing}; build it with probe_input_from_runs()")
    models = table.column("model").to_pylist()
    budgets = table.column("budget_max_tokens").to_pylist()
    outcomes = table.column("outcome").to_pylist()
    ok = np.asarray(table.column("succeeded").to_numpy(zero_copy_only=False), dtype=bool)

    def floats(name: str) -> np.ndarray:
        return np.asarray(pc.fill_null(table.column(name).cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False), dtype=np.float64)

    latency, reasoning, answer = floats("latency_ms"), floats("reasoning_chars"), floats("answer_chars")
    limit_ms = settings.reference_timeout_s * 1000.0
    within = ok & ~np.isnan(latency) & (latency <= limit_ms)
    groups: dict[tuple[str, int | None], list[int]] = {}
    for i, key in enumerate(zip(models, budgets)):
        groups.setdefault(key, []).append(i)
    cells = []
    for (model, budget), idx_list in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1] is None, kv[0][1] or 0)
    ):
        idx = np.asarray(idx_list)
        lat = latency[idx]
        finite = lat[~np.isnan(lat)]
        cells.append(
            ProbeCell(
                model=model,
                budget_max_tokens=budget,
                runs=len(idx),
                succeeded=int(ok[idx].sum()),
                within_reference=int(within[idx].sum()),
                outcomes=dict(Counter(outcomes[i] for i in idx_list)),
                latency_ms_median=_median(lat),
                latency_ms_max=float(finite.max()) if finite.size else None,
                reasoning_chars_median=_median(reasoning[idx]),
                answer_chars_median=_median(answer[idx]),
                settings=settings,
            )
        )
    return cells


def attribute(cells: Sequence[ProbeCell]) -> tuple[Attribution, str]:
    """The attribution of one model from its cells (module docstring), with the evidence."""
    if not cells:
        raise AnalysisError("attribute() needs at least one cell")
    ref = cells[0].settings.reference_timeout_s
    by_budget = sorted(((c.budget_max_tokens, c) for c in cells if c.budget_max_tokens is not None), key=lambda bc: bc[0])
    tight, room = (by_budget[0][1], by_budget[-1][1]) if len(by_budget) >= 2 else (None, None)
    budget_binds = (
        tight is not None and room is not None
        and tight.verdict is CellVerdict.BUDGET_EXHAUSTED and room.works
    )
    slow = [c for c in cells if c.works and not c.works_under_reference]
    timeout_binds = bool(slow)
    why_budget = (
        f"at {tight.label} {tight.n_truncated}/{tight.runs} runs truncated, {tight.succeeded} usable"
        f" (reasoning median {tight.reasoning_chars_median or 0:.0f} chars); at {room.label}"
        f" {room.succeeded}/{room.runs} usable" if budget_binds and tight is not None and room is not None else ""
    )
    why_timeout = "; ".join(
        f"at {c.label} {c.succeeded}/{c.runs} usable but only {c.within_reference} within {ref:g} s"
        f" (latency median {(c.latency_ms_median or 0) / 1000:.3g} s, max {(c.latency_ms_max or 0) / 1000:.3g} s)"
        for c in slow
    )
    if not any(c.works for c in cells):
        verdicts = "; ".join(f"{c.label}: {c.verdict.value} ({outcome_text(c.outcomes)})" for c in cells)
        return Attribution.FAILS_UNDER_BOTH, f"no budget gave a usable IR even with the generous timeout: {verdicts}"
    if budget_binds and timeout_binds:
        return Attribution.FAILS_UNDER_BOTH, f"budget binds: {why_budget}; and timeout binds: {why_timeout}"
    if budget_binds:
        assert room is not None  # budget_binds says so
        room_lat = f"; latency max {(room.latency_ms_max or 0) / 1000:.3g} s ≤ {ref:g} s" if room.latency_ms_max is not None else ""
        return Attribution.BUDGET_BOUND, f"{why_budget}{room_lat}"
    if timeout_binds:
        return Attribution.TIMEOUT_BOUND, why_timeout
    if all(c.works_under_reference for c in cells):
        parts = ", ".join(f"{c.label}: {c.within_reference}/{c.runs} usable within {ref:g} s" for c in cells)
        return Attribution.WORKS_UNDER_BOTH, parts
    verdicts = "; ".join(f"{c.label}: {c.verdict.value} ({outcome_text(c.outcomes)})" for c in cells)
    return Attribution.INCONCLUSIVE, f"failures not explained by budget or timeout: {verdicts}"


def probe_table(
    table: pa.Table,
    settings: ProbeSettings,
    *,
    source: str,
    campaign: str,
    probe_date: dt.date,
    computed_at: dt.datetime,
) -> pa.Table:
    """Probe rows (:data:`storage.probes.PROBE_SCHEMA`), one per (model, budget) cell."""
    if computed_at.tzinfo is None:
        raise AnalysisError("computed_at must be timezone-aware (UTC)")
    cells = summarise_cells(table, settings)
    by_model: dict[str, list[ProbeCell]] = {}
    for c in cells:
        by_model.setdefault(c.model, []).append(c)
    verdicts = {m: attribute(cs) for m, cs in by_model.items()}
    rows = []
    for c in cells:
        attribution, why = verdicts[c.model]
        n_timeout = sum(v for k, v in c.outcomes.items() if k in TIMEOUT_OUTCOMES)
        named = c.outcomes.get("ok", 0) + c.n_truncated + c.outcomes.get("empty", 0) + n_timeout
        rows.append(
            {
                "schema_version": PROBE_SCHEMA_VERSION,
                "probe_key": probe_key(source, campaign, c.model, c.budget_max_tokens),
                "probe_date": probe_date,
                "source": source,
                "campaign": campaign,
                "model": c.model,
                "budget_max_tokens": c.budget_max_tokens,
                "runs": c.runs,
                "runs_succeeded": c.succeeded,
                "succeeded_within_reference": c.within_reference,
                "n_ok": c.outcomes.get("ok", 0),
                "n_truncated": c.n_truncated,
                "n_empty": c.outcomes.get("empty", 0),
                "n_timeout": n_timeout,
                "n_other": c.runs - named,
                "outcomes": outcome_text(c.outcomes),
                "latency_ms_median": c.latency_ms_median,
                "latency_ms_max": c.latency_ms_max,
                "reasoning_chars_median": c.reasoning_chars_median,
                "answer_chars_median": c.answer_chars_median,
                "reference_timeout_s": settings.reference_timeout_s,
                "works_min_share": settings.works_min_share,
                "cell_verdict": c.verdict.value,
                "evidence": c.evidence(),
                "attribution": attribution.value,
                "attribution_evidence": why,
                "computed_at": computed_at,
            }
        )
    return pa.Table.from_pylist(rows, schema=PROBE_SCHEMA)


def outcome_of_status(status: int | None, finish_reason: str | None, answer_chars: int) -> str:
    """The outcome class of a published probe row (HTTP status + finish reason), failures.md."""
    if status is None:
        return "connect_error"  # the study logged every failure without a status this way
    if 200 <= status < 300:
        if finish_reason == "length":
            return "truncated"
        return "ok" if answer_chars > 0 else "empty"
    named = {410: "retired", 404: "not_found", 429: "rate_limited", 401: "auth_error", 403: "auth_error"}
    if status in named:
        return named[status]
    return "server_error" if status >= 500 else "client_error" if status >= 400 else "protocol_error"


def probe_input_from_study_csv(path: Path) -> tuple[pa.Table, dt.date]:
    """The study's ``results/failure_attribution.csv`` as probe input, with its audit date.

    One run per (model, budget); ``succeeded`` = ``valid_json == 1``; ``latency_ms`` =
    ``latency_s`` × 1000; ``answer_chars`` = ``content_chars``. Raises ``AnalysisError`` naming
    the file when a column is missing or the file holds several audit dates.
    """
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    need = {"audit_date", "budget", "model", "status", "finish_reason", "valid_json", "latency_s",
            "reasoning_chars", "content_chars"}
    if not rows or need - set(rows[0]):
        raise AnalysisError(f"{path}: expected columns {sorted(need)}; got {sorted(rows[0]) if rows else 'no rows'}")
    dates = {r["audit_date"] for r in rows}
    if len(dates) != 1:
        raise AnalysisError(f"{path}: holds several audit dates {sorted(dates)}; split it per date")

    def num(text: str) -> float | None:
        return float(text) if text.strip() else None

    out: dict[str, list] = {c: [] for c in INPUT_COLUMNS}
    for r in rows:
        status = int(r["status"]) if r["status"].strip() else None
        answer = int(num(r["content_chars"]) or 0)
        latency_s = num(r["latency_s"])
        out["model"].append(r["model"])
        out["budget_max_tokens"].append(int(r["budget"]))
        out["outcome"].append(outcome_of_status(status, r["finish_reason"] or None, answer))
        out["succeeded"].append(r["valid_json"].strip() == "1")
        out["latency_ms"].append(None if latency_s is None else latency_s * 1000.0)
        out["reasoning_chars"].append(num(r["reasoning_chars"]))
        out["answer_chars"].append(float(answer))
    types = {"model": pa.string(), "budget_max_tokens": pa.int64(), "outcome": pa.string(), "succeeded": pa.bool_(),
             "latency_ms": pa.float64(), "reasoning_chars": pa.float64(), "answer_chars": pa.float64()}
    table = pa.table({c: pa.array(v, type=types[c]) for c, v in out.items()})
    return table, dt.date.fromisoformat(dates.pop())
