"""Console output of an analysis: the per-model table of each panel and where files went."""

from __future__ import annotations

from rich.console import Console

from analysis.analyze import AnalysisResult
from analysis.render import excluded_lines, models_rich_table


def print_result(result: AnalysisResult, console: Console) -> None:
    for name, panel in result.panels.items():
        window = panel.manifest.get("data_window") or {}
        dates = f"{window.get('first_measurement_date', '?')} … {window.get('last_measurement_date', '?')}" if isinstance(window, dict) else str(window)
        console.print(models_rich_table(panel.models, f"panel {name} — measured {dates}"))
        for line in excluded_lines(panel.models):
            console.print(f"  excluded: {line}")
        console.print(f"  outputs: {panel.directory}")
