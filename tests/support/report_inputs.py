"""Report inputs written the way ``irbench analyze`` writes them, and an HTML table parser, for
the report tests (tests/analysis/test_report.py, the browser checks): ``write_synthetic_analysis`` lays out
an analysis directory with every section's files, ``write_availability`` availability checks,
``parse`` the report's tables, headings and images."""

from __future__ import annotations

import datetime as dt
import json
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


FIXED_NOW = dt.datetime(2026, 7, 1, 9, 30, tzinfo=dt.UTC)
SECTION_IDS = ["partition", "leaderboard", "plots", "sensitivity", "pairs", "correctness",
               "availability", "health", "provenance"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ synthetic analysis outputs

def write_synthetic_analysis(root: Path, *, n_models: int = 8, n_prompts: int = 22,
                             runs: int = 5, seed: int = 7, missing: float = 0.3,
                             panel: str = "synth", full: bool = True,
                             small_models: int = 0) -> Path:
    """Write OUT/<panel>/ with cells, models, excluded, manifest and (``full``) every other
    analysis output file. ``small_models`` models keep only 5 prompts (n < 8). Returns the panel directory."""
    rng = np.random.default_rng(seed)
    pdir = root / panel
    pdir.mkdir(parents=True, exist_ok=True)
    models = [f"model-{i:03d}" for i in range(n_models)]
    prompts = [f"p{j:04d}.prompt.rtpl" for j in range(n_prompts)]
    present = rng.random((n_models, n_prompts)) >= missing
    present[:, 0] = True
    for i in range(min(small_models, n_models)):
        present[i] = False
        present[i, :5] = True
    truth = np.linspace(0.95, 0.3, n_models)
    jac = np.clip(truth[:, None] + rng.normal(0, 0.1, (n_models, n_prompts)), 0, 1)
    jac[rng.random((n_models, n_prompts)) < 0.15] = 1.0
    mi, pj = np.nonzero(present)
    j = jac[mi, pj]
    day = dt.date(2026, 5, 30)
    n = len(mi)
    cells = pa.table({
        "panel": [panel] * n, "campaign": ["camp"] * n,
        "model": [models[i] for i in mi], "prompt_sha256": [f"sha{k:04d}" for k in pj],
        "prompt_name": [prompts[k] for k in pj], "budget_max_tokens": pa.nulls(n, pa.int64()),
        "runs_total": np.full(n, runs), "runs_ok": np.full(n, runs), "included": np.ones(n, bool),
        "mean_jaccard": j, "id_stability": j * 0.9, "node_set_perfect": j == 1.0,
        "mean_nodes": rng.uniform(4, 12, n), "std_nodes": rng.uniform(0, 1, n),
        "count_agreement": rng.uniform(0.5, 1, n), "count_equal_share": rng.uniform(0, 1, n),
        "first_date": pa.array([day] * n, pa.date32()),
        "last_date": pa.array([day + dt.timedelta(days=12)] * n, pa.date32()),
    })
    pq.write_table(cells, pdir / "cells.parquet")
    means = np.array([jac[i, present[i]].mean() for i in range(n_models)])
    order = np.argsort(-means, kind="stable")
    k = present.sum(axis=1)[order]
    m = means[order]
    half = np.sqrt(0.05 / np.maximum(k, 1))
    ranks = np.arange(1, n_models + 1)
    set_low = np.maximum(1, ranks - 2)
    set_high = np.minimum(n_models, ranks + 2)
    tau = n_models // 2
    part = np.where(set_high <= tau, "clearly reproducible",
                    np.where(set_low > tau, "clearly not", "undetermined"))
    perfect = np.array([int((jac[i, present[i]] == 1.0).sum()) for i in order])
    model_tab = pa.table({
        "rank": ranks, "model": [models[i] for i in order], "n_prompts": k, "n_cells": k,
        "mean_jaccard": m, "id_stability": m * 0.9, "perfect": perfect,
        "mean_nodes": rng.uniform(4, 12, n_models),
        "jaccard_ci_low": m - half, "jaccard_ci_high": np.minimum(1, m + half),
        # one model with enough prompts whose interval under-covers in its self-check
        "jaccard_ci_coverage": np.where(np.arange(n_models) == int(np.argmax(k >= 8)), 0.91, 0.95),
        "id_ci_low": m * 0.9 - half, "id_ci_high": np.minimum(1, m * 0.9 + half),
        "rank_held": rng.uniform(0.2, 1.0, n_models),
        "rank_ci_low": np.maximum(1, ranks - 1), "rank_ci_high": np.minimum(n_models, ranks + 1),
        "rank_set_low": set_low, "rank_set_high": set_high, "partition": part,
    })
    pq.write_table(model_tab, pdir / "models.parquet")
    pq.write_table(pa.table({"model": ["tiny-1"], "n_prompts": [2], "n_cells": [2],
                             "runs_ok": [5], "reason": ["2 prompts with ≥2 successful runs; needs ≥3"]}),
                   pdir / "excluded.parquet")
    manifest = {
        "panel": panel, "generated_at": "2026-06-12T08:00:00+00:00", "irbench_version": "0.1.0",
        "seed": 20260601, "replicates": 10000,
        "options": {"min_runs": {"value": 2, "unit": "successful runs per cell", "description": "x"},
                    "replicates": {"value": 10000, "unit": "replicates", "description": "y"}},
        "data_window": {"first_measurement_date": "2026-05-30",
                        "last_measurement_date": "2026-06-11", "unit": "UTC date"},
        "input": {"runs_in_panel": n * runs, "models": models},
        "output": {"cells": n, "models_included": n_models, "models_excluded": 1},
    }
    (pdir / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    if not full:
        return pdir
    a_idx = np.arange(0, n_models - 1, 2)
    pq.write_table(pa.table({
        "model_a": [models[i] for i in a_idx], "model_b": [models[i + 1] for i in a_idx],
        "n_common": np.full(len(a_idx), 15), "n_nonzero": np.full(len(a_idx), 12),
        "mean_diff": rng.normal(0, 0.05, len(a_idx)), "p_zsplit": rng.uniform(0, 1, len(a_idx)),
        "p_drop": rng.uniform(0, 1, len(a_idx)), "rank_biserial": rng.uniform(-1, 1, len(a_idx)),
        "mdd": rng.uniform(0.05, 0.2, len(a_idx))}), pdir / "pairs.parquet")
    variants = ["highest-budget-first|min_runs=2|min_prompts=3",
                "earliest-then-top-up|min_runs=2|min_prompts=3"]
    changed = np.zeros(2 * n_models, bool)
    changed[n_models + 1] = True
    pq.write_table(pa.table({
        "variant": np.repeat(variants, n_models), "axis": ["grid"] * (2 * n_models),
        "merge_rule": np.repeat(["highest-budget-first", "earliest-then-top-up"], n_models),
        "min_runs": np.full(2 * n_models, 2), "min_prompts": np.full(2 * n_models, 3),
        "tolerance": pa.nulls(2 * n_models, pa.string()),
        "model": [models[i] for i in order] * 2, "included": np.ones(2 * n_models, bool),
        "mean_jaccard": np.concatenate([m, m - 0.01]), "rank": np.concatenate([ranks, ranks]),
        "baseline_rank": np.concatenate([ranks, ranks]), "changed": changed,
        "headline_share_perfect": np.repeat([0.25, 0.295], n_models),
        "headline_shift": np.repeat([0.0, 0.045], n_models),
        "median_r_star": pa.nulls(2 * n_models, pa.float64())}),
        pdir / "sensitivity.parquet")
    pairs_tot = runs * (runs - 1) // 2
    agree = rng.integers(0, pairs_tot + 1, n)
    count_d = rng.integers(0, pairs_tot - agree + 1)
    id_d = pairs_tot - agree - count_d
    pq.write_table(pa.table({
        "model": cells.column("model"), "prompt": cells.column("prompt_name"),
        "runs": np.full(n, runs), "pairs": np.full(n, pairs_tot), "count_drift": count_d,
        "id_drift": id_d, "metadata_drift": np.zeros(n, np.int64), "agree": agree}),
        pdir / "drift.parquet")
    r_abs = rng.integers(1, runs + 1, n).astype(float)
    r_abs[r_abs == runs] = np.nan  # censored
    pq.write_table(pa.table({
        "model": cells.column("model"), "prompt": cells.column("prompt_name"),
        "runs": np.full(n, runs), "long_run_mean": rng.uniform(4, 12, n),
        "r_star_absolute": r_abs, "r_star_relative": np.where(np.isnan(r_abs), 2.0, r_abs),
        "tol_absolute_nodes": np.full(n, 0.05), "tol_relative": np.full(n, 0.05)}),
        pdir / "stabilisation.parquet")
    pq.write_table(pa.table({
        "metric": ["recall", "f1", "recall", "recall"],
        "dropped": [None, None, models[0], models[1]], "n": [n_models, n_models, n_models - 1,
                                                            n_models - 1],
        "pearson_r": [0.5, 0.4, 0.45, 0.55], "pearson_p": [0.02, 0.08, 0.05, 0.01],
        "spearman_rho": [0.4, 0.3, 0.35, 0.5], "spearman_p": [0.04, 0.1, 0.09, 0.03]}),
        pdir / "correlations.parquet")
    return pdir


def write_availability(data: Path, checks: list[tuple[str, dt.date, str]]) -> None:
    """Availability checks written through the real store (DATA/availability/check_date=…)."""
    from storage.availability import AvailabilityRecord, AvailabilityStore

    AvailabilityStore(data, fsync=False).write([
        AvailabilityRecord(checked_at=dt.datetime.combine(day, dt.time(6), tzinfo=dt.UTC),
                           endpoint="sim", model=model, status=status,
                           retired_on="2026-06-15" if status == "retired" else None)
        for model, day, status in checks])


# ------------------------------------------------------------------ HTML parsing helpers

class TableParser(HTMLParser):
    """Collects every table by id: header texts and rows of (text, data-sort, tr class)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, dict] = {}
        self.images: list[str] = []
        self.h2: list[str] = []
        self._cur: dict | None = None
        self._cell: list | None = None
        self._row: list | None = None
        self._in_h2 = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._cur = {"head": [], "rows": [], "classes": []}
            self.tables[a.get("id", f"anon{len(self.tables)}")] = self._cur
        elif tag == "tr" and self._cur is not None:
            self._row = []
            self._cur["classes"].append(a.get("class", ""))
        elif tag in ("td", "th") and self._cur is not None:
            self._cell = [tag, "", a.get("data-sort")]
        elif tag == "img":
            self.images.append(a.get("src", ""))
        elif tag == "h2":
            self._in_h2 = True
            self.h2.append("")

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1] += data
        if self._in_h2:
            self.h2[-1] += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr" and self._cur is not None and self._row is not None:
            if self._row and self._row[0][0] == "th":
                self._cur["head"] = [c[1] for c in self._row]
                self._cur["classes"].pop()
            else:
                self._cur["rows"].append([(c[1], c[2]) for c in self._row])
            self._row = None
        elif tag == "table":
            self._cur = None
        elif tag == "h2":
            self._in_h2 = False


def parse(html: str) -> TableParser:
    p = TableParser()
    p.feed(html)
    return p
