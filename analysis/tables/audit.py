"""Per-panel assembly of the audit outputs beyond cells/models/excluded (``irbench analyze``).

Inputs: one panel's merged cell table (one row per model × prompt, :mod:`analysis.tables.measurements`),
its raw run table (may be empty for an import-only panel) and :class:`AnalysisOptions`.
Outputs (:class:`PanelAudit`), written by :mod:`analysis.pipeline`:

* models with intervals and ranks (added by :mod:`analysis.tables.intervals`) — ``jaccard_ci_low/high``, ``id_ci_low/high`` (bootstrap
  over the model's prompts by ``options.interval``, ``level``, ``replicates``, ``seed``; the
  percentile method is bit-equal to scipy on paper-scale panels; large panels use a documented
  shared-stream scheme — ``ci_method`` says which), ``jaccard_ci_coverage`` (the Jaccard
  interval's simulated coverage on a parametric resample of the model's cells),
  ``rank`` (position in the point table), ``rank_held`` (joint cluster bootstrap retention; ties
  within a replicate broken by the point order), ``rank_ci_low/high`` (marginal percentile rank
  interval), ``rank_set_low/high`` (simultaneous pairwise-Holm rank set), ``partition``;
* per raw cell with ≥ ``min_runs`` successful runs: drift, stabilisation, normalised rows;
* per successful run on an annotated prompt (prompt text found, ≥ 1 annotation): correctness;
* correlations of per-model stability (merged mean Jaccard) with run-weighted correctness.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.errors import AnalysisError
from analysis.memory import release_freed_memory
from analysis.metrics.agreement import NormaliserVariant, normalise_id
from analysis.metrics.batch import (
    CellPairs,
    cell_pairs,
    count_agreement_many,
    distinct_entries,
    set_agreement,
)
from analysis.metrics.correctness import emitted_from_json, model_means, score_run
from analysis.metrics.drift import (
    CLASSES,
    cell_drift,
    run_ir_from_json,
    summarise_drift,
)
from analysis.metrics.stabilisation import stabilisation_ragged, summarise_stabilisation
from analysis.options import AnalysisOptions
from analysis.stats.correlations import stability_vs_correctness
from analysis.tables.models import ModelTable
from storage.annotations import parse_annotations
from storage.outcomes import run_succeeded


# ---------------------------------------------------------------- run-level tables

# runs converted to Python rows at once by the correctness table (bounds its IR-text copies)
_CHUNK_ROWS = 20_000


@dataclass(frozen=True)
class _RawCell:
    campaign: str
    model: str
    prompt: str
    sha: str
    runs: list[dict]  # successful runs in run-index order


def _raw_cells(runs: pa.Table, min_runs: int) -> list[_RawCell]:
    if runs.num_rows == 0:
        return []
    cols = ["campaign", "model", "prompt_name", "prompt_sha256", "budget_max_tokens",
            "run_index", "parse_outcome", "ir_json", "node_ids", "node_count", "prompt_source"]
    groups: dict[tuple, list[dict]] = {}
    for r in runs.select(cols).to_pylist():
        if not run_succeeded(r["parse_outcome"], r["ir_json"]):
            continue
        key = (r["campaign"], r["model"], r["prompt_sha256"], r["budget_max_tokens"])
        groups.setdefault(key, []).append(r)
    out = []
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3] or -1)):
        rs = sorted(groups[key], key=lambda r: r["run_index"])
        if len(rs) >= min_runs:
            out.append(_RawCell(key[0], key[1], rs[0]["prompt_name"], key[2], rs))
    return out


def _head(c: _RawCell) -> dict[str, Any]:
    return {"campaign": c.campaign, "model": c.model, "prompt": c.prompt,
            "prompt_sha256": c.sha, "runs": len(c.runs)}


def drift_table(cells: list[_RawCell]) -> tuple[pa.Table, dict[str, Any]]:
    """One row per raw cell (pair counts per drift class) and the three aggregate views."""
    rows, drifts = _drift_rows(cells)
    return _drift_assembled(rows, drifts)


def _drift_rows(cells: list[_RawCell]) -> tuple[list[dict], list[Any]]:
    """(one row per raw cell, the cell's drift) — a group's share of :func:`drift_table`."""
    rows: list[dict] = []
    drifts: list[Any] = []
    parsed: dict[str, Any] = {}  # identical IR texts (common for stable models) parse once
    for c in cells:
        irs = []
        for r in c.runs:
            text = r["ir_json"]
            ir = parsed.get(text)
            if ir is None:
                ir = parsed[text] = run_ir_from_json(text)
            irs.append(ir)
        parsed.clear()  # texts rarely repeat across cells; keep the cache per cell
        d = cell_drift(irs)
        drifts.append(d)
        rows.append({**_head(c), "pairs": d.n_pairs, "count_drift": int(d.counts[0]),
                     "id_drift": int(d.counts[1]), "metadata_drift": int(d.counts[2]),
                     "agree": d.agree, "label_only": d.label_only})
    return rows, drifts


def _drift_assembled(rows: list[dict], drifts: list[Any]) -> tuple[pa.Table, dict[str, Any]]:
    s = summarise_drift(drifts)
    summary = {"classes": list(CLASSES), "macro_all_cells": s.macro_all.tolist(),
               "pooled_pairs": s.pooled.tolist(),
               "macro_disagreeing_cells": [None if np.isnan(x) else float(x)
                                           for x in s.macro_disagreeing],
               "cells": s.n_cells, "cells_disagreeing": s.n_cells_disagreeing,
               "pairs": s.n_pairs, "disagreeing_pairs": s.n_disagreeing_pairs,
               "label_only_pairs": s.label_only_pairs}
    schema = pa.schema([("campaign", pa.string()), ("model", pa.string()),
                        ("prompt", pa.string()), ("prompt_sha256", pa.string()),
                        ("runs", pa.int64()), ("pairs", pa.int64()), ("count_drift", pa.int64()),
                        ("id_drift", pa.int64()), ("metadata_drift", pa.int64()),
                        ("agree", pa.int64()), ("label_only", pa.int64())])
    return pa.Table.from_pylist(rows, schema=schema), summary


def stabilisation_table(cells: list[_RawCell], options: AnalysisOptions
                        ) -> tuple[pa.Table, dict[str, Any]]:
    """r* per raw cell under both tolerances (null = right-censored) and the summary counts."""
    schema = pa.schema([("campaign", pa.string()), ("model", pa.string()),
                        ("prompt", pa.string()), ("prompt_sha256", pa.string()),
                        ("runs", pa.int64()), ("long_run_mean", pa.float64()),
                        ("r_star_absolute", pa.int64()), ("r_star_relative", pa.int64()),
                        ("tol_absolute_nodes", pa.float64()), ("tol_relative", pa.float64())])
    if not cells:
        return schema.empty_table(), {}
    res = stabilisation_ragged([[r["node_count"] for r in c.runs] for c in cells],
                               tol_abs_nodes=options.tol_abs_nodes, tol_rel=options.tol_rel)
    ra, rr = res.r_star_or_none("abs"), res.r_star_or_none("rel")
    rows = [{**_head(c), "long_run_mean": float(res.long_run_mean_nodes[i]),
             "r_star_absolute": ra[i], "r_star_relative": rr[i],
             "tol_absolute_nodes": options.tol_abs_nodes, "tol_relative": options.tol_rel}
            for i, c in enumerate(cells)]
    summary = {s.kind: {"cells": s.n_cells, "stabilising": s.n_stabilising,
                        "censored": s.n_censored,
                        "median_r_star": None if np.isnan(s.median_r_star) else s.median_r_star}
               for s in summarise_stabilisation(res)}
    return pa.Table.from_pylist(rows, schema=schema), summary


def _normalised_columns(pairs: CellPairs, run_of: np.ndarray, code: np.ndarray,
                        vocab: list[str], variant: NormaliserVariant, n_runs: int
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean normalised Jaccard, empty ids, colliding ids) per cell; each distinct id string is
    normalised once."""
    forms = [normalise_id(i, variant) for i in vocab]
    enc = pa.array(forms, pa.string()).dictionary_encode()
    form_code = np.asarray(enc.indices.to_numpy(zero_copy_only=False), np.int64)
    n_forms = len(enc.dictionary)
    empty_form = enc.dictionary.to_pylist().index("") if "" in forms else -1
    fc = form_code[code] if len(code) else np.zeros(0, np.int64)
    run_cell = np.repeat(np.arange(len(pairs.runs), dtype=np.int64), pairs.runs)
    n_cells = len(pairs.runs)
    empty = np.bincount(run_cell[run_of[fc == empty_form]], minlength=n_cells)
    # distinct raw ids per run sharing one normal form: each of them collides
    krun, kform, counts = distinct_entries(run_of, fc, n_forms)
    colliding = np.bincount(run_cell[krun], weights=np.where(counts > 1, counts, 0),
                            minlength=n_cells).astype(np.int64)
    agg = set_agreement(pairs, krun, kform, n_runs)
    return agg.mean_jaccard_max1, empty.astype(np.int64), colliding


def normalised_table(cells: list[_RawCell]) -> pa.Table:
    """Exact and normalised (ASCII and Unicode) Jaccard, count agreement, empty/collision ids."""
    if not cells:
        return pa.table({"campaign": pa.array([], pa.string()),
                         "model": pa.array([], pa.string()),
                         "prompt": pa.array([], pa.string())})
    runs_per_cell = np.array([len(c.runs) for c in cells], np.int64)
    run_cell = np.repeat(np.arange(len(cells), dtype=np.int64), runs_per_cell)
    n_runs = len(run_cell)
    pairs = cell_pairs(run_cell, len(cells))
    id_lists = [r["node_ids"] or [] for c in cells for r in c.runs]
    flat = pa.array(id_lists, pa.list_(pa.string()))
    run_of = np.asarray(pc.list_parent_indices(flat).to_numpy(zero_copy_only=False), np.int64)
    enc = pc.list_flatten(flat).dictionary_encode()
    vocab = enc.dictionary.to_pylist()
    run_of, code, _ = distinct_entries(
        run_of, np.asarray(enc.indices.to_numpy(zero_copy_only=False), np.int64), len(vocab))
    exact = set_agreement(pairs, run_of, code, n_runs)
    asc, empty_a, coll_a = _normalised_columns(pairs, run_of, code, vocab, "ascii", n_runs)
    uni, empty_u, coll_u = _normalised_columns(pairs, run_of, code, vocab, "unicode", n_runs)
    counts = np.array([r["node_count"] for c in cells for r in c.runs], np.int64)
    ca, eq = count_agreement_many(pairs, counts)
    return pa.table({
        "campaign": pa.array([c.campaign for c in cells], pa.string()),
        "model": pa.array([c.model for c in cells], pa.string()),
        "prompt": pa.array([c.prompt for c in cells], pa.string()),
        "prompt_sha256": pa.array([c.sha for c in cells], pa.string()),
        "runs": pa.array(runs_per_cell, pa.int64()),
        "jaccard_exact": exact.mean_jaccard, "id_stability": exact.id_stability,
        "jaccard_norm_ascii": asc, "jaccard_norm_unicode": uni,
        "count_agreement": ca, "count_equal_share": eq,
        "empty_ids_ascii": empty_a, "empty_ids_unicode": empty_u,
        "collisions_ascii": coll_a, "collisions_unicode": coll_u,
    })


def corpus_index(dirs: Sequence[Path] | None) -> dict[str, Path]:
    """sha256 of file bytes → path, for every file under ``dirs`` (recursively)."""
    out: dict[str, Path] = {}
    for d in dirs or ():
        if not Path(d).is_dir():
            raise AnalysisError(f"corpus directory {d} does not exist; pass the folder holding the "
                             "campaign's prompt files")
        for p in sorted(Path(d).rglob("*")):
            if p.is_file():
                out.setdefault(hashlib.sha256(p.read_bytes()).hexdigest(), p)
    return out


def _truth(sha: str, source: str | None, index: dict[str, Path],
           cache: dict[str, frozenset | None]) -> frozenset | None:
    if sha not in cache:
        path = index.get(sha)
        if path is None and source and Path(source).is_file():
            if hashlib.sha256(Path(source).read_bytes()).hexdigest() == sha:
                path = Path(source)
        ids = parse_annotations(path.read_text(encoding="utf-8", errors="replace")).ids \
            if path is not None else frozenset()
        cache[sha] = ids if ids else None  # unannotated or not found: no ground truth
    return cache[sha]


_CORRECTNESS_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("campaign", pa.string()), ("model", pa.string()), ("prompt", pa.string()),
    ("prompt_sha256", pa.string()), ("run", pa.int64()), ("n_truth", pa.int64()),
    ("n_emitted", pa.int64()), ("n_explicit", pa.int64()), ("recall", pa.float64()),
    ("precision_all", pa.float64()), ("precision_explicit", pa.float64()), ("f1", pa.float64()),
    ("no_explicit", pa.bool_())])


def _correctness_rows(chunk: pa.Table, index: dict[str, Path],
                      cache: dict[str, frozenset | None]) -> pa.Table:
    rows = []
    for r in chunk.to_pylist():
        if not run_succeeded(r["parse_outcome"], r["ir_json"]):
            continue
        truth = _truth(r["prompt_sha256"], r["prompt_source"], index, cache)
        if truth is None:
            continue
        s = score_run(truth, *emitted_from_json(r["ir_json"]))
        rows.append({"run_id": r["run_id"], "campaign": r["campaign"], "model": r["model"],
                     "prompt": r["prompt_name"], "prompt_sha256": r["prompt_sha256"],
                     "run": r["run_index"], "n_truth": s.n_truth,
                     "n_emitted": s.n_emitted, "n_explicit": s.n_explicit,
                     "recall": s.recall, "precision_all": s.all_precision,
                     "precision_explicit": s.explicit_precision, "f1": s.f1,
                     "no_explicit": s.no_explicit})
    return pa.Table.from_pylist(rows, schema=_CORRECTNESS_SCHEMA)


def correctness_table(runs: pa.Table, index: dict[str, Path]) -> tuple[pa.Table, int]:
    """One row per successful run on an annotated prompt; returns (table, prompts not found)."""
    cache: dict[str, frozenset | None] = {}
    parts = [_CORRECTNESS_SCHEMA.empty_table()]
    if runs.num_rows:
        cols = ["run_id", "campaign", "model", "prompt_name", "prompt_sha256", "run_index",
                "parse_outcome", "ir_json", "prompt_source"]
        # scored a record batch at a time in store order (no copy of the IR texts beyond one
        # batch's Python strings), then put in run_id order whatever order the store had
        for batch in runs.select(cols).to_batches(max_chunksize=_CHUNK_ROWS):
            parts.append(_correctness_rows(batch, index, cache))
    unresolved = sum(v is None for v in cache.values())
    table = pa.concat_tables(parts)
    table = table.take(pc.sort_indices(table.column("run_id"))).drop_columns(["run_id"])
    return table.combine_chunks(), unresolved


CORRECTNESS_METRICS = ("recall", "precision_explicit", "precision_all", "f1")


def correlations_table(models: ModelTable, correctness: pa.Table) -> pa.Table:
    """Stability (mean Jaccard) vs each correctness metric over models measured both ways:
    a ``full`` row per metric, then one ``drop`` row per left-out model."""
    schema = pa.schema([("metric", pa.string()), ("kind", pa.string()), ("dropped", pa.string()),
                        ("n", pa.int64()), ("pearson_r", pa.float64()),
                        ("pearson_p", pa.float64()), ("spearman_rho", pa.float64()),
                        ("spearman_p", pa.float64()), ("survives_pearson", pa.bool_()),
                        ("survives_spearman", pa.bool_()), ("small_n", pa.bool_())])
    if correctness.num_rows == 0 or models.included.num_rows == 0:
        return schema.empty_table()
    sc = np.column_stack([correctness.column(c).to_numpy() for c in
                          ("recall", "precision_explicit", "precision_all", "f1")])
    mm = model_means(correctness.column("model").to_pylist(), sc)
    stab = dict(zip(models.models, models.included.column("mean_jaccard").to_pylist()))
    both = [m for m in mm.models if m in stab]
    if not both:
        return schema.empty_table()
    pos = [mm.models.index(m) for m in both]
    metrics = [(name, getattr(mm, attr)[pos]) for name, attr in
               zip(CORRECTNESS_METRICS, ("recall", "explicit_precision", "all_precision", "f1"))]
    rows = []
    for res in stability_vs_correctness(np.array([stab[m] for m in both]), metrics, both):
        f, loo = res.full, res.loo
        rows.append({"metric": res.metric, "kind": "full", "dropped": None, "n": f.n,
                     "pearson_r": f.pearson_r, "pearson_p": f.pearson_p,
                     "spearman_rho": f.spearman_rho, "spearman_p": f.spearman_p,
                     "survives_pearson": loo.survives_pearson,
                     "survives_spearman": loo.survives_spearman, "small_n": loo.small_n})
        for i, d in enumerate(loo.dropped):
            rows.append({"metric": res.metric, "kind": "drop", "dropped": d, "n": f.n - 1,
                         "pearson_r": loo.pearson_r[i], "pearson_p": loo.pearson_p[i],
                         "spearman_rho": loo.spearman_rho[i], "spearman_p": loo.spearman_p[i],
                         "survives_pearson": None, "survives_spearman": None,
                         "small_n": loo.small_n})
    return pa.Table.from_pylist(rows, schema=schema)


@dataclass(frozen=True)
class RunLevel:
    """Run-level outputs of one panel and their summaries (for the manifest and printout)."""

    drift: pa.Table
    drift_summary: dict[str, Any]
    stabilisation: pa.Table
    stabilisation_summary: dict[str, Any]
    normalised: pa.Table
    correctness: pa.Table
    prompts_without_truth: int


def _groups(runs: pa.Table) -> Iterator[pa.Table]:
    """The runs of each (campaign, model) in that sorted order, store order kept within: the
    raw cells of one group never span two, so each group's IR texts are parsed and freed on
    their own."""
    if runs.num_rows == 0:
        return
    keys = runs.select(["campaign", "model"]).group_by(["campaign", "model"]).aggregate([])
    for campaign, model in sorted(zip(keys.column("campaign").to_pylist(),
                                      keys.column("model").to_pylist())):
        yield runs.filter(pc.and_(pc.equal(runs.column("campaign"), campaign),
                                  pc.equal(runs.column("model"), model)))


def run_level(runs: pa.Table, options: AnalysisOptions, index: dict[str, Path]) -> RunLevel:
    """Drift, stabilisation, normalised and correctness tables from one panel's raw runs."""
    # correctness first: its per-run Python rows are freed before the cells' copies are made
    # (both at once would be the memory peak of a 100k-run analysis)
    corr, missing = correctness_table(runs, index)
    release_freed_memory()
    cells: list[_RawCell] = []
    rows: list[dict] = []
    drifts: list[Any] = []
    normalised: list[pa.Table] = []
    for group in _groups(runs):
        part = _raw_cells(group, options.min_runs)
        if not part:
            continue
        r, d = _drift_rows(part)
        rows += r
        drifts += d
        normalised.append(normalised_table(part))
        # past drift and normalised only the node counts are needed (stabilisation); the
        # IR texts and id lists are most of the cells' memory
        cells += [_RawCell(c.campaign, c.model, c.prompt, c.sha,
                           [{"node_count": run["node_count"]} for run in c.runs]) for c in part]
    drift, dsum = _drift_assembled(rows, drifts)
    release_freed_memory()
    stab, ssum = stabilisation_table(cells, options)
    norm = pa.concat_tables(normalised) if normalised else normalised_table([])
    return RunLevel(drift, dsum, stab, ssum, norm, corr, missing)
