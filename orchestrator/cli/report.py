"""``irbench report``: the command function (the CLI module registers it with
``app.command("report")(report_command)``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from orchestrator.cli.data_option import store_root
from rich.console import Console

from orchestrator.cli.user_errors import fail


def report_command(
    data: Annotated[Path, typer.Option("--data", parser=store_root, envvar="IRBENCH_DATA", help="Dataset root (runs under DATA/runs/, "
                                       "availability checks under DATA/availability/).")] = Path("data"),
    out: Annotated[Path, typer.Option("--out", help="Where report.html, report.md and figures/ go.")] = Path("report"),
    analysis: Annotated[Optional[Path], typer.Option(
        "--analysis", help="Existing `irbench analyze` output directory; when omitted, the "
        "analysis is run first into OUT/analysis.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of every resampling (only when analysing).")] = 20260601,
    replicates: Annotated[int, typer.Option(help="Bootstrap replicates (only when analysing).")] = 10_000,
    min_runs: Annotated[int, typer.Option(help="Successful runs a cell needs (only when analysing).")] = 2,
    min_prompts: Annotated[int, typer.Option(help="Prompts a model needs (only when analysing).")] = 3,
    max_table_rows: Annotated[int, typer.Option(help="Rows shown of long tables (provenance, pairs); "
                                                "full tables stay in the Parquet outputs.")] = 1000,
    wave: Annotated[str, typer.Option("--wave", help="Measurement wave reported: 'latest' (each campaign's), "
                                      "a number, or 'all'.")] = "latest",
) -> None:
    """Write a dated, self-contained report (report.html with embedded plots, and report.md).

    Example: irbench report --data data/ --out report/
    Example: irbench report --data data/ --analysis out/ --out report/
    """
    from analysis.pipeline import run_analysis
    from analysis.options import AnalysisOptions
    from analysis.report.build import build_report
    from analysis.report.sections import ReportOptions
    from orchestrator.jobs.analysis_progress import StageProgress
    from storage.wave_selection import WaveSelection
    from workers.errors import IrbenchError

    console = Console()
    started = time.monotonic()
    try:
        waves = WaveSelection.parse(wave)
        waves.resolve(data)  # a wave the store lacks is a one-line error before any work
        if analysis is None:
            analysis = out / "analysis"
            options = AnalysisOptions(seed=seed, replicates=replicates, min_runs=min_runs,
                                      min_prompts=min_prompts, waves=waves)
            with StageProgress(console, title="analyze") as stages:
                run_analysis(data, analysis, options, progress=stages.report)
            console.print(f"analysis outputs: {analysis}")
        with StageProgress(console, title="report") as stages:
            paths = build_report(analysis, out, data_dir=data, progress=stages.report,
                                 options=ReportOptions(max_table_rows=max_table_rows, waves=waves))
    except (IrbenchError, ValueError, OSError) as exc:  # ReportInputError is an IrbenchError
        fail(exc)
    console.print(f"report: {paths.html} ({paths.html_bytes / 1e6:.2f} MB), {paths.md} "
                  f"({len(paths.figures)} figures) in {time.monotonic() - started:.1f} s")
