"""What ``irbench analyze`` writes, per panel, under ``out_dir/<panel>/`` (panel name
percent-quoted when it is not a safe file name):

* ``cells.parquet``    one row per cell (:data:`analysis.tables.cells.CELL_SCHEMA`);
* ``models.parquet``   the model table (:mod:`analysis.tables.models`);
* ``excluded.parquet`` models below the inclusion thresholds, with the reason;
* ``pairs``, ``sensitivity``, ``drift``, ``stabilisation``, ``correctness``, ``correlations``,
  ``normalised`` ``.parquet`` (:mod:`analysis.tables.audit`, :mod:`analysis.tables.sensitivity`,
  :mod:`analysis.tables.families`); ``timeouts``/``timeout_flags`` (:mod:`analysis.tables.timeouts`);
* ``manifest.json``    seed, replicates, every option with its unit, the data window (first
  and last measurement date), package version, input row counts, ``generated_at`` (UTC).

Every file goes through :mod:`storage.parquet.atomic` (temporary name, ``os.replace``), so a reader
never sees a half-written file.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc

from analysis.options import AnalysisOptions
from analysis.tables.models import ModelTable, distinct_values
from storage.parquet.atomic import write_json_atomic, write_parquet_atomic
from storage.outcomes import succeeded_mask

MANIFEST_VERSION = 1
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$")


@dataclass(frozen=True)
class PanelResult:
    """Outputs of one panel: paths on disk and the tables written there."""

    panel: str
    directory: Path
    cells_path: Path
    models_path: Path
    excluded_path: Path
    manifest_path: Path
    cells: pa.Table
    models: ModelTable
    manifest: dict[str, Any]
    tables: dict[str, pa.Table] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)


@dataclass(frozen=True)
class AnalysisResult:
    """Everything ``run_analysis`` produced; ``panels`` is keyed by panel name."""

    data_dir: Path
    out_dir: Path
    options: AnalysisOptions
    runs_read: int
    panels: dict[str, PanelResult] = field(default_factory=dict)
    cells_imported: int = 0
    skipped_files: tuple[str, ...] = ()


def panel_dirname(panel: str) -> str:
    """A file-system-safe, reversible directory name for a panel (percent-quoting)."""
    if _SAFE_NAME.match(panel):
        return panel
    return quote(panel, safe="").replace(".", "%2E")


def _package_version() -> str:
    try:
        return importlib.metadata.version("irbench")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (irbench not installed)"


def _date_str(value: dt.date | None) -> str | None:
    return value.isoformat() if value is not None else None


def _sum(mask: pa.ChunkedArray | pa.Array) -> int:
    return int(pc.sum(mask.cast(pa.int64())).as_py() or 0)


@dataclass(frozen=True)
class ManifestInputs:
    """What a panel's manifest states about the analysis itself: the panel, where its runs were
    read, with which options, how many runs all panels held, and when it ran."""

    panel: str
    data_dir: Path
    options: AnalysisOptions
    runs_read: int
    generated_at: dt.datetime


def build_manifest(about: ManifestInputs, *, runs: pa.Table, cells: pa.Table, models: ModelTable,
                   imported: pa.Table) -> dict[str, Any]:
    """The manifest of one panel: provenance (``about``), its data window and row counts."""
    panel, data_dir, options, runs_read, generated_at = (
        about.panel, about.data_dir, about.options, about.runs_read, about.generated_at)
    # min/max per column in Arrow (a to_pylist of 700k imported dates would be 8 % of the
    # panel's analyze); nulls skipped, window_end's included
    bounds = [pc.min_max(col).as_py() for col in (runs.column("measurement_date"),
              imported.column("measurement_date"), imported.column("window_end"))]
    lows = [b["min"] for b in bounds if b["min"] is not None]
    highs = [b["max"] for b in bounds if b["max"] is not None]
    ok_mask = succeeded_mask(runs)
    return {
        "manifest_version": MANIFEST_VERSION,
        "panel": panel,
        "generated_at": generated_at.astimezone(dt.UTC).isoformat(),
        "irbench_version": _package_version(),
        "data_dir": str(data_dir),
        "seed": options.seed,
        "replicates": options.replicates,
        "options": options.described(),
        "data_window": {
            "first_measurement_date": _date_str(min(lows) if lows else None),
            "last_measurement_date": _date_str(max(highs) if highs else None),
            "unit": "UTC date",
            "includes_windows": bool(
                _sum(runs.column("date_is_window")) if runs.num_rows else 0
            ) or imported.num_rows > 0,
        },
        "input": {
            "runs_read_all_panels": runs_read,
            "runs_in_panel": runs.num_rows,
            "successful_runs_in_panel": _sum(ok_mask) if runs.num_rows else 0,
            "imported_cells_in_panel": imported.num_rows,
            "campaigns": sorted(distinct_values(runs.column("campaign"),
                                                imported.column("campaign"))),
            "models": sorted(distinct_values(runs.column("model"), imported.column("model"))),
        },
        "output": {
            "cells": cells.num_rows,
            "cells_included": _sum(cells.column("included")),
            "models_included": models.included.num_rows,
            "models_excluded": models.excluded.num_rows,
        },
    }


def write_panel(pdir: Path, tables: dict[str, pa.Table]) -> dict[str, Path]:
    """Write each table as ``pdir/<name>.parquet``; the paths by name."""
    pdir.mkdir(parents=True, exist_ok=True)
    paths = {name: pdir / f"{name}.parquet" for name in tables}
    for name, table in tables.items():
        write_parquet_atomic(table, paths[name])
    return paths


def write_manifest(manifest: dict[str, Any], pdir: Path) -> Path:
    """``pdir/manifest.json`` (fsynced: it is what readers look for last)."""
    path = pdir / "manifest.json"
    write_json_atomic(manifest, path)
    return path
