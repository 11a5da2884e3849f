"""The report's spend table: tokens of every stored execution of a panel (a run executed twice was
paid twice) and their cost at the prices recorded when each campaign ran (``storage.prices``),
per model and in total. The prices come as data from the store, never from a campaign file."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from analysis.report.doc import Block, Cell, Note, Paragraph, Table
from storage.prices import SPEND_COLUMNS, TokenTotals, read_prices, spend_by_model, spend_total

HEADINGS = ("executions", "prompt tokens", "completion tokens", "cost (USD)")


def load_spend(data_dir: Path | None, panel: str) -> dict[str, TokenTotals] | None:
    """Model → spend of ``panel``'s stored executions (None without a readable store)."""
    if data_dir is None or not (Path(data_dir) / "runs").is_dir():
        return None
    from storage.runs import RunStore

    try:
        store = RunStore(Path(data_dir), fsync=False)
        table = store.dataset.read(filters={"panel": [panel]}, columns=list(SPEND_COLUMNS), dedupe="executions")
        return spend_by_model(table, read_prices(Path(data_dir)))
    except (OSError, pa.ArrowException, ValueError):
        return None


def _row(name: str, t: TokenTotals) -> tuple[Cell, ...]:
    cost = Cell(f"{t.cost_usd:,.4f}", t.cost_usd) if t.cost_usd is not None else Cell("unknown (no prices)", None)
    return (Cell(name, name), Cell(f"{t.executions:,}", t.executions), Cell(f"{t.prompt_tokens:,}", t.prompt_tokens),
            Cell(f"{t.completion_tokens:,}", t.completion_tokens), cost)


def spend_blocks(panel: str, spend: dict[str, TokenTotals] | None) -> list[Block]:
    """The spend table of one panel (a notice without raw runs)."""
    if not spend:
        return [Note(f"not available: tokens and cost (no raw runs of panel {panel} in --data)", "missing")]
    rows = tuple(_row(m, t) for m, t in spend.items()) + (_row("total", spend_total(spend)),)
    return [Table(("model",) + HEADINGS, rows, table_id=f"spend-{panel}"),
            Paragraph("tokens as the endpoint reported them, every stored execution; cost at the prices "
                      "recorded beside the runs when the campaign ran (DATA/prices/).")]
