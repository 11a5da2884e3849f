"""What the viewer serves and how much it sends per page (:class:`ViewerConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from storage.wave_selection import WaveSelection


@dataclass(frozen=True)
class ViewerConfig:
    """Inputs and limits of one viewer process.

    data_dir: dataset root (runs under ``data_dir/runs/``); analysis_dir: ``irbench analyze``
    output (one subdirectory per panel) or None; report_html: an ``irbench report`` page served at
    ``/report`` (None: not served); page_size / max_page_size: runs per list page
    and the cap on ``limit``; cells_page_size: cells per page of a model's page; max_cell_runs: runs shown in full on one cell page; max_pair_runs: runs of a cell whose pairwise diffs
    ``/api/cells`` computes (n·(n−1)/2 pairs); max_diff_lines:
    lines of each side a text diff compares; max_text_chars: characters of one stored text
    shown on a page (the run page links the full text as plain text); max_prompt_chars: characters
    of a prompt and of the message sent shown on a page (a "show all" link serves the whole
    text as plain text); threads: DuckDB worker
    threads (the machine's cores are shared with workers); memory_limit_mb: DuckDB's memory cap
    (it pages its index file beyond it); work_dir: where the index file's temporary directory
    goes (None: the system temp directory); waves: the measurement waves the pages show (default
    each campaign's latest; every wave's runs are indexed, for a cell's runs by wave and ``/waves``).
    """

    data_dir: Path
    analysis_dir: Path | None = None
    report_html: Path | None = None
    page_size: int = 50
    max_page_size: int = 500
    cells_page_size: int = 200
    max_cell_runs: int = 200
    max_pair_runs: int = 50
    max_diff_lines: int = 2000
    max_text_chars: int = 200_000
    max_prompt_chars: int = 20_000
    threads: int = 2
    memory_limit_mb: int = 1024
    work_dir: Path | None = None
    waves: WaveSelection = field(default_factory=WaveSelection)

    def __post_init__(self) -> None:
        for name in ("page_size", "max_page_size", "cells_page_size", "max_cell_runs", "max_pair_runs", "max_diff_lines",
                     "max_text_chars", "max_prompt_chars", "threads", "memory_limit_mb"):
            if getattr(self, name) < 1:
                raise ValueError(f"ViewerConfig.{name} must be >= 1")


def find_analysis_dir(data_dir: Path) -> Path | None:
    """The analysis outputs beside a data directory, if any: ``DATA/../out`` (what ``irbench
    demo`` and ``irbench analyze`` write by default), ``DATA/../analysis``, ``DATA/out``."""
    data_dir = Path(data_dir)
    for candidate in (data_dir.parent / "out", data_dir.parent / "analysis", data_dir / "out"):
        if candidate.is_dir() and any(candidate.glob("*/models.parquet")) or (
            candidate / "models.parquet"
        ).is_file():
            return candidate
    return None


def find_report(data_dir: Path) -> Path | None:
    """``DATA/../report/report.html`` (where ``irbench demo`` writes it), if present."""
    candidate = Path(data_dir).parent / "report" / "report.html"
    return candidate if candidate.is_file() else None
