"""Terminal rendering of the model table (rich).

"Node-set-perfect" means the id *sets* of all runs agreed — not that the IRs were identical —
so the wording here never says "perfect reproducibility".
"""

from __future__ import annotations

from rich.table import Table

from analysis.tables.models import ModelTable


def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def models_rich_table(table: ModelTable, title: str) -> Table:
    """Columns: rank, model, prompts, mean Jaccard, ID-stability, node-set-perfect (k/n cells),
    mean nodes. Rows in rank order."""
    out = Table(title=title)
    out.add_column("rank", justify="right")
    out.add_column("model")
    out.add_column("prompts", justify="right")
    out.add_column("mean Jaccard", justify="right")
    out.add_column("ID-stability", justify="right")
    out.add_column("node-set-perfect", justify="right")
    out.add_column("mean nodes", justify="right")
    for row in table.included.to_pylist():
        out.add_row(
            str(row["rank"]),
            row["model"],
            str(row["n_prompts"]),
            _fmt(row["mean_jaccard"]),
            _fmt(row["id_stability"]),
            f"{row['perfect']}/{row['n_cells']}",
            _fmt(row["mean_nodes"], 1),
        )
    return out


def excluded_lines(table: ModelTable) -> list[str]:
    """One line per model left out of the table, e.g.
    ``"glm-4.7: 2 prompts with ≥2 successful runs; needs ≥3 (5 successful runs in total)"``."""
    lines = []
    for row in table.excluded.to_pylist():
        runs = row["runs_ok"]
        lines.append(
            f"{row['model']}: {row['reason']} "
            f"({runs} successful run{'' if runs == 1 else 's'} in total)"
        )
    return lines
