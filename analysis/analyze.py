"""``irbench analyze``: run store → per-panel cell and model tables plus a manifest.

Inputs: the data directory of a :class:`storage.runs.RunStore` (and of imported cell
measurements, :class:`storage.cells.CellStore`) and :class:`AnalysisOptions`. Raw-run cells and
imported cells of one panel are merged under ``options.merge_rule`` (the other rule is in
``sensitivity.parquet``); ``cells.parquet`` keeps every campaign's cell with its ``source`` and
whether it supplies the merged cell under each rule (``chosen_highest_budget_first``,
``chosen_earliest_then_top_up``).
Outputs, per panel, under ``out_dir/<panel>/`` (panel name percent-quoted when it is not a
safe file name):

* ``cells.parquet``    one row per cell (:data:`analysis.cells.CELL_SCHEMA`);
* ``models.parquet``   the model table (:mod:`analysis.tables`);
* ``excluded.parquet`` models below the inclusion thresholds, with the reason;
* ``pairs``, ``sensitivity``, ``drift``, ``stabilisation``, ``correctness``, ``correlations``,
  ``normalised`` ``.parquet`` (:mod:`analysis.audit`, :mod:`analysis.sensitivity`,
  :mod:`analysis.families`);
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

from analysis.audit import RunLevel, corpus_index, correlations_table, run_level, score_matrix
from analysis.audit import with_intervals
from analysis.cells import MIN_RUNS_METADATA_KEY, REQUIRED_COLUMNS, build_cells
from analysis.families import family_map, load_families, pairs_table
from analysis.measurements import (
    AUDIT_CELL_SCHEMA,
    chosen_flags,
    complete_excluded,
    load_precedence,
    measurement_cells,
    merge_cells,
    precedence,
    run_cells,
)
from analysis.options import AnalysisOptions
from analysis.sensitivity import sensitivity_table
from analysis.tables import ModelTable, model_table
from analysis.timeouts import analyze_timeouts
from storage.errors import StorageError

MANIFEST_VERSION = 1
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$")


class CorruptDataError(StorageError, ValueError):
    """Some Parquet files of the data directory cannot be read; the message names them."""


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


def _read_checked(dataset, options: AnalysisOptions, filters: dict) -> tuple[pa.Table, list[str]]:
    """Read a dataset; unreadable files fail with their names, or are skipped (and listed)
    with ``options.skip_corrupt``."""
    window = {"date_from": options.date_from, "date_to": options.date_to}
    try:
        return dataset.read(filters=filters, **window), []
    except StorageError as exc:
        files = dataset.data_files(options.date_from, options.date_to)
        bad = []
        for f in files:
            try:
                pq.read_table(f)
            except (OSError, pa.ArrowException):
                bad.append(f)
        if not bad:
            raise
        names = ", ".join(str(b) for b in bad)
        if not options.skip_corrupt:
            raise CorruptDataError(
                f"{len(bad)} unreadable Parquet file(s) under {dataset.path}: {names}; move them "
                "out of the data directory, or pass --skip-corrupt to analyse without them"
            ) from exc
        table = dataset.read_files([f for f in files if f not in bad])
        expr = dataset.filter_expression(filters=filters, **window)
        return (table.filter(expr) if expr is not None else table), [str(b) for b in bad]


def _filters(options: AnalysisOptions) -> dict[str, list[str]]:
    out = {}
    if options.campaigns is not None:
        out["campaign"] = list(options.campaigns)
    if options.models is not None:
        out["model"] = list(options.models)
    return out


def _read_inputs(data_dir: Path, options: AnalysisOptions) -> tuple[pa.Table, pa.Table, list[str]]:
    """(runs, imported cell measurements, skipped files); NoRunsError when both are empty."""
    from storage.cells import CellStore
    from storage.runs import RunStore

    if not data_dir.is_dir():
        raise NoRunsError(
            f"data directory {data_dir} does not exist; run a campaign first "
            "(`irbench run <campaign.toml>`) or pass the directory that holds its runs"
        )
    runs, bad_r = _read_checked(RunStore(data_dir, fsync=False).dataset, options, _filters(options))
    cells, bad_c = _read_checked(CellStore(data_dir, fsync=False).dataset, options,
                                 _filters(options))
    if runs.num_rows == 0 and cells.num_rows == 0:
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
            "(`irbench run <campaign.toml>`), import one (`irbench import-artifact`), "
            "or widen the date/campaign/model filters"
        )
    return runs, cells, bad_r + bad_c


def _date_str(value: dt.date | None) -> str | None:
    return value.isoformat() if value is not None else None


def _sum(mask: pa.ChunkedArray | pa.Array) -> int:
    return int(pc.sum(mask.cast(pa.int64())).as_py() or 0)


def _manifest(*, panel: str, data_dir: Path, options: AnalysisOptions, runs: pa.Table,
              runs_read: int, cells: pa.Table, models: ModelTable, generated_at: dt.datetime,
              imported: pa.Table) -> dict[str, Any]:
    dates = [d for d in runs.column("measurement_date").to_pylist()]
    dates += imported.column("measurement_date").to_pylist()
    dates += [d for d in imported.column("window_end").to_pylist() if d is not None]
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
            "first_measurement_date": _date_str(min(dates) if dates else None),
            "last_measurement_date": _date_str(max(dates) if dates else None),
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
            "campaigns": sorted(set(runs.column("campaign").to_pylist())
                                | set(imported.column("campaign").to_pylist())),
            "models": sorted(set(runs.column("model").to_pylist())
                             | set(imported.column("model").to_pylist())),
        },
        "output": {
            "cells": cells.num_rows,
            "cells_included": _sum(cells.column("included")),
            "models_included": models.included.num_rows,
            "models_excluded": models.excluded.num_rows,
        },
    }


def _panel_cells(panel_runs: pa.Table, imported: pa.Table, min_runs: int,
                 raw_cells: pa.Table | None = None) -> pa.Table:
    """``raw_cells``: this panel's ``build_cells`` table when computed elsewhere (analysis jobs)."""
    schema = AUDIT_CELL_SCHEMA.with_metadata(
        {b"irbench.min_runs": str(min_runs).encode()})
    parts = [measurement_cells(imported, min_runs).cast(schema)]
    raw = raw_cells
    if raw is None and panel_runs.num_rows:
        raw = build_cells(panel_runs, min_runs=min_runs)
    if raw is not None and raw.num_rows:
        parts.insert(0, run_cells(raw).cast(schema))
    return pa.concat_tables(parts)


def _audit_panel(panel_runs: pa.Table, imported: pa.Table, options: AnalysisOptions,
                 index: dict, families: dict[str, str], override: dict,
                 raw_cells: pa.Table | None = None,
                 ) -> tuple[pa.Table, ModelTable, dict[str, pa.Table], dict[str, Any]]:
    """All tables of one panel: (cells, model table, other tables by file stem, summaries)."""
    cells = _panel_cells(panel_runs, imported, options.min_runs, raw_cells)
    budget, time = precedence(cells, imported, override)
    merged = merge_cells(cells, budget, time)
    for rule, flags in chosen_flags(cells, merged).items():
        cells = cells.append_column("chosen_" + rule.replace("-", "_"), pa.array(flags))
    chosen = merged.tables[options.merge_rule]
    models = complete_excluded(
        model_table(chosen, min_prompts=options.min_prompts, min_runs=options.min_runs), cells)
    models, rb = with_intervals(models, chosen, options)
    all_models = sorted(set(chosen.column("model").to_pylist()))
    scores, _ = score_matrix(chosen, all_models)
    pairs = pairs_table(scores, all_models, family_map(all_models, families), options.pair_scope,
                        alpha=1 - options.level)
    rl: RunLevel = run_level(panel_runs, options, index)
    sens, sens_summary = sensitivity_table(
        cells, budget, time, merge_rule=options.merge_rule, min_runs=options.min_runs,
        min_prompts=options.min_prompts, stabilisation=rl.stabilisation)
    tables = {"pairs": pairs, "sensitivity": sens, "drift": rl.drift,
              "stabilisation": rl.stabilisation, "correctness": rl.correctness,
              "correlations": correlations_table(models, rl.correctness),
              "normalised": rl.normalised}
    summary = {
        "merge": {**sens_summary, "budget_rank": budget, "time_order": time},
        "rank_bootstrap": None if rb is None else {
            "replicates": rb.replicates, "usable": rb.usable,
            "unusable": rb.replicates - rb.usable, "n_prompts": rb.n_prompts,
            "tie_rule": "stable sort by mean, ties broken by the point-estimate order",
            "rank_set": rb.simultaneous.kind, "partition_top_size": rb.n_models // 2},
        "drift": rl.drift_summary, "stabilisation": rl.stabilisation_summary,
        "correctness": {"runs_scored": rl.correctness.num_rows,
                        "prompts_without_ground_truth": rl.prompts_without_truth,
                        "runs_without_explicit_nodes": _sum(rl.correctness.column("no_explicit"))
                        if rl.correctness.num_rows else 0},
        "families": family_map(all_models, families),
    }
    return cells, models, tables, summary


def run_analysis(
    data_dir: Path,
    out_dir: Path,
    options: AnalysisOptions | None = None,
    *,
    now: Callable[[], dt.datetime] = _utc_now,
    raw_cells: pa.Table | None = None,
) -> AnalysisResult:
    """Read the store, build and merge cells, write every per-panel table with a manifest.

    ``now`` is the clock stamped into ``generated_at`` (injected for reproducible tests).
    ``raw_cells``: the ``build_cells`` table of the (filtered) runs, all panels, when the
    per-cell reduction already ran elsewhere (:func:`combine_partial_cells` of the analysis
    jobs); default: computed here from the runs.
    Raises :class:`NoRunsError` when nothing matches (naming the directory and the filters),
    :class:`CorruptDataError` naming unreadable files (unless ``options.skip_corrupt``).
    """
    options = options or AnalysisOptions()
    data_dir = Path(data_dir)
    out_dir = Path(out_dir)
    runs, imported, skipped = _read_inputs(data_dir, options)
    runs_read = runs.num_rows
    panels = sorted(set(runs.column("panel").to_pylist())
                    | set(imported.column("panel").to_pylist()))
    if options.panel is not None:
        if options.panel not in panels:
            raise NoRunsError(
                f"panel {options.panel!r} has no runs in {data_dir} (with the given filters); "
                f"panels present: {panels}"
            )
        panels = [options.panel]
    index = corpus_index(options.corpus_dirs)
    families = load_families(options.families_path)
    override = load_precedence(options.precedence_path) if options.precedence_path else {}

    generated_at = now()
    results: dict[str, PanelResult] = {}
    for panel in panels:
        panel_runs = runs.filter(pc.equal(runs.column("panel"), panel))
        panel_imp = imported.filter(pc.equal(imported.column("panel"), panel))
        panel_raw = (None if raw_cells is None
                     else raw_cells.filter(pc.equal(raw_cells.column("panel"), panel)))
        cells, models, tables, summary = _audit_panel(
            panel_runs, panel_imp, options, index, families, override, panel_raw)
        pdir = out_dir / panel_dirname(panel)
        pdir.mkdir(parents=True, exist_ok=True)
        tables = {"cells": cells, "models": models.included, "excluded": models.excluded,
                  **tables}
        paths = {name: pdir / f"{name}.parquet" for name in tables}
        for name, table in tables.items():
            write_parquet_atomic(table, paths[name])
        manifest = _manifest(
            panel=panel, data_dir=data_dir, options=options, runs=panel_runs,
            runs_read=runs_read, cells=cells, models=models, generated_at=generated_at,
            imported=panel_imp,
        )
        manifest["files"] = {k: p.name for k, p in paths.items()}
        if panel_runs.num_rows:
            # which runs a shorter (or longer) total timeout would have lost, from recorded latencies
            sensitivity, ts_paths = analyze_timeouts(
                panel_runs, pdir, min_runs=options.min_runs, min_prompts=options.min_prompts,
                timeouts_s=options.timeouts_s,
            )
            manifest["files"].update({k: p.name for k, p in ts_paths.items()})
            summary = {**summary, "timeout_sensitivity": sensitivity.summary()}
        manifest["summary"] = summary
        manifest["skipped_corrupt_files"] = skipped
        manifest_path = pdir / "manifest.json"
        write_json_atomic(manifest, manifest_path)
        results[panel] = PanelResult(
            panel=panel, directory=pdir, cells_path=paths["cells"],
            models_path=paths["models"], excluded_path=paths["excluded"],
            manifest_path=manifest_path, cells=cells, models=models, manifest=manifest,
            tables=tables, paths=paths,
        )
    return AnalysisResult(
        data_dir=data_dir, out_dir=out_dir, options=options, runs_read=runs_read,
        panels=results, cells_imported=imported.num_rows, skipped_files=tuple(skipped),
    )


# ---------------------------------------------------------------- the per-cell reduction as jobs
#
# A cell's runs can sit in several partitions (a campaign crossing midnight UTC, a resume on a
# later day) or file groups, and its metrics need every pair of its runs, so a partial cell
# aggregate cannot be merged. Each part therefore returns (a) ``build_cells`` of its own runs and
# (b) its run-level features (the columns ``build_cells`` reads, ``ir_json`` shrunk to a
# presence marker). The reduce keeps (a) for cells seen in one part only — most cells, so most
# of the work stays on the workers — and rebuilds the others from (b) across parts.

PART_COLUMN = "__part"


def read_run_files(data_dir: Path, files: list[Path], options: AnalysisOptions
                   ) -> tuple[pa.Table, list[str]]:
    """Runs of exactly ``files`` (one partition or file group), deduplicated by run_id and
    filtered like :func:`run_analysis` reads them; unreadable files fail (naming them) or,
    with ``options.skip_corrupt``, are skipped and returned."""
    from storage.runs import RunStore

    dataset = RunStore(Path(data_dir), fsync=False).dataset
    bad: list[Path] = []
    try:
        table = dataset.read_files(files)
    except StorageError:
        for f in files:
            try:
                pq.read_table(f)
            except (OSError, pa.ArrowException):
                bad.append(f)
        if not bad:
            raise
        if not options.skip_corrupt:
            raise CorruptDataError(
                f"{len(bad)} unreadable Parquet file(s) under {dataset.path}: "
                f"{', '.join(str(b) for b in bad)}; move them out of the data directory, or pass "
                "--skip-corrupt to analyse without them") from None
        table = dataset.read_files([f for f in files if f not in bad])
    expr = dataset.filter_expression(options.date_from, options.date_to, _filters(options))
    if expr is not None:
        table = table.filter(expr)
    return table, [str(b) for b in bad]


def partial_cells(runs: pa.Table, min_runs: int) -> tuple[pa.Table, pa.Table]:
    """One part's (cells, run-level features) — see the section comment above."""
    marker = pc.if_else(pc.is_valid(runs.column("ir_json")), pa.scalar(""), pa.scalar(None, pa.string()))
    feats = runs.select([*REQUIRED_COLUMNS, "measured_at", "execution_id", "finished_at"])
    feats = feats.set_column(feats.schema.get_field_index("ir_json"), "ir_json", marker)
    return build_cells(runs, min_runs=min_runs), feats


def _cell_key(table: pa.Table) -> pa.Table:
    """The cell key columns, the budget's nulls as -1 (joins never match nulls)."""
    budget = pc.fill_null(table.column("budget_max_tokens"), -1)
    return pa.table({"panel": table.column("panel"), "campaign": table.column("campaign"),
                     "model": table.column("model"), "prompt_sha256": table.column("prompt_sha256"),
                     "__budget": budget})


def _in_keys(table: pa.Table, keys: pa.Table) -> pa.Array:
    """Per row of ``table``: is its cell key among ``keys`` (a :func:`_cell_key` table)?"""
    names = keys.column_names
    rows = _cell_key(table).append_column("__row", pa.array(range(table.num_rows), pa.int64()))
    joined = rows.join(keys.append_column("__hit", pa.array([True] * keys.num_rows)), names,
                       join_type="left outer").sort_by("__row")
    return pc.fill_null(joined.column("__hit"), False).combine_chunks()


def combine_partial_cells(parts: list[tuple[pa.Table, pa.Table]], min_runs: int) -> pa.Table:
    """The ``build_cells`` table of the union of the parts' runs (same rows, same order).

    ``parts``: each part's :func:`partial_cells` output, at least one."""
    from storage.runs import latest_executions

    if not parts:
        raise ValueError("combine_partial_cells needs at least one part")
    feats = pa.concat_tables([f for _, f in parts])
    part_ids = pa.array([i for i, (_, f) in enumerate(parts) for _ in range(f.num_rows)], pa.int64())
    keyed = _cell_key(feats).append_column(PART_COLUMN, part_ids)
    key = keyed.column_names[:-1]
    spans = keyed.group_by(key).aggregate([(PART_COLUMN, "count_distinct")])
    split = spans.filter(pc.greater(spans.column(f"{PART_COLUMN}_count_distinct"), 1)).select(key)
    whole = pa.concat_tables([c for c, _ in parts])
    kept = whole
    if split.num_rows:
        kept = whole.filter(pc.invert(_in_keys(whole, split)))
        runs = latest_executions(feats.filter(_in_keys(feats, split)))
        kept = pa.concat_tables([kept, build_cells(runs, min_runs=min_runs)])
    order = pc.sort_indices(
        kept.append_column("__budget", pc.fill_null(kept.column("budget_max_tokens"), -1)),
        sort_keys=[("panel", "ascending"), ("campaign", "ascending"), ("model", "ascending"),
                   ("prompt_name", "ascending"), ("prompt_sha256", "ascending"), ("__budget", "ascending")])
    out = kept.take(order)
    return out.replace_schema_metadata({**(out.schema.metadata or {}),
                                        MIN_RUNS_METADATA_KEY: str(min_runs).encode()})
