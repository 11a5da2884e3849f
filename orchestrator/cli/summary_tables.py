"""Short, readable summaries of ``irbench compact`` and ``irbench import-artifact`` (details with -v).

Each function takes the library's report value and returns rich renderables; the CLI prints
them on stdout. Nothing here reads or writes data.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from orchestrator.jobs.artifact_import import ImportReport
from orchestrator.jobs.availability import ArtifactImport
from storage.parquet.compaction import CompactionReport


def compaction_tables(report: CompactionReport, *, verbose: bool = False) -> list[RenderableType]:
    """One summary row for the dataset; with ``verbose`` also one row per date partition."""
    parts = report.partitions
    merged = [p for p in parts if p.files_after < p.files_before]
    skipped = [p for p in parts if p.skipped]
    t = Table(title=f"compaction of {report.dataset}/")
    for col in ("partitions", "merged", "skipped", "files before → after", "rows before → after", "tmp removed"):
        t.add_column(col, justify="right")
    t.add_row(str(len(parts)), str(len(merged)), str(len(skipped)),
              f"{report.files_before} → {report.files_after}",
              f"{sum(p.rows_before for p in parts)} → {sum(p.rows_after for p in parts)}",
              str(report.tmp_files_removed))
    out: list[RenderableType] = [t]
    if verbose and parts:
        d = Table(title="per partition (measurement_date)")
        for col in ("partition", "files", "rows", "note"):
            d.add_column(col)
        for p in parts:
            note = p.skipped or ("finished an interrupted compaction" if p.recovered else "")
            d.add_row(p.partition.isoformat(), f"{p.files_before} → {p.files_after}",
                      f"{p.rows_before} → {p.rows_after}", note)
        out.append(d)
    elif skipped:
        out.append(Text(f"{len(skipped)} partition(s) skipped; -v says why", style="yellow"))
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def import_tables(report: ImportReport, availability: ArtifactImport, *, verbose: bool = False) -> list[RenderableType]:
    """What was read and written, coverage per panel × campaign; ``verbose`` lists every
    incomplete cell and every prompt file missing from the corpus."""
    t = Table(title="artifact import (newly written = 0 on a re-import)")
    for col in ("dataset", "read", "newly written", "detail"):
        t.add_column(col)
    t.add_row("runs (raw IRs)", str(report.runs_read), str(report.runs_written),
              ", ".join(f"{k} {v}" for k, v in sorted(report.runs_by_outcome.items())) or "–")
    t.add_row("cells (CSV rows)", str(report.cells_read), str(report.cells_written),
              _plural(len(report.cells_by_campaign), "campaign"))
    t.add_row("availability checks", str(availability.availability_rows), "", f"{len(availability.retired_models)} models retired")
    t.add_row("probe rows", str(availability.probe_rows), "", "")
    out: list[RenderableType] = [t]

    groups: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for c in report.coverage:
        g = groups[(c.panel, c.campaign)]
        g[0] += 1
        g[1] += int(c.complete)
        g[2] += c.runs_found
        g[3] += c.csv_successful_runs
    if groups:
        cov = Table(title="coverage: CSV cells whose successful runs all exist as raw IRs")
        for col in ("panel", "campaign", "cells", "complete", "raw runs found / CSV successful runs"):
            cov.add_column(col, justify="left" if col in ("panel", "campaign") else "right")
        for (panel, campaign), (cells, complete, found, expected) in sorted(groups.items()):
            cov.add_row(panel, campaign, str(cells), str(complete), f"{found}/{expected}")
        out.append(cov)
    incomplete = [c for c in report.coverage if not c.complete]
    if verbose:
        out += [Text(f"  {c.panel} {c.campaign} {c.model} {c.prompt}: {c.runs_found}/{c.csv_successful_runs} runs found")
                for c in incomplete]
        if report.missing_prompt_files:
            out.append(Text("prompt files not in corpus/ (keyed by name): " + ", ".join(report.missing_prompt_files)))
    else:
        hidden = []
        if incomplete:
            hidden.append(_plural(len(incomplete), "incomplete cell"))
        if report.missing_prompt_files:
            hidden.append(_plural(len(report.missing_prompt_files), "prompt file") + " not in corpus/")
        if hidden:
            out.append(Text(f"{' and '.join(hidden)}: listed with -v"))
    out += _lines("warning: ", report.warnings) + _lines("note: ", availability.notes)
    return out


def _lines(prefix: str, items: Iterable[str]) -> list[RenderableType]:
    return [Text(prefix + s) for s in items]
