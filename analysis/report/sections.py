"""The eight report sections, built from analysis outputs already loaded from disk.

Input: one :class:`PanelData` per panel (tables read from ``OUT/<panel>/*.parquet`` and the
manifest) and, optionally, the availability checks. Output: :class:`analysis.report.doc.Section`
objects in the report's fixed order. A section whose file or columns are absent says so in one
line ("not available: … (run irbench analyze)") instead of failing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, SupportsFloat
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.report import plots
from storage.wave_selection import WaveSelection
from analysis.report.doc import Block, Cell, Heading, Note, Paragraph, Table
from analysis.report.tables import (
    absent_columns, fmt_interval, fmt_num, fmt_range, generic_table, is_missing, missing_note,
)

PARTITION_LABELS = ("clearly reproducible", "clearly not", "undetermined")


@dataclass(frozen=True)
class ReportOptions:
    """Display choices only (no statistic depends on them).

    ``small_n_prompts``: models with fewer prompts get a small-n warning (intervals from so few
    prompts under-cover). ``max_table_rows``: cap on rows of long tables in the HTML/Markdown
    (provenance, pairs); the full tables stay in the Parquet outputs. ``page_rows``: rows per
    page of long HTML tables. ``gone_statuses``: availability statuses meaning "cannot be
    re-measured". ``waves``: the measurement waves whose runs the run-level tables read (the
    analysis outputs were filtered when they were computed).
    """

    small_n_prompts: int = 8
    max_table_rows: int = 1000
    page_rows: int = 50
    gone_statuses: tuple[str, ...] = ("retired", "not_listed", "not_found")
    plot_style: plots.PlotStyle = field(default_factory=plots.PlotStyle)
    waves: WaveSelection = field(default_factory=WaveSelection)


@dataclass(frozen=True)
class PanelData:
    """One panel's outputs as read from disk. ``tables[name]`` is None when the file is absent;
    ``problems[name]`` says why a present file could not be read."""

    name: str
    directory: Any
    manifest: dict[str, Any]
    tables: dict[str, pa.Table | None]
    problems: dict[str, str] = field(default_factory=dict)
    provenance: pa.Table | None = None  # per-cell outcome classes etc. from the raw runs

    def table(self, name: str) -> pa.Table | None:
        return self.tables.get(name)


@dataclass(frozen=True)
class Availability:
    """Availability checks: columns ``model``, ``status``, ``check_date`` (date); or why not."""

    table: pa.Table | None
    reason: str = ""


def _per_panel(panels: Sequence[PanelData], build: Callable[[PanelData], list[Block]]
               ) -> tuple[Block, ...]:
    if len(panels) == 1:
        return tuple(build(panels[0]))
    out: list[Block] = []
    for p in panels:
        out.append(Heading(f"panel {p.name}"))
        out.extend(build(p))
    return tuple(out)


def _file_missing(p: PanelData, name: str) -> Note:
    if name in p.problems:
        return Note(f"not available: {name}.parquet unreadable ({p.problems[name]})", "missing")
    return missing_note(f"{name}.parquet")


# ------------------------------------------------------------------ 1. headline partition

RANK_COLS = ("partition", "rank", "rank_set_low", "rank_set_high", "rank_ci_low", "rank_ci_high")


def _partition(p: PanelData) -> list[Block]:
    models = p.table("models")
    if models is None:
        return [_file_missing(p, "models")]
    lacking = absent_columns(models, RANK_COLS)
    if lacking:
        return [missing_note("models.parquet", lacking)]
    rows = models.to_pylist()
    blocks: list[Block] = []
    for label in PARTITION_LABELS:
        members = [r for r in rows if r["partition"] == label]
        listed = "; ".join(
            f"{r['model']} (rank set {fmt_range(r['rank_set_low'], r['rank_set_high'])})"
            for r in members[:40])
        more = f"; … and {len(members) - 40} more" if len(members) > 40 else ""
        blocks.append(Paragraph(f"{label} ({len(members)}): {listed or 'none'}{more}"))
    table_rows = tuple(
        (Cell(r["partition"], r["partition"]), Cell(r["model"], r["model"]),
         Cell(str(r["rank"]), r["rank"]),
         Cell(fmt_range(r["rank_set_low"], r["rank_set_high"]), r["rank_set_low"]),
         Cell(fmt_range(r["rank_ci_low"], r["rank_ci_high"]), r["rank_ci_low"]))
        for label in PARTITION_LABELS for r in rows if r["partition"] == label)
    blocks.append(Table(("partition", "model", "rank", "simultaneous 95% rank set",
                         "marginal 95% rank interval"), table_rows, table_id=f"partition-{p.name}",
                        page_rows=None))
    blocks.append(Paragraph("A model is clearly reproducible when its whole simultaneous rank set "
                            "lies in the top group, clearly not when it lies in the bottom group, "
                            "undetermined otherwise. The simultaneous set holds every true rank "
                            "at once in at least 0.99 of study-like simulated panels at 5-22 "
                            "prompts (bench/interval_coverage.py --ranks); the marginal interval "
                            "is a per-model statement: it covers one model's rank in 0.90-1.00 of "
                            "those panels, and all ranks at once in as few as 0.52 (exact ties, "
                            "5 prompts)."))
    return blocks


# ------------------------------------------------------------------ 2. leaderboard

LEADER_COLS = (
    ("rank", "rank", None), ("model", "model", None), ("n", "n_prompts", None),
    ("mean Jaccard", "mean_jaccard", None), ("Jaccard 95% CI", "jaccard_ci_low", "jaccard_ci_high"),
    ("CI coverage", "jaccard_ci_coverage", None), ("ID-stability", "id_stability", None), ("ID 95% CI", "id_ci_low", "id_ci_high"),
    ("node-set-perfect", "perfect", "n_cells"), ("rank held", "rank_held", None),
    ("rank interval", "rank_ci_low", "rank_ci_high"), ("rank set", "rank_set_low", "rank_set_high"),
)


COVERAGE_FLOOR = 0.93


def coverage_text(coverage: float | None) -> str:
    """A model's simulated interval coverage, "(low)" under :data:`COVERAGE_FLOOR`; "–" when
    not simulated."""
    if coverage is None or is_missing(coverage):
        return "–"
    return f"{coverage:.2f}" + (" (low)" if coverage < COVERAGE_FLOOR else "")


def _warning(row: dict, small: list[str], opts: ReportOptions) -> str:
    parts = [f"n < {opts.small_n_prompts}"] if row["model"] in small else []
    cov = row.get("jaccard_ci_coverage")
    if cov is not None and not is_missing(cov) and cov < COVERAGE_FLOOR:
        parts.append(f"interval covers {cov:.2f} in simulation")
    return "; ".join(parts)


def _linked(cell: Cell, href: str) -> Cell:
    return Cell(cell.text, cell.sort, href)


def _leader_cell(title: str, a: str, b: str | None, row: dict) -> Cell:
    va = row.get(a)
    if title == "node-set-perfect":
        return Cell(f"{va}/{row.get(b)}", va)
    if title == "CI coverage":
        return Cell(coverage_text(va), None if is_missing(va) else va)
    if b is None:
        if isinstance(va, float):
            return Cell(fmt_num(va), va)
        return Cell(str(va), va)
    if a.startswith("rank"):
        return Cell(fmt_range(va, row.get(b)), None if is_missing(va) else va)
    return Cell(fmt_interval(va, row.get(b)), None if is_missing(va) else va)


def viewer_model_url(panel: str, model: str) -> str:
    """The ``irbench view`` page of one model of a panel, relative to where the viewer serves
    the report (``/report``), so the link works when the viewer serves this file."""
    return f"models/{quote(panel, safe='')}/{quote(model, safe='')}"


def _leaderboard(p: PanelData, opts: ReportOptions) -> list[Block]:
    models = p.table("models")
    if models is None:
        return [_file_missing(p, "models")]
    cols = [(t, a, b) for t, a, b in LEADER_COLS
            if a in models.column_names and (b is None or b in models.column_names)]
    lacking = sorted({c for _, a, b in LEADER_COLS for c in (a, b)
                      if c is not None and c not in models.column_names})
    rows = models.to_pylist()
    small = [r["model"] for r in rows if r.get("n_prompts", opts.small_n_prompts) < opts.small_n_prompts]
    body = tuple(tuple(_linked(_leader_cell(t, a, b, r), viewer_model_url(p.name, r["model"]))
                       if a == "model" else _leader_cell(t, a, b, r) for t, a, b in cols)
                 + (Cell(_warning(r, small, opts)),)
                 for r in rows)
    blocks: list[Block] = [Table(tuple(t for t, _, _ in cols) + ("warning",), body,
                                 table_id=f"leaderboard-{p.name}",
                                 highlight=tuple(bool(_warning(r, small, opts)) for r in rows))]
    if small:
        blocks.append(Note(f"small n: {len(small)} model(s) rest on fewer than "
                           f"{opts.small_n_prompts} prompts ({', '.join(small[:20])}"
                           f"{' …' if len(small) > 20 else ''}); their intervals under-cover "
                           "and their ranks are fragile.", "warning"))
    if lacking:
        blocks.append(missing_note("models.parquet", lacking))
    method = ((p.manifest.get("options") or {}).get("interval") or {}).get("value", "percentile")
    blocks.append(Paragraph(f"n = prompts with an included cell; intervals are 95% ({method}) "
                            "over prompts; CI coverage = the Jaccard interval's "
                            "coverage in a simulation from a parametric resample of the model's "
                            f"own cells (flagged under {COVERAGE_FLOOR}; – = not simulated, "
                            "above the prompt limit); rank held = share of bootstrap replicates "
                            "in which the model keeps its position. Model names link to the "
                            "model's cells and raw runs in `irbench view` (open this report "
                            "through the viewer, at /report, for the links to work)."))
    rb = (p.manifest.get("summary") or {}).get("rank_bootstrap")
    if rb:
        blocks.append(Paragraph(
            f"Rank bootstrap: {rb.get('usable')} of {rb.get('replicates')} replicates usable "
            f"({rb.get('unusable')} drew none of some model's prompts) over "
            f"{rb.get('n_prompts')} prompts; ties: {rb.get('tie_rule')}; rank set: "
            f"{rb.get('rank_set')}; top group = ranks 1..{rb.get('partition_top_size')}."))
    excluded = p.table("excluded")
    if excluded is None:
        blocks.append(_file_missing(p, "excluded"))
    elif excluded.num_rows:
        blocks.append(Heading(f"below the inclusion threshold ({excluded.num_rows})"))
        table, _ = generic_table(excluded, table_id=f"excluded-{p.name}")
        blocks.append(table)
    else:
        blocks.append(Paragraph("No model fell below the inclusion threshold."))
    return blocks


# ------------------------------------------------------------------ 3. plots

def chosen_column(cells: pa.Table, manifest: dict) -> str | None:
    """The cells column marking the measurement the analysis' merge rule kept, if any."""
    rule = ((manifest.get("options") or {}).get("merge_rule") or {}).get("value") or \
        ((manifest.get("summary") or {}).get("merge") or {}).get("rule")
    name = f"chosen_{str(rule).replace('-', '_')}" if rule else None
    return name if name in cells.column_names else None


def heatmap_matrix(cells: pa.Table, order: Sequence[str], chosen: str | None = None
                   ) -> tuple[np.ndarray, list[str], list[str], bool]:
    """models × prompts matrix of included cells' mean Jaccard (NaN = none), models in ``order``
    then the rest by name. With ``chosen`` (a boolean cells column) only the measurement the
    merge rule kept is shown; otherwise a cell measured by several campaigns shows its latest
    measurement (the flag in the result says whether that happened)."""
    mask = pc.and_kleene(cells.column("included"), pc.is_valid(cells.column("mean_jaccard")))
    if chosen is not None:
        mask = pc.and_kleene(mask, pc.fill_null(cells.column(chosen), False))
    inc = cells.filter(mask)
    if "last_date" in inc.column_names:
        inc = inc.sort_by([("last_date", "ascending")])
    model = np.asarray(inc.column("model").to_pylist(), dtype=object)
    prompt = np.asarray(inc.column("prompt_name").to_pylist(), dtype=object)
    values = inc.column("mean_jaccard").to_numpy(zero_copy_only=False).astype(float)
    names = list(order) + sorted(set(cells.column("model").to_pylist()) - set(order))
    prompts = sorted(set(cells.column("prompt_name").to_pylist()))
    mi = {m: i for i, m in enumerate(names)}
    pi = {q: i for i, q in enumerate(prompts)}
    rows = np.fromiter((mi[m] for m in model), dtype=np.int64, count=len(model))
    cols = np.fromiter((pi[q] for q in prompt), dtype=np.int64, count=len(prompt))
    matrix = np.full((len(names), len(prompts)), np.nan)
    matrix[rows, cols] = values  # later (newer) rows overwrite earlier ones
    duplicated = len(set(zip(rows.tolist(), cols.tolist(), strict=True))) < len(rows)
    return matrix, names, prompts, duplicated


def _plots(p: PanelData, opts: ReportOptions, avail: Availability) -> list[Block]:
    style = opts.plot_style
    models, cells = p.table("models"), p.table("cells")
    order = models.column("model").to_pylist() if models is not None else []
    blocks: list[Block] = []
    fig = plots.forest_plot(models, style)
    blocks.append(fig or missing_note("models.parquet", absent_columns(
        models, ("jaccard_ci_low", "jaccard_ci_high")) if models is not None else ()))
    fig = plots.rank_interval_plot(models, style)
    blocks.append(fig or missing_note("models.parquet", absent_columns(
        models, ("rank_ci_low", "rank_ci_high")) if models is not None else ()))
    if cells is None or cells.num_rows == 0:
        blocks.append(_file_missing(p, "cells"))
    else:
        matrix, names, prompts, dup = heatmap_matrix(cells, order,
                                                     chosen_column(cells, p.manifest))
        fig = plots.cell_heatmap(matrix, names, prompts, style)
        if fig is not None:
            blocks.append(fig)
            if dup:
                blocks.append(Note("some cells were measured by several campaigns; the heatmap "
                                   "shows each cell's latest measurement.", "info"))
    summary = p.manifest.get("summary") or {}
    fig = plots.drift_bars(p.table("drift"), order, style)
    blocks.append(fig or _file_missing(p, "drift"))
    if fig is not None:
        blocks.extend(_drift_views(summary.get("drift") or {}))
    fig = plots.stabilisation_curve(p.table("stabilisation"), style)
    blocks.append(fig or _file_missing(p, "stabilisation"))
    if fig is not None:
        blocks.extend(_stabilisation_summary(summary.get("stabilisation") or {}))
    if avail.table is None:
        blocks.append(Note(f"not available: availability timeline ({avail.reason})", "missing"))
    else:
        t = avail.table
        fig = plots.availability_timeline(t.column("model").to_pylist(),
                                          t.column("check_date").to_pylist(),
                                          t.column("status").to_pylist(), style)
        if fig is not None:
            blocks.append(fig)
    return blocks


def _drift_views(d: dict) -> list[Block]:
    """The three drift aggregates of the manifest (they differ, so all three are shown)."""
    views = ("macro_all_cells", "pooled_pairs", "macro_disagreeing_cells")
    if not d.get("classes") or not all(v in d for v in views):
        return []
    rows = tuple((Cell(c, c), *(Cell(fmt_num(d[v][i]), d[v][i]) for v in views))
                 for i, c in enumerate(d["classes"]))
    return [Table(("drift class", "macro mean, all cells", "pooled over disagreeing pairs",
                   "macro mean, disagreeing cells"), rows, table_id="drift-views"),
            Paragraph(f"{d.get('cells_disagreeing')} of {d.get('cells')} cells have a disagreeing "
                      f"pair; {d.get('disagreeing_pairs')} of {d.get('pairs')} pairs disagree; "
                      f"{d.get('label_only_pairs', 0)} agreeing pairs differ in label text only.")]


def _stabilisation_summary(st: dict) -> list[Block]:
    parts = []
    for key, label in (("abs", "absolute tolerance"), ("rel", "relative tolerance")):
        v = st.get(key)
        if v:
            parts.append(f"{label}: {v.get('stabilising')} of {v.get('cells')} cells stabilise "
                         f"before the endpoint (median r* {fmt_num(v.get('median_r_star'), 1)} "
                         f"runs), {v.get('censored')} censored")
    return [Paragraph("; ".join(parts) + ".")] if parts else []


# ------------------------------------------------------------------ 4–6. tables

def _pp(value: SupportsFloat | None) -> str:
    """A shift in fraction points as signed percentage points."""
    return "–" if value is None or is_missing(value) else f"{100.0 * float(value):+.1f} pp"


def _sensitivity(p: PanelData, opts: ReportOptions) -> list[Block]:
    """One compact table: a row per variant (rows changed, headline and its shift in percentage
    points, which models move), highlighted when anything changes. ``headline_share_perfect`` is a
    fraction and ``headline_shift`` is in fraction points (analysis.tables.sensitivity)."""
    sens = p.table("sensitivity")
    if sens is None:
        return [_file_missing(p, "sensitivity")]
    if "variant" not in sens.column_names:
        table, note = generic_table(sens, table_id=f"sensitivity-{p.name}-0",
                                    max_rows=opts.max_table_rows)
        return [missing_note("sensitivity.parquet", ["variant"]), table, *([note] if note else [])]
    blocks: list[Block] = []
    merge = (p.manifest.get("summary") or {}).get("merge") or {}
    if merge.get("share_perfect"):
        shares = ", ".join(f"{k} {100 * v:.1f}%" for k, v in merge["share_perfect"].items())
        blocks.append(Paragraph(
            f"Share of node-set-perfect cells by merge rule: {shares}; shift "
            f"{_pp(merge.get('shift_b_minus_a'))}; {merge.get('cells_changing_source', 0)} cell(s) "
            "change source between the rules."))
    variants = sens.column("variant").to_pylist()
    changed = (sens.column("changed").to_pylist() if "changed" in sens.column_names
               else [False] * sens.num_rows)
    rows_all = sens.to_pylist()
    groups: dict[str, list[int]] = {}
    for i, v in enumerate(variants):
        groups.setdefault(v, []).append(i)
    summary_rows, summary_hl = [], []
    for v, idx in groups.items():
        row, k = rows_all[idx[0]], sum(bool(changed[i]) for i in idx)
        what = [_change_text(rows_all[i]) for i in idx if changed[i]]
        extra = _stabilisation_text(row)
        text = "; ".join(what[:6]) + (f"; … {len(what) - 6} more" if len(what) > 6 else "")
        summary_rows.append((Cell(v, v), Cell(str(row.get("axis") or ""), row.get("axis") or ""),
                             Cell(f"{k}/{len(idx)}", k),
                             Cell(fmt_num(row.get("headline_share_perfect")),
                                  row.get("headline_share_perfect")),
                             Cell(_pp(row.get("headline_shift")), row.get("headline_shift")),
                             Cell("; ".join(x for x in (text or "—", extra) if x))))
        summary_hl.append(k > 0 or (not is_missing(row.get("headline_shift"))
                                    and abs(row["headline_shift"]) > 0))
    blocks.append(Table(("variant", "axis", "rows changed", "node-set-perfect share",
                         "headline shift", "what changes"), tuple(summary_rows),
                        table_id=f"sensitivity-summary-{p.name}", highlight=tuple(summary_hl)))
    blocks.append(Paragraph("One row per variant; the per-model rows of every variant are in "
                            "sensitivity.parquet."))
    return blocks


def _change_text(row: dict) -> str:
    """One changed sensitivity row in a few words: rank move, or dropping out of the table."""
    model = str(row.get("model") or "?")
    if row.get("included") is False:
        return f"{model} leaves the table"
    before, after = row.get("baseline_rank"), row.get("rank")
    if not is_missing(before) and not is_missing(after) and before != after:
        return f"{model} rank {before}→{after}"
    return f"{model} changes"


def _stabilisation_text(row: dict) -> str:
    if is_missing(row.get("stabilising_cells")):
        return ""
    return (f"{row['stabilising_cells']} cells stabilise, {row.get('censored_cells')} censored, "
            f"median r* {fmt_num(row.get('median_r_star'), 1)}")


PAIR_COLS = ("family", "model_a", "model_b", "n_common", "n_nonzero", "mean_diff", "p_zsplit", "p_drop",
             "rank_biserial", "mdd")


def _pairs(p: PanelData, opts: ReportOptions) -> list[Block]:
    pairs = p.table("pairs")
    if pairs is None:
        return [_file_missing(p, "pairs")]
    if pairs.num_rows == 0:
        fams = (p.manifest.get("summary") or {}).get("families") or {}
        return [Paragraph("No pairs to compare: no family holds two or more included models"
                          + (f" (families: {len(set(fams.values()))} for {len(fams)} models)."
                             if fams else "."))]
    lacking = absent_columns(pairs, [c for c in PAIR_COLS if c != "family"])
    order = [c for c in PAIR_COLS if c in pairs.column_names] + \
        [c for c in pairs.column_names if c not in PAIR_COLS]
    table, note = generic_table(pairs, table_id=f"pairs-{p.name}", columns=order,
                                max_rows=opts.max_table_rows, page_rows=opts.page_rows)
    blocks: list[Block] = [table, Paragraph(
        "mean_diff = b − a in mean Jaccard over common prompts; p_zsplit / p_drop = Wilcoxon "
        "signed-rank p under the zero-splitting / zero-dropping convention; mdd = the smallest "
        "difference this n could detect.")]
    if note:
        blocks.append(note)
    if lacking:
        blocks.append(missing_note("pairs.parquet", lacking))
    return blocks


LOO_COLS = ("dropped", "left_out", "dropped_model", "leave_out")


def _correctness(p: PanelData, opts: ReportOptions) -> list[Block]:
    corr = p.table("correlations")
    if corr is None:
        return [_file_missing(p, "correlations")]
    if corr.num_rows == 0:
        c = (p.manifest.get("summary") or {}).get("correctness") or {}
        detail = (f" ({c.get('runs_scored', 0)} runs scored; {c.get('prompts_without_ground_truth')}"
                  " prompts carry no ground-truth annotations)") if c else ""
        return [Paragraph("No correlations: no models were measured both for stability and "
                          f"against annotations{detail}.")]
    loo = next((c for c in LOO_COLS if c in corr.column_names), None)
    blocks: list[Block] = []
    if loo is None:
        table, _ = generic_table(corr, table_id=f"correlations-{p.name}")
        return [table, Note("correlations.parquet has no leave-one-out column "
                            f"({' / '.join(LOO_COLS)}); shown as one table.", "info")]
    valid = pc.is_valid(corr.column(loo))
    full, drops = corr.filter(pc.invert(valid)), corr.filter(valid)
    cols = [c for c in corr.column_names if c != loo]
    blocks.append(Heading("all models"))
    blocks.append(generic_table(full, table_id=f"correlations-{p.name}", columns=cols)[0])
    blocks.append(Heading("leave one out"))
    table, note = generic_table(drops, table_id=f"correlations-loo-{p.name}",
                                columns=[loo] + cols, max_rows=opts.max_table_rows,
                                page_rows=opts.page_rows)
    blocks.append(table)
    if note:
        blocks.append(note)
    runs = p.table("correctness")
    if runs is not None and "model" in runs.column_names:
        blocks.append(Paragraph(f"Correctness rests on {runs.num_rows} scored runs of "
                                f"{len(set(runs.column('model').to_pylist()))} models "
                                "(correctness.parquet)."))
    return blocks
