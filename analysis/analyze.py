"""``irbench analyze``: run store → per-panel cell and model tables plus a manifest.

Inputs: the data directory of a :class:`storage.runs.RunStore` and :class:`AnalysisOptions`.
Outputs, per panel, under ``out_dir/<panel>/`` (panel name percent-quoted when it is not a
safe file name):

* ``cells.parquet``    one row per cell (:data:`analysis.cells.CELL_SCHEMA`);
* ``models.parquet``   the model table (:mod:`analysis.tables`);
* ``excluded.parquet`` models below the inclusion thresholds, with the reason;
* ``manifest.json``    seed, replicates, every option with its unit, the data window (first
  and last measurement date), package version, input row counts, ``generated_at`` (UTC).

Every file is written to a temporary name in the same directory and moved into place with
``os.replace``, so a reader never sees a half-written file.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from analysis.cells import build_cells
from analysis.options import AnalysisOptions
from analysis.tables import ModelTable, model_table
from storage.errors import StorageError

MANIFEST_VERSION = 1
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$")


class NoRunsError(StorageError, ValueError):
    """The store (after filters) holds no run records to analyse.

    Also a ValueError: the input (directory/filters) is wrong, and callers that catch bad
    input as ValueError (the CLI) report it as a one-line error instead of a traceback.
    """


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


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


@dataclass(frozen=True)
class AnalysisResult:
    """Everything ``run_analysis`` produced; ``panels`` is keyed by panel name."""

    data_dir: Path
    out_dir: Path
    options: AnalysisOptions
    runs_read: int
    panels: dict[str, PanelResult] = field(default_factory=dict)


# ---------------------------------------------------------------- atomic writes


def _tmp_beside(path: Path) -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def write_parquet_atomic(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` via a temporary file and ``os.replace``."""
    tmp = _tmp_beside(path)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(obj: Any, path: Path) -> None:
    """Write ``obj`` as indented UTF-8 JSON via a temporary file, fsync and ``os.replace``."""
    tmp = _tmp_beside(path)
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=2, ensure_ascii=False, sort_keys=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def panel_dirname(panel: str) -> str:
    """A file-system-safe, reversible directory name for a panel (percent-quoting)."""
    if _SAFE_NAME.match(panel):
        return panel
    return quote(panel, safe="").replace(".", "%2E")


# ---------------------------------------------------------------- pipeline


def _package_version() -> str:
    try:
        return importlib.metadata.version("irbench")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (irbench not installed)"


def _read_runs(data_dir: Path, options: AnalysisOptions) -> pa.Table:
    # Imported here so the rest of the analysis package works before/without the store module.
    from storage.runs import RunStore

    if not data_dir.is_dir():
        raise NoRunsError(
            f"data directory {data_dir} does not exist; run a campaign first "
            "(`irbench run <campaign.toml>`) or pass the directory that holds its runs"
        )
    runs = RunStore(data_dir).read_table(
        date_from=options.date_from,
        date_to=options.date_to,
        campaigns=options.campaigns,
        models=options.models,
    )
    if runs.num_rows == 0:
        filters = {
            k: v
            for k, v in options.model_dump(
                include={"date_from", "date_to", "campaigns", "models"}
            ).items()
            if v is not None
        }
        where = f" matching {filters}" if filters else ""
        raise NoRunsError(
            f"no run records in {data_dir}{where}; run a campaign first "
            "(`irbench run <campaign.toml>`) or widen the date/campaign/model filters"
        )
    return runs


def _date_str(value: dt.date | None) -> str | None:
    return value.isoformat() if value is not None else None


def _manifest(
    *,
    panel: str,
    data_dir: Path,
    options: AnalysisOptions,
    runs: pa.Table,
    runs_read: int,
    cells: pa.Table,
    models: ModelTable,
    generated_at: dt.datetime,
) -> dict[str, Any]:
    dates = runs.column("measurement_date")
    ok_mask = pc.and_(
        pc.is_in(runs.column("parse_outcome"), value_set=pa.array(["ok", "repaired"])),
        pc.is_valid(runs.column("ir_json")),
    )
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
            "first_measurement_date": _date_str(pc.min(dates).as_py()),
            "last_measurement_date": _date_str(pc.max(dates).as_py()),
            "unit": "UTC date",
        },
        "input": {
            "runs_read_all_panels": runs_read,
            "runs_in_panel": runs.num_rows,
            "successful_runs_in_panel": int(pc.sum(ok_mask.cast(pa.int64())).as_py() or 0),
            "campaigns": sorted(set(runs.column("campaign").to_pylist())),
            "models": sorted(set(runs.column("model").to_pylist())),
        },
        "output": {
            "cells": cells.num_rows,
            "cells_included": int(pc.sum(cells.column("included").cast(pa.int64())).as_py() or 0),
            "models_included": models.included.num_rows,
            "models_excluded": models.excluded.num_rows,
        },
    }


def run_analysis(
    data_dir: Path,
    out_dir: Path,
    options: AnalysisOptions | None = None,
    *,
    now: Callable[[], dt.datetime] = _utc_now,
) -> AnalysisResult:
    """Read the store, build cells and the model table per panel, write them with a manifest.

    ``now`` is the clock stamped into ``generated_at`` (injected for reproducible tests).
    Raises :class:`NoRunsError` when nothing matches, naming the directory and the filters.
    """
    options = options or AnalysisOptions()
    data_dir = Path(data_dir)
    out_dir = Path(out_dir)
    runs = _read_runs(data_dir, options)
    runs_read = runs.num_rows
    panels = sorted(set(runs.column("panel").to_pylist()))
    if options.panel is not None:
        if options.panel not in panels:
            raise NoRunsError(
                f"panel {options.panel!r} has no runs in {data_dir} (with the given filters); "
                f"panels present: {panels}"
            )
        panels = [options.panel]

    generated_at = now()
    results: dict[str, PanelResult] = {}
    for panel in panels:
        panel_runs = runs.filter(pc.equal(runs.column("panel"), panel))
        cells = build_cells(panel_runs, min_runs=options.min_runs)
        models = model_table(cells, min_prompts=options.min_prompts, min_runs=options.min_runs)
        pdir = out_dir / panel_dirname(panel)
        pdir.mkdir(parents=True, exist_ok=True)
        paths = {
            name: pdir / f"{name}.parquet" for name in ("cells", "models", "excluded")
        }
        write_parquet_atomic(cells, paths["cells"])
        write_parquet_atomic(models.included, paths["models"])
        write_parquet_atomic(models.excluded, paths["excluded"])
        manifest = _manifest(
            panel=panel,
            data_dir=data_dir,
            options=options,
            runs=panel_runs,
            runs_read=runs_read,
            cells=cells,
            models=models,
            generated_at=generated_at,
        )
        manifest["files"] = {k: p.name for k, p in paths.items()}
        manifest_path = pdir / "manifest.json"
        write_json_atomic(manifest, manifest_path)
        results[panel] = PanelResult(
            panel=panel,
            directory=pdir,
            cells_path=paths["cells"],
            models_path=paths["models"],
            excluded_path=paths["excluded"],
            manifest_path=manifest_path,
            cells=cells,
            models=models,
            manifest=manifest,
        )
    return AnalysisResult(
        data_dir=data_dir, out_dir=out_dir, options=options, runs_read=runs_read, panels=results
    )
