"""``irbench plan``: what a campaign will take before it runs (runs, tokens, time, money), from
the campaign file, its corpus and the store; no call is made. The work is
``orchestrator.campaign.preview``; this module parses, prints and fails in one line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.data_option import store_root

from orchestrator.cli.user_errors import fail

if TYPE_CHECKING:
    from orchestrator.campaign.cap_preview import CapCheck
    from orchestrator.campaign.preview import ModelPreview, PlanPreview

__all__ = ["cap_lines", "plan_command", "preview_table"]


def plan_command(
    campaign: Annotated[Path, typer.Argument(help="Campaign TOML file.", exists=True, dir_okay=False)],
    data: Annotated[Path, typer.Option("--data", parser=store_root, envvar="IRBENCH_DATA", help="Dataset root whose stored runs count "
                                       "as done (or IRBENCH_DATA).")] = Path("data"),
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (per model and total) and nothing "
                                          "else.")] = False,
) -> None:
    """Preview a campaign without calling anything: runs planned, stored and still to run per model,
    prompt and completion tokens, the cost range (with prices) and the least time it can take.

    Example: irbench plan examples/demo.toml --data data/
    """
    from orchestrator.campaign.corpus import load_corpus
    from orchestrator.campaign.instruction import load_instruction
    from orchestrator.campaign.preview import preview_plan
    from orchestrator.campaign.spec import load_campaign
    from orchestrator.campaign.waves import current_wave
    from orchestrator.cli.shell import console, no_store_note, warn
    from storage.runs import RunStore
    from workers.errors import IrbenchError

    try:
        spec = load_campaign(campaign)
        corpus = load_corpus(spec.corpus, spec.base_dir)
        wave = current_wave(data, spec.name).number  # what a plain `irbench run` would run: the latest wave
        preview = preview_plan(spec, corpus, load_instruction(spec.instruction), RunStore(data), wave=wave)
    except IrbenchError as exc:
        fail(exc)
    if as_json:
        sys.stdout.write(preview.model_dump_json() + "\n")
        return
    if (note := no_store_note(data)) is not None:
        warn(note)
    console.print(preview_table(preview))
    console.print(f"prompt tokens: {preview.token_count}", soft_wrap=True)
    console.print("time: the least the still-to-run runs can take under each model's requests_per_minute, "
                  "tokens_per_minute and max_concurrency x median latency (models run side by side)", soft_wrap=True)
    for line in cap_lines(preview):
        console.print(line, soft_wrap=True, markup=False)


def _num(value: int | None, unit: str = "") -> str:
    if value is None:
        return "no cap"
    return f"{value:,}{unit}"


def _usd(low: float | None, high: float | None) -> str:
    if low is None:
        return "no prices"
    return f"${low:,.2f} - " + (f"${high:,.2f}" if high is not None else "? (no max_tokens)")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _row(m: ModelPreview) -> list[str]:
    latency = f"{m.latency_ms_median:,.0f} ms" if m.latency_ms_median is not None else "unknown"
    rate = f"{m.requests_per_minute:g}/min" if m.requests_per_minute else "-"
    return [m.model, f"{m.planned:,}", f"{m.stored:,}", f"{m.to_run:,}", f"{m.prompt_tokens_to_run:,}",
            _num(m.completion_tokens_max_to_run), _usd(m.cost_usd_min, m.cost_usd_max), rate,
            str(m.max_concurrency or "-"), latency, _duration(m.makespan_min_s)]


def preview_table(preview: PlanPreview):  # -> rich.table.Table
    """The preview as one table, a row per model and the total."""
    from rich.table import Table

    t = preview.total
    table = Table(title=f"campaign {preview.campaign}: {t.to_run:,} of {t.planned:,} runs still to run (no call made)")
    for col in ("model", "planned", "stored", "to run", "prompt tokens", "completion tokens (max)", "cost",
                "rate", "concurrency", "latency (median)", "time (at least)"):
        table.add_column(col)
    for m in preview.models.values():
        table.add_row(*_row(m))
    table.add_row(*_row(t), style="bold")
    return table


def _dollars(value: float) -> str:
    return f"${value:,.2f}" if value >= 10 else f"${value:,.4f}"  # a test campaign's cents still show


def _amount(check: CapCheck, value: float | None) -> str:
    if value is None:
        return "?"
    return _dollars(value) if check.limit == "max_cost_usd" else f"{value:,.0f} tokens"


def cap_lines(preview: PlanPreview) -> list[str]:
    """One line per spend cap: the cap, what the wave spent, what the runs still to run add, and
    whether they fit (``orchestrator.campaign.cap_preview``)."""
    out = []
    for c in preview.caps:
        whose = "campaign" if c.scope == "campaign" else f"model {c.scope}"
        upper = _amount(c, c.to_run_max) if c.to_run_max is not None or c.to_run_min is None else "? (no max_tokens)"
        adds = f"{_amount(c, c.to_run_min)} - {upper}"
        out.append(f"spend cap {c.limit} {_amount(c, c.cap)} of {whose}: wave {preview.wave or 1} spent {_amount(c, c.spent)}, "
                   f"the runs still to run add {adds}: {c.verdict}")
    return out
