"""What a campaign has spent: tokens of every stored execution and their cost at the prices recorded
when it ran (``storage.prices``), per model and in total, for ``irbench status``."""

from __future__ import annotations

from storage.prices import SPEND_COLUMNS, TokenTotals, read_prices, spend_by_model, spend_total
from storage.parquet.unreadable import RowSelection, read_checked
from storage.runs import RunStore

__all__ = ["campaign_spend", "spend_lines"]


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


def _line(name: str, t: TokenTotals) -> str:
    cost = f"${t.cost_usd:,.4f}" if t.cost_usd is not None else "cost unknown (no prices recorded)"
    return (f"spent {name}: {t.prompt_tokens:,} prompt + {t.completion_tokens:,} completion tokens "
            f"over {t.executions:,} executions, {cost}")


def spend_lines(by_model: dict[str, TokenTotals]) -> list[str]:
    """One line per model, then the total (none when nothing is stored)."""
    if not by_model:
        return []
    return [*(_line(m, t) for m, t in by_model.items()), _line("total", spend_total(by_model))]
