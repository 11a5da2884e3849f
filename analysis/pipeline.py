"""``irbench analyze``: run store → per-panel cell and model tables plus a manifest.

Inputs (:mod:`analysis.inputs`): the data directory of a :class:`storage.runs.RunStore` (and of
imported cell measurements, :class:`storage.cells.CellStore`) and :class:`AnalysisOptions`.
Raw-run cells and imported cells of one panel are merged under ``options.merge_rule`` (the other
rule is in ``sensitivity.parquet``); ``cells.parquet`` keeps every campaign's cell with its
``source`` and whether it supplies the merged cell under each rule (``chosen_highest_budget_first``,
``chosen_earliest_then_top_up``). The files written per panel are listed in :mod:`analysis.outputs`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from threadpoolctl import threadpool_limits

from analysis.inputs import CorruptDataError, NoRunsError, read_inputs
from analysis.options import AnalysisOptions
from analysis.progress import ANALYZE_STAGES, Reporter, Stage, silent
from analysis.outputs import (
    AnalysisResult,
    PanelResult,
    ManifestInputs,
    build_manifest,
    panel_dirname,
    write_manifest,
    write_panel,
)
from analysis.tables.audit import RunLevel, corpus_index, correlations_table, run_level
from analysis.tables.intervals import score_matrix, with_intervals
from analysis.memory import release_freed_memory
from analysis.tables.cells import build_cells
from analysis.tables.families import families_for, family_map, pairs_table
from analysis.tables.measurements import (
    AUDIT_CELL_SCHEMA,
    COMPACT_AUDIT_CELL_SCHEMA,
    chosen_flags,
    complete_excluded,
    load_precedence,
    measurement_cells,
    merge_cells,
    merge_view,
    plain,
    precedence,
    run_cells,
)
from analysis.tables.models import ModelTable, distinct_values, model_table
from analysis.tables.part_summaries import Precomputed
from analysis.tables.sensitivity import sensitivity_table
from analysis.tables.timeouts import analyze_timeouts
from storage.clock import utc_now

__all__ = ["AnalysisResult", "CorruptDataError", "NoRunsError", "PanelResult", "run_analysis"]


def _sum(mask: pa.ChunkedArray | pa.Array) -> int:
    return int(pc.sum(mask.cast(pa.int64())).as_py() or 0)


def _panel_cells(panel_runs: pa.Table, imported: pa.Table, min_runs: int,
                 raw_cells: pa.Table | None = None) -> pa.Table:
    """``raw_cells``: this panel's ``build_cells`` table when computed elsewhere (analysis jobs)."""
    imp = measurement_cells(imported, min_runs)
    # imported cells come as dictionary columns (read so); raw-run cells join them so
    base = (COMPACT_AUDIT_CELL_SCHEMA if imp.schema.field("model").type != pa.string()
            else AUDIT_CELL_SCHEMA)
    schema = base.with_metadata({b"irbench.min_runs": str(min_runs).encode()})
    parts = [imp.cast(schema)]
    raw = raw_cells
    if raw is None and panel_runs.num_rows:
        raw = build_cells(panel_runs, min_runs=min_runs)
    if raw is not None and raw.num_rows:
        parts.insert(0, run_cells(raw).cast(schema))
    # one dictionary per column across chunks (group-bys cannot unify differing ones)
    return pa.concat_tables(parts).unify_dictionaries()


def _rows_of(table: pa.Table, panel: str) -> pa.Table:
    """The rows of ``panel``; the table itself (no copy) when every row is that panel's."""
    mask = pc.equal(table.column("panel"), panel)
    if table.num_rows and pc.all(mask).as_py():
        return table
    return table.filter(mask)


# what of the imported cells is used once the cells are built (precedence, manifest)
_IMPORTED_KEPT = ("campaign", "model", "budget_rank", "time_order", "measurement_date",
                  "window_end")


def _audit_panel(panel_runs: pa.Table, held: list[pa.Table], shared: _Shared,
                 raw_cells: pa.Table | None = None, step: Callable[..., None] = lambda *a: None,
                 run_level_tables: RunLevel | None = None,
                 ) -> tuple[pa.Table, ModelTable, dict[str, pa.Table], dict[str, Any], pa.Table]:
    """All tables of one panel: (cells, model table, other tables by file stem, summaries,
    the imported cells' columns the manifest needs). ``held``: a one-element list with the
    panel's imported cells, popped so the other columns are freed once the cells are built.
    ``shared`` gives the options, corpus index, families and precedence override.
    ``step(name, count, unit)`` is called as each stage starts."""
    options, index, families = shared.options, shared.index, shared.families
    imported = held.pop()
    step("cells", panel_runs.num_rows + imported.num_rows, "runs and imported cells")
    cells = _panel_cells(panel_runs, imported, options.min_runs, raw_cells)
    imported = imported.select(list(_IMPORTED_KEPT))
    step("merge", cells.num_rows, "cells")
    budget, time = precedence(cells, imported, shared.override)
    merged = merge_cells(merge_view(cells), budget, time)
    for rule, flags in chosen_flags(cells, merged).items():
        cells = cells.append_column("chosen_" + rule.replace("-", "_"), pa.array(flags))
    chosen = merged.tables[options.merge_rule]
    step("intervals", options.replicates, "replicates")
    models = complete_excluded(
        model_table(chosen, min_prompts=options.min_prompts, min_runs=options.min_runs), cells)
    models, rb = with_intervals(models, chosen, options)
    all_models = sorted(pc.unique(chosen.column("model")).to_pylist())
    scores, _ = score_matrix(chosen, all_models)
    step("pairs", len(all_models), "models")
    pairs = pairs_table(scores, all_models, family_map(all_models, families), options.pair_scope,
                        alpha=1 - options.level)
    step("run level", panel_runs.num_rows, "runs")
    rl: RunLevel = run_level_tables or run_level(panel_runs, options, index)
    step("sensitivity", cells.num_rows, "cells")
    sens, sens_summary = sensitivity_table(
        cells, budget, time, base=(options.merge_rule, options.min_runs, options.min_prompts),
        stabilisation=rl.stabilisation, baseline=merged)
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
    return cells, models, tables, summary, imported


def run_analysis(
    data_dir: Path,
    out_dir: Path,
    options: AnalysisOptions | None = None,
    *,
    now: Callable[[], dt.datetime] = utc_now,
    raw_cells: pa.Table | None = None,
    progress: Reporter = silent,
    precomputed: Precomputed | None = None,
) -> AnalysisResult:
    """Read the store, build and merge cells, write every per-panel table with a manifest.

    ``now`` is the clock stamped into ``generated_at`` (injected for reproducible tests).
    ``raw_cells``: the ``build_cells`` table of the (filtered) runs, all panels, when the
    per-cell reduction already ran elsewhere (:func:`analysis.tables.partial.combine_partial_cells` of the analysis
    jobs); default: computed here from the runs.
    Raises :class:`NoRunsError` when nothing matches (naming the directory and the filters),
    :class:`CorruptDataError` naming unreadable files (unless ``options.skip_corrupt``).
    ``progress`` receives a :class:`analysis.progress.Stage` as each stage starts.
    ``precomputed``: the runs (without IR texts) and run-level tables per panel, merged from the
    parts of a distributed analysis (:func:`analysis.tables.part_summaries.merge_parts`); the
    runs are then not read (imported cells still are).
    """
    options = options or AnalysisOptions()
    with threadpool_limits(limits=options.blas_threads, user_api="blas"):
        return _run_analysis(Path(data_dir), Path(out_dir), options, now, raw_cells, progress,
                             precomputed)


@dataclass(frozen=True)
class _Shared:
    """What every panel of one analysis uses: where, with which options and lookups."""

    data_dir: Path
    out_dir: Path
    options: AnalysisOptions
    index: Any  # the corpus index (sha256 -> prompt), for correctness
    families: dict[str, str]
    families_source: Any
    override: dict
    generated_at: dt.datetime
    runs_read: int
    skipped: list[str]
    progress: Reporter


def _panels(runs: pa.Table, imported: pa.Table, options: AnalysisOptions, data_dir: Path) -> list[str]:
    panels = sorted(distinct_values(runs.column("panel"), imported.column("panel")))
    if options.panel is None:
        return panels
    if options.panel not in panels:
        raise NoRunsError(f"panel {options.panel!r} has no runs in {data_dir} (with the given filters); "
                          f"panels present: {panels}")
    return [options.panel]


def _run_analysis(data_dir: Path, out_dir: Path, options: AnalysisOptions,
                  now: Callable[[], dt.datetime], raw_cells: pa.Table | None,
                  progress: Reporter, precomputed: Precomputed | None = None) -> AnalysisResult:
    progress(Stage("read", count=None, unit=str(data_dir)))
    if precomputed is None:
        runs, imported, skipped = read_inputs(data_dir, options)
    else:
        runs, imported, skipped = precomputed.inputs(data_dir, options)
    release_freed_memory()
    panels = _panels(runs, imported, options, data_dir)
    families, families_source = families_for(data_dir, options.families_path)
    shared = _Shared(data_dir, out_dir, options, corpus_index(options.corpus_dirs), families, families_source,
                     load_precedence(options.precedence_path) if options.precedence_path else {},
                     now(), runs.num_rows, skipped, progress)
    imported_rows = imported.num_rows
    # per panel, so no reference to the whole table outlives the building of a panel's cells
    imported_of = {panel: _rows_of(imported, panel) for panel in panels}
    del imported
    results: dict[str, PanelResult] = {}
    for panel in panels:
        results[panel] = _analyse_panel(
            shared, panel, _rows_of(runs, panel), [imported_of.pop(panel)],
            None if raw_cells is None else _rows_of(raw_cells, panel),
            None if precomputed is None else precomputed.run_levels.get(panel))
    runs_read = shared.runs_read
    return AnalysisResult(
        data_dir=data_dir, out_dir=out_dir, options=options, runs_read=runs_read,
        panels=results, cells_imported=imported_rows, skipped_files=tuple(skipped),
    )


def _analyse_panel(shared: _Shared, panel: str, panel_runs: pa.Table, held: list[pa.Table],
                   panel_raw: pa.Table | None, run_levels: RunLevel | None) -> PanelResult:
    """Audit one panel and write its tables, timeouts and manifest under ``OUT/<panel>/``."""
    options = shared.options

    def step(name: str, count: int | None = None, unit: str = "") -> None:
        # hand the previous stage's freed temporaries back to the OS (allocators keep them)
        release_freed_memory()
        shared.progress(Stage(name, panel, ANALYZE_STAGES.index(name) + 1, len(ANALYZE_STAGES), count, unit))

    cells, models, tables, summary, panel_imp = _audit_panel(
        panel_runs, held, shared, panel_raw, step, run_levels)
    cells = plain(cells)  # written and returned with string columns
    release_freed_memory()
    pdir = shared.out_dir / panel_dirname(panel)
    tables = {"cells": cells, "models": models.included, "excluded": models.excluded, **tables}
    step("write", len(tables) + 1, "files")
    paths = write_panel(pdir, tables)
    manifest = build_manifest(ManifestInputs(
        panel=panel, data_dir=shared.data_dir, options=options, runs_read=shared.runs_read,
        generated_at=shared.generated_at), runs=panel_runs, cells=cells, models=models, imported=panel_imp)
    manifest["files"] = {k: p.name for k, p in paths.items()}
    step("timeouts", panel_runs.num_rows, "runs")
    if panel_runs.num_rows:
        # which runs a shorter (or longer) total timeout would have lost, from recorded latencies
        sensitivity, ts_paths = analyze_timeouts(
            panel_runs, pdir, min_runs=options.min_runs, min_prompts=options.min_prompts,
            timeouts_s=options.timeouts_s,
        )
        manifest["files"].update({k: p.name for k, p in ts_paths.items()})
        summary = {**summary, "timeout_sensitivity": sensitivity.summary()}
    manifest["summary"] = summary
    manifest["skipped_corrupt_files"] = shared.skipped
    manifest["families_source"] = shared.families_source
    manifest_path = write_manifest(manifest, pdir)
    return PanelResult(
        panel=panel, directory=pdir, cells_path=paths["cells"], models_path=paths["models"],
        excluded_path=paths["excluded"], manifest_path=manifest_path, cells=cells, models=models,
        manifest=manifest, tables=tables, paths=paths,
    )
