"""Everything per cell and per run of one *part* of the run store (a file group), computed where
the part's files are, and the merge of the parts' compact summaries into what the local
pipeline computes from all runs: what distributed analysis runs (:mod:`orchestrator.jobs.analysis_tasks`).

A part returns (:class:`PartSummary`):

* ``light`` — its runs without the IR texts (``ir_json`` shrunk to a presence marker) and
  without answer text: what the cell table, the timeout tables and the manifest read;
* ``cells`` — ``build_cells`` of its runs (:func:`analysis.tables.partial.partial_cells`);
* per panel, the run-level tables (drift, stabilisation, normalised, correctness) of the cells
  that lie wholly in this part, each row keyed by hidden columns (``__panel``, ``__budget``;
  ``__run_id`` for correctness) so the merge can put them in the local order;
* ``split_runs`` — the full rows (with IR) of the runs of *split* cells: cells whose runs sit in
  two or more parts (the planner lists their keys; usually a campaign crossing midnight UTC or a
  run re-executed on a later day). Their tables are computed once, at the merge, from these.
* ``truth`` — per (panel, prompt) with a successful run, whether it has ground truth (for
  ``prompts_without_ground_truth``).

The merge (:func:`merge_parts`) concatenates, keeps the latest execution of every run, sorts
by the local keys, and rebuilds the drift and stabilisation summaries from the merged tables;
the result is value-equal to :func:`analysis.tables.audit.run_level` on all runs (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.metrics.drift import CLASSES, CellDrift, summarise_drift
from analysis.metrics.stabilisation import Stabilisation, summarise_stabilisation
from analysis.options import AnalysisOptions
from analysis.tables.audit import RunLevel, run_level
from analysis.tables.partial import partial_cells, _cell_key, _in_keys
from analysis.tables.models import distinct_values
from storage.outcomes import succeeded_mask
from storage.runs import latest_executions

__all__ = ["CELL_TABLES", "KEY_COLUMNS", "PartSummary", "Precomputed", "merge_parts", "shard_of", "split_keys",
           "summarise_part"]

CELL_TABLES = ("drift", "stabilisation", "normalised")
KEY_COLUMNS = ("panel", "campaign", "model", "prompt_sha256", "budget_max_tokens")
HIDDEN = ("__panel", "__budget", "__run_id")


@dataclass(frozen=True)
class PartSummary:
    """One part's compact outputs (module docstring); ``tables`` maps a run-level table name to
    the rows of every panel of the part, keyed by the hidden columns."""

    light: pa.Table
    cells: pa.Table
    tables: dict[str, pa.Table]
    split_runs: pa.Table
    truth: pa.Table


@dataclass(frozen=True)
class Precomputed:
    """What ``run_analysis(precomputed=...)`` takes instead of reading the runs: the merged light
    runs, the run-level tables by panel and the unreadable files the parts skipped."""

    runs: pa.Table
    run_levels: dict[str, RunLevel]
    skipped: tuple[str, ...] = ()

    def inputs(self, data_dir: Path, options: AnalysisOptions) -> tuple[pa.Table, pa.Table, list[str]]:
        """(runs, imported cells, skipped files), as :func:`analysis.inputs.read_inputs`."""
        from analysis.inputs import NoRunsError, filters_of, read_checked, CELL_COLUMNS
        from storage.cells import CellStore

        cells, bad = read_checked(CellStore(data_dir, fsync=False).dataset, options, filters_of(options),
                                  CELL_COLUMNS)
        if self.runs.num_rows == 0 and cells.num_rows == 0:
            raise NoRunsError(f"no run records in {data_dir} (with the given filters)")
        return self.runs, cells, [*self.skipped, *bad]


def shard_of(table: pa.Table, shards: int) -> np.ndarray:
    """Per row of ``table`` (with the :data:`KEY_COLUMNS`), its cell's shard in ``range(shards)``:
    a hash of the cell key, so every reader of the same files agrees whatever rows it holds."""
    import hashlib

    if table.num_rows == 0:
        return np.zeros(0, np.int64)
    budget = pc.cast(pc.fill_null(table.column("budget_max_tokens").cast(pa.int64()), -1), pa.string())
    key = pc.binary_join_element_wise(*(table.column(c) for c in KEY_COLUMNS[:-1]), budget, "\x1f")
    uniq = pc.unique(key)
    hashed = np.array([int.from_bytes(hashlib.sha1(u.encode()).digest()[:8], "big") % shards
                       for u in uniq.to_pylist()], np.int64)
    return hashed[pc.index_in(key, value_set=uniq).to_numpy(zero_copy_only=False)]


def split_keys(key_tables: list[pa.Table]) -> pa.Table:
    """Cell keys (``_cell_key`` form) present in two or more of the parts' key tables (each with
    the :data:`KEY_COLUMNS`)."""
    keyed = [(_cell_key(t).append_column("__part", pa.array(np.full(t.num_rows, i, np.int64))))
             for i, t in enumerate(key_tables)]
    if not keyed:
        return pa.table({c: pa.array([], pa.string()) for c in KEY_COLUMNS[:-1]}
                        | {"__budget": pa.array([], pa.int64())})
    allk = pa.concat_tables(keyed)
    names = allk.column_names[:-1]
    spans = allk.group_by(names).aggregate([("__part", "count_distinct")])
    return spans.filter(pc.greater(spans.column("__part_count_distinct"), 1)).select(names)


def _light(runs: pa.Table) -> pa.Table:
    from analysis.inputs import RUN_COLUMNS

    keep = [c for c in (*RUN_COLUMNS, "execution_id", "finished_at") if c in runs.column_names]
    light = runs.select(keep)
    marker = pc.if_else(pc.is_valid(runs.column("ir_json")), pa.scalar(""), pa.scalar(None, pa.string()))
    return light.set_column(light.schema.get_field_index("ir_json"), "ir_json", marker)


def _cell_order(runs: pa.Table, min_runs: int) -> pa.Table:
    """The keys of the raw cells ``run_level`` builds (≥ ``min_runs`` successful runs), in its
    row order: (campaign, model, prompt_sha256, budget or -1)."""
    ok = runs.filter(succeeded_mask(runs))
    k = pa.table({"campaign": ok.column("campaign"), "model": ok.column("model"),
                  "prompt_sha256": ok.column("prompt_sha256"),
                  "__budget": pc.fill_null(ok.column("budget_max_tokens").cast(pa.int64()), -1)})
    g = k.group_by(list(k.column_names)).aggregate([("campaign", "count")])
    g = g.filter(pc.greater_equal(g.column("campaign_count"), min_runs))
    return g.sort_by([(c, "ascending") for c in ("campaign", "model", "prompt_sha256", "__budget")])


def _keyed(panel: str, runs: pa.Table, options: AnalysisOptions, index: dict[str, Path]
           ) -> tuple[dict[str, pa.Table], pa.Table]:
    """``run_level`` of one panel's runs with the hidden key columns; and its truth table."""
    rl = run_level(runs, options, index)
    order = _cell_order(runs, options.min_runs)
    out: dict[str, pa.Table] = {}
    for name in CELL_TABLES:
        t = getattr(rl, name)
        if t.num_rows != order.num_rows:
            raise AssertionError(f"{name}: {t.num_rows} rows, {order.num_rows} cells")
        if t.num_rows == 0:
            continue
        out[name] = t.append_column("__panel", pa.array([panel] * t.num_rows, pa.string())) \
            .append_column("__budget", order.column("__budget"))
    ok = runs.filter(succeeded_mask(runs)).select(["run_id", "prompt_sha256"])
    with_truth = pc.unique(rl.correctness.column("prompt_sha256"))
    scored = ok.filter(pc.is_in(ok.column("prompt_sha256"), value_set=with_truth)).sort_by("run_id")
    if rl.correctness.num_rows:
        out["correctness"] = rl.correctness.append_column(
            "__panel", pa.array([panel] * scored.num_rows, pa.string())).append_column(
            "__run_id", scored.column("run_id"))
    shas = pc.unique(ok.column("prompt_sha256"))
    truth = pa.table({"panel": pa.array([panel] * len(shas), pa.string()), "prompt_sha256": shas,
                      "has_truth": pc.is_in(shas, value_set=with_truth)})
    return out, truth


def _panel_tables(runs: pa.Table, options: AnalysisOptions, index: dict[str, Path]
                  ) -> tuple[dict[str, list[pa.Table]], list[pa.Table]]:
    tables: dict[str, list[pa.Table]] = {}
    truths = []
    for panel in sorted(distinct_values(runs.column("panel"))):
        pr = runs.filter(pc.equal(runs.column("panel"), panel))
        keyed, truth = _keyed(panel, pr, options, index)
        for name, t in keyed.items():
            tables.setdefault(name, []).append(t)
        truths.append(truth)
    return tables, truths


def _truth_schema() -> pa.Schema:
    return pa.schema([("panel", pa.string()), ("prompt_sha256", pa.string()), ("has_truth", pa.bool_())])


def summarise_part(runs: pa.Table, split: pa.Table, options: AnalysisOptions,
                   index: dict[str, Path]) -> PartSummary:
    """One part's :class:`PartSummary`; ``split``: the :func:`split_keys` of the whole job."""
    cells, _ = partial_cells(runs, options.min_runs)
    light = _light(runs)
    in_split = _in_keys(runs, split) if split.num_rows and runs.num_rows else \
        pa.array(np.zeros(runs.num_rows, bool))
    whole = runs.filter(pc.invert(in_split))
    split_runs = runs.filter(in_split)
    tables, truths = _panel_tables(whole, options, index)
    return PartSummary(light=light, cells=cells,
                       tables={k: pa.concat_tables(v) for k, v in tables.items()},
                       split_runs=split_runs,
                       truth=pa.concat_tables(truths) if truths else _truth_schema().empty_table())


def _drift_summary(drift: pa.Table) -> dict[str, Any]:
    cells = []
    for r in drift.select(["pairs", "count_drift", "id_drift", "metadata_drift", "agree",
                           "label_only"]).to_pylist():
        counts = np.array([r["count_drift"], r["id_drift"], r["metadata_drift"]], dtype=np.int64)
        dis = r["pairs"] - r["agree"]
        cells.append(CellDrift(n_pairs=r["pairs"], counts=counts, agree=r["agree"],
                               label_only=r["label_only"],
                               shares=counts / dis if dis else np.zeros(len(CLASSES))))
    s = summarise_drift(cells)
    return {"classes": list(CLASSES), "macro_all_cells": s.macro_all.tolist(),
            "pooled_pairs": s.pooled.tolist(),
            "macro_disagreeing_cells": [None if np.isnan(x) else float(x) for x in s.macro_disagreeing],
            "cells": s.n_cells, "cells_disagreeing": s.n_cells_disagreeing,
            "pairs": s.n_pairs, "disagreeing_pairs": s.n_disagreeing_pairs,
            "label_only_pairs": s.label_only_pairs}


def _stabilisation_summary(stab: pa.Table, options: AnalysisOptions) -> dict[str, Any]:
    if stab.num_rows == 0:
        return {}
    runs = stab.column("runs").to_numpy()
    arrs = {}
    for kind, col in (("abs", "r_star_absolute"), ("rel", "r_star_relative")):
        c = stab.column(col)
        arrs[kind] = (pc.fill_null(c, 0).to_numpy(), pc.is_null(c).to_numpy(zero_copy_only=False))
    res = Stabilisation(runs=runs, r_star_abs=np.where(arrs["abs"][1], runs, arrs["abs"][0]),
                        r_star_rel=np.where(arrs["rel"][1], runs, arrs["rel"][0]),
                        censored_abs=arrs["abs"][1], censored_rel=arrs["rel"][1],
                        long_run_mean_nodes=stab.column("long_run_mean").to_numpy(),
                        tol_abs_nodes=options.tol_abs_nodes, tol_rel=options.tol_rel,
                        rel_floor_nodes=float("nan"))
    return {s.kind: {"cells": s.n_cells, "stabilising": s.n_stabilising, "censored": s.n_censored,
                     "median_r_star": None if np.isnan(s.median_r_star) else s.median_r_star}
            for s in summarise_stabilisation(res)}


def merge_parts(parts: list[PartSummary], options: AnalysisOptions, index: dict[str, Path]
                ) -> tuple[pa.Table, pa.Table, dict[str, RunLevel]]:
    """(light runs, cells, run-level tables by panel) of the union of the parts, as the local
    pipeline computes them from every run."""
    from analysis.tables.partial import combine_partial_cells

    light = latest_executions(pa.concat_tables([p.light for p in parts], promote_options="default"))
    cells = combine_partial_cells([(p.cells, p.light) for p in parts], options.min_runs)
    split = pa.concat_tables([p.split_runs for p in parts], promote_options="default")
    tables: dict[str, list[pa.Table]] = {}
    truths = [p.truth for p in parts]
    for p in parts:
        for name, t in p.tables.items():
            tables.setdefault(name, []).append(t)
    if split.num_rows:
        extra, extra_truth = _panel_tables(latest_executions(split), options, index)
        for name, ts in extra.items():
            tables.setdefault(name, []).extend(ts)
        truths += extra_truth
    truth = pa.concat_tables(truths) if truths else _truth_schema().empty_table()
    empty = run_level(light.slice(0, 0), options, index)
    out: dict[str, RunLevel] = {}
    for panel in sorted(distinct_values(light.column("panel"))):
        got: dict[str, pa.Table] = {}
        for name in (*CELL_TABLES, "correctness"):
            ts = [t.filter(pc.equal(t.column("__panel"), panel)) for t in tables.get(name, [])]
            ts = [t for t in ts if t.num_rows]
            if not ts:
                got[name] = getattr(empty, name)
                continue
            t = pa.concat_tables(ts)
            keys = ["campaign", "model", "prompt_sha256", "__budget"] if name != "correctness" else ["__run_id"]
            t = t.sort_by([(k, "ascending") for k in keys])
            got[name] = t.drop_columns([c for c in HIDDEN if c in t.column_names])
        pt = truth.filter(pc.equal(truth.column("panel"), panel))
        resolved = set(pt.filter(pt.column("has_truth")).column("prompt_sha256").to_pylist())
        unresolved = len(set(pt.column("prompt_sha256").to_pylist()) - resolved)
        out[panel] = RunLevel(drift=got["drift"], drift_summary=_drift_summary(got["drift"]),
                              stabilisation=got["stabilisation"],
                              stabilisation_summary=_stabilisation_summary(got["stabilisation"], options),
                              normalised=got["normalised"], correctness=got["correctness"],
                              prompts_without_truth=unresolved)
    return light, cells, out
