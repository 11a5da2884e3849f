"""What a campaign has spent: tokens of every stored execution and their cost at the prices recorded
when it ran (``storage.prices``), per model and in total, by wave, for ``irbench status``."""

from __future__ import annotations

from pydantic import BaseModel, Field

from storage.prices import SPEND_COLUMNS, TokenTotals, read_prices, spend_by_model
from storage.parquet.unreadable import RowSelection, read_checked
from storage.runs import RunStore


class SpendFigures(BaseModel):
    """Tokens of some stored executions and their cost in US dollars (None: a price is missing)."""

    executions: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float | None = None


class WaveSpend(BaseModel):
    """One wave's spend: in total and per model."""

    total: SpendFigures = SpendFigures()
    models: dict[str, SpendFigures] = Field(default_factory=dict)


class SpendReport(WaveSpend):
    """The latest wave's spend (the fields inherited), each wave's, and the caps by scope."""

    waves: dict[int, WaveSpend] = Field(default_factory=dict)
    caps: dict[str, dict[str, float | int]] = Field(default_factory=dict)

__all__ = ["SpendFigures", "SpendReport", "WaveSpend", "campaign_spend", "spend_lines"]


def campaign_spend(store: RunStore, campaign: str, wave: int | None = None, *,
                   skip_corrupt: bool = False) -> dict[str, TokenTotals]:
    """Model → tokens and cost of every stored execution of ``campaign`` (``wave``: that wave's
    rows only; None: every row). An unreadable file is a StorageError naming it unless
    ``skip_corrupt`` (then it is left out, as ``status --skip-corrupt`` says)."""
    filters: dict[str, list[object]] = {"campaign": [campaign]}
    if wave is not None:
        filters["wave"] = [wave]
    table, _ = read_checked(store.dataset, skip=skip_corrupt, dedupe="executions",
                            selection=RowSelection(filters=filters, columns=list(SPEND_COLUMNS)))
    return spend_by_model(table, read_prices(store.root, campaign))


def _line(where: str, name: str, t: SpendFigures) -> str:
    cost = f"${t.cost_usd:,.4f}" if t.cost_usd is not None else "cost unknown (no prices recorded)"
    return (f"spent in {where}, {name}: {t.prompt_tokens:,} prompt + {t.completion_tokens:,} completion tokens "
            f"over {t.executions:,} executions, {cost}")


def _sum(figures: list[SpendFigures]) -> SpendFigures:
    costs = [f.cost_usd for f in figures]
    return SpendFigures(executions=sum(f.executions for f in figures), prompt_tokens=sum(f.prompt_tokens for f in figures),
                        completion_tokens=sum(f.completion_tokens for f in figures),
                        total_tokens=sum(f.total_tokens for f in figures),
                        cost_usd=None if any(c is None for c in costs) else sum(c or 0.0 for c in costs))


def spend_lines(report: SpendReport) -> list[str]:
    """Per wave (oldest first) one line per model, then the wave's total; with more than one
    wave, the total over them; then each cap against what the latest wave spent (the cap counts
    that wave). No line when nothing is stored."""
    out: list[str] = []
    for wave, spend in sorted(report.waves.items()):
        if spend.models:
            out += [_line(f"wave {wave}", m, t) for m, t in spend.models.items()]
            out.append(_line(f"wave {wave}", "total", spend.total))
    if len(report.waves) > 1 and out:
        out.append(_line(f"waves 1-{max(report.waves)}", "total", _sum([w.total for w in report.waves.values()])))
    return out + _cap_lines(report)


def _cap_lines(report: SpendReport) -> list[str]:
    """Each cap against what the latest wave spent in its scope."""
    latest = max(report.waves) if report.waves else 1
    out = []
    for scope, limits in report.caps.items():
        spent = report.total if scope == "campaign" else report.models.get(scope, SpendFigures())
        whose = "campaign" if scope == "campaign" else f"model {scope}"
        for limit, cap in limits.items():
            used = spent.cost_usd if limit == "max_cost_usd" else spent.total_tokens
            shown = "cost unknown" if used is None else (f"${used:,.4f}" if limit == "max_cost_usd" else f"{used:,} tokens")
            share = f" ({used / cap:.0%} of it)" if used is not None else ""
            capped = f"${cap:g}" if limit == "max_cost_usd" else f"{cap:,} tokens"
            out.append(f"spend cap {limit} {capped} of {whose}: wave {latest} spent {shown}{share}")
    return out
