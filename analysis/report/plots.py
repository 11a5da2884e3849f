"""Report figures: matplotlib (Agg canvas, no pyplot state) → PNG bytes with a one-line caption.

Every function takes analysis output tables (pyarrow) exactly as written by ``irbench analyze``
and returns a :class:`analysis.report.doc.Figure`, or ``None`` when the columns it needs are
absent. Nothing here estimates anything: plotted values are read from the tables; the only
arithmetic is display aggregation that the caption states (pooled shares from pair counts,
cumulative shares of stabilised cells, averaging adjacent prompts when a heatmap is too wide).

Colours: the Okabe–Ito palette (safe under the common colour-vision deficiencies) for classes,
``cividis`` (perceptually uniform, CVD-safe) for the heatmap; missing cells are light grey.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TypeGuard

import numpy as np
import pyarrow as pa
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib import colormaps
from matplotlib.figure import Figure as MplFigure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from analysis.report.doc import Figure

HEATMAP_CMAP = "viridis"  # perceptually uniform and never grey
MISSING_HATCH = "#D55E00"  # vermillion: a hue viridis never takes, so "not measured" is unmistakable
OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
             "#000000")


@dataclass(frozen=True)
class PlotStyle:
    """Figure geometry and fonts. Sizes in inches and points; ``dpi`` in pixels per inch."""

    dpi: int = 100
    width_in: float = 9.0
    font_size_pt: float = 11.0
    row_height_in: float = 0.24  # per model row in forest/rank plots
    heatmap_max_prompts: int = 150  # wider panels average adjacent prompts into bins
    heatmap_max_models: int = 150  # taller panels average adjacent models into bins
    heatmap_max_labels: int = 600  # tiles up to which each tile prints its value


def _new_figure(style: PlotStyle, height_in: float) -> MplFigure:
    fig = MplFigure(figsize=(style.width_in, height_in), dpi=style.dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: MplFigure, style: PlotStyle) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=style.dpi)
    return buf.getvalue()


def _has(table: pa.Table | None, *columns: str) -> TypeGuard[pa.Table]:
    """``table`` is present, has rows and has every one of ``columns``."""
    return table is not None and table.num_rows > 0 and all(c in table.column_names for c in columns)


def _floats(table: pa.Table, name: str) -> np.ndarray:
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=float)


def _fontsize(fig: MplFigure, style: PlotStyle) -> None:
    for ax in fig.axes:
        for item in [ax.title, ax.xaxis.label, ax.yaxis.label]:
            item.set_fontsize(style.font_size_pt)
        ax.tick_params(labelsize=style.font_size_pt - 1)


def forest_plot(models: pa.Table | None, style: PlotStyle = PlotStyle()) -> Figure | None:
    """Per-model mean Jaccard (and ID-stability when its interval exists) with 95% intervals,
    models in table (rank) order top to bottom. Needs ``jaccard_ci_low/high``."""
    if not _has(models, "model", "mean_jaccard", "jaccard_ci_low", "jaccard_ci_high"):
        return None
    names = models.column("model").to_pylist()
    n = len(names)
    panels = [("mean Jaccard", "mean_jaccard", "jaccard_ci_low", "jaccard_ci_high", OKABE_ITO[4])]
    if _has(models, "id_stability", "id_ci_low", "id_ci_high"):
        panels.append(("ID-stability", "id_stability", "id_ci_low", "id_ci_high", OKABE_ITO[5]))
    fig = _new_figure(style, max(2.5, style.row_height_in * n + 1.2))
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    y = np.arange(n)
    for ax, (label, est, lo, hi, colour) in zip(axes, panels, strict=True):
        mid, low, high = _floats(models, est), _floats(models, lo), _floats(models, hi)
        err = np.vstack([mid - low, high - mid])
        ax.errorbar(mid, y, xerr=np.where(np.isfinite(err), err, 0.0), fmt="o", color=colour,
                    ecolor=colour, capsize=2, markersize=4)
        ax.set_xlim(-0.02, 1.02)
        ax.set_xlabel(f"{label} (95% interval)")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, names if n <= 60 else [""] * n)
    axes[0].invert_yaxis()
    _fontsize(fig, style)
    caption = ("Forest plot: each model's mean over its prompts with its 95% bootstrap "
               "interval (method in the leaderboard's note); overlapping intervals mean the order between those models is not settled.")
    return Figure("forest", _png(fig, style), caption, "forest plot of per-model intervals")


def rank_interval_plot(models: pa.Table | None, style: PlotStyle = PlotStyle()) -> Figure | None:
    """Point rank with the marginal 95% rank interval and, when present, the simultaneous set."""
    if not _has(models, "model", "rank", "rank_ci_low", "rank_ci_high"):
        return None
    names = models.column("model").to_pylist()
    n = len(names)
    y = np.arange(n)
    rank = _floats(models, "rank")
    fig = _new_figure(style, max(2.5, style.row_height_in * n + 1.2))
    ax = fig.subplots()
    handles = []
    if _has(models, "rank_set_low", "rank_set_high"):
        lo, hi = _floats(models, "rank_set_low"), _floats(models, "rank_set_high")
        ax.hlines(y, lo - 0.4, hi + 0.4, color=OKABE_ITO[1], linewidth=7, alpha=0.6)
        handles.append(Patch(color=OKABE_ITO[1], alpha=0.6, label="simultaneous 95% rank set"))
    lo, hi = _floats(models, "rank_ci_low"), _floats(models, "rank_ci_high")
    ax.hlines(y, lo, hi, color=OKABE_ITO[5], linewidth=2)
    handles.append(Patch(color=OKABE_ITO[5], label="marginal 2.5–97.5% rank interval"))
    ax.plot(rank, y, "o", color="#000000", markersize=4)
    handles.append(Patch(color="#000000", label="point-estimate rank"))
    ax.set_yticks(y, names if n <= 60 else [""] * n)
    ax.invert_yaxis()
    ax.set_xlim(0.4, n + 0.6)
    ax.set_xlabel("rank (1 = most stable)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=3,
              frameon=False, fontsize=style.font_size_pt - 2)
    _fontsize(fig, style)
    caption = ("Rank intervals: a long bar means the data cannot place that model; only models whose "
               "bars do not overlap are ordered with confidence.")
    return Figure("ranks", _png(fig, style), caption, "rank-interval plot")


def _bin_axis(matrix: np.ndarray, axis: int, max_len: int) -> tuple[np.ndarray, int]:
    """Average adjacent rows/columns (NaN-aware) so the axis has at most ``max_len`` entries."""
    size = matrix.shape[axis]
    if size <= max_len:
        return matrix, 1
    k = int(np.ceil(size / max_len))
    pad = (-size) % k
    widths = [(0, 0), (0, 0)]
    widths[axis] = (0, pad)
    padded = np.pad(matrix, widths, constant_values=np.nan)
    moved = np.moveaxis(padded, axis, 0)
    grouped = moved.reshape(moved.shape[0] // k, k, *moved.shape[1:])
    sums = np.nansum(grouped, axis=1)
    counts = np.sum(np.isfinite(grouped), axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return np.moveaxis(means, 0, axis), k


def cell_heatmap(matrix: np.ndarray, model_names: list[str], prompt_names: list[str],
                 style: PlotStyle = PlotStyle()) -> Figure | None:
    """Heatmap of per-cell mean Jaccard, ``matrix[model, prompt]`` with NaN = no included cell.

    Wide (or tall) panels are averaged over adjacent prompts (models) so the PNG stays small;
    the caption says by how much.
    """
    if matrix.size == 0:
        return None
    shown, kp = _bin_axis(matrix, 1, style.heatmap_max_prompts)
    shown, km = _bin_axis(shown, 0, style.heatmap_max_models)
    n_rows, n_cols = shown.shape
    labelled_prompts = kp == 1 and n_cols <= 40
    label_space_in = 0.09 * max((len(q) for q in prompt_names), default=0) if labelled_prompts else 0.6
    fig = _new_figure(style, max(2.8, 0.22 * n_rows + 1.2 + min(label_space_in, 3.0)))
    ax = fig.subplots()
    # viridis runs purple → green → yellow with no grey anywhere, so an unmeasured cell (hatched,
    # drawn through the transparent "bad" colour) cannot be read as a middling value
    cmap = colormaps[HEATMAP_CMAP].with_extremes(bad=(0.0, 0.0, 0.0, 0.0))
    ax.set_facecolor("white")
    ax.add_patch(Rectangle((-0.5, -0.5), n_cols, n_rows, facecolor="white",
                           edgecolor=MISSING_HATCH, hatch="xx", linewidth=0, zorder=0))
    im = ax.imshow(np.ma.masked_invalid(shown), aspect="auto", cmap=cmap, vmin=0.0, vmax=1.0,
                   interpolation="nearest", zorder=1)
    if n_rows * n_cols <= style.heatmap_max_labels:
        for (i, j), v in np.ndenumerate(shown):
            if np.isfinite(v):  # dark text on the bright end of viridis, white on the dark end
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", zorder=2,
                        fontsize=max(5.0, style.font_size_pt - 4),
                        color="black" if v > 0.55 else "white")
    if km == 1 and n_rows <= 80:
        ax.set_yticks(np.arange(n_rows), model_names)
    else:
        ax.set_ylabel(f"models (rows of {km})" if km > 1 else "models")
        ax.set_yticks([])
    if labelled_prompts:
        ax.set_xticks(np.arange(n_cols), prompt_names, rotation=60, ha="right")
    else:
        ax.set_xlabel(f"prompts ({len(prompt_names)}" + (f", columns average {kp} prompts)"
                                                          if kp > 1 else ")"))
        ax.set_xticks([])
    bar = fig.colorbar(im, ax=ax, fraction=0.04)
    bar.set_label("mean Jaccard of the cell", fontsize=style.font_size_pt - 1)
    ax.set_title("mean Jaccard per cell; hatched = not measured (no included cell)", loc="left")
    _fontsize(fig, style)
    grouping = ""
    if kp > 1 or km > 1:
        parts = [f"{kp} adjacent prompts" if kp > 1 else "", f"{km} adjacent models" if km > 1 else ""]
        grouping = (" Display only: each tile averages up to "
                    + " × ".join(x for x in parts if x) + " over their measured cells.")
    values = ("Each tile shows its value." if n_rows * n_cols <= style.heatmap_max_labels else
              f"Too many tiles to print values ({n_rows * n_cols}); the cells table and "
              "`irbench view` hold them.")
    caption = ("Per-cell mean Jaccard (rows = models in table order, columns = prompts); purple = "
               "unstable, yellow = stable, hatched = not measured — look for prompts that are "
               "unstable for every model. " + values + grouping)
    return Figure("heatmap", _png(fig, style), caption, "heatmap of per-cell Jaccard")


DRIFT_CLASSES = (("agree", "agree", OKABE_ITO[2]), ("count_drift", "count drift", OKABE_ITO[5]),
                 ("id_drift", "id-label drift", OKABE_ITO[0]),
                 ("metadata_drift", "metadata drift", OKABE_ITO[1]))


def drift_bars(drift: pa.Table | None, order: list[str] | None = None,
               style: PlotStyle = PlotStyle()) -> Figure | None:
    """Stacked horizontal bars per model: pooled share of run pairs in each drift class
    (class pair counts summed over the model's cells ÷ all its pairs)."""
    cols = [c for c, _, _ in DRIFT_CLASSES]
    if not _has(drift, "model", *cols):
        return None
    models = np.asarray(drift.column("model").to_pylist(), dtype=object)
    names, inverse = np.unique(models, return_inverse=True)
    counts = np.vstack([np.bincount(inverse, weights=np.nan_to_num(_floats(drift, c)),
                                    minlength=len(names)) for c in cols]).T
    totals = counts.sum(axis=1, keepdims=True)
    shares = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    if order:
        pos = {m: i for i, m in enumerate(order)}
        labels: list[str] = names.tolist()
        idx = sorted(range(len(labels)), key=lambda i: (pos.get(labels[i], len(pos)), labels[i]))
        names, shares = names[idx], shares[idx]
    n = len(names)
    fig = _new_figure(style, max(2.5, style.row_height_in * n + 1.4))
    ax = fig.subplots()
    y = np.arange(n)
    left = np.zeros(n)
    for j, (_, label, colour) in enumerate(DRIFT_CLASSES):
        ax.barh(y, shares[:, j], left=left, color=colour, label=label, height=0.75)
        left += shares[:, j]
    ax.set_yticks(y, list(names) if n <= 60 else [""] * n)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of run pairs (pooled over the model's cells)")
    ax.legend(ncols=4, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False,
              fontsize=style.font_size_pt - 2)
    _fontsize(fig, style)
    caption = ("Drift classes per model: the longer the green 'agree' bar, the more run pairs "
               "returned the same structure; vermillion = node count moved, orange = ids moved, "
               "blue = only metadata moved.")
    return Figure("drift", _png(fig, style), caption, "stacked bars of drift class shares")


def stabilisation_curve(stab: pa.Table | None, style: PlotStyle = PlotStyle()) -> Figure | None:
    """Share of cells whose rolling node count has stabilised by rerun r, per tolerance reading;
    censored cells (null r*) never count, so each curve ends below 1 by the censored share."""
    if not _has(stab, "r_star_absolute", "r_star_relative"):
        return None
    n = stab.num_rows
    r_abs, r_rel = _floats(stab, "r_star_absolute"), _floats(stab, "r_star_relative")
    r_max = int(np.nanmax(_floats(stab, "runs"))) if "runs" in stab.column_names else int(
        np.nanmax(np.concatenate([r_abs, r_rel, [1.0]])))
    r = np.arange(1, max(r_max, 1) + 1)
    fig = _new_figure(style, 3.6)
    ax = fig.subplots()
    for values, label, colour in ((r_abs, "absolute tolerance (nodes)", OKABE_ITO[4]),
                                  (r_rel, "relative tolerance (fraction of M)", OKABE_ITO[5])):
        ok = values[np.isfinite(values)]
        share = np.searchsorted(np.sort(ok), r, side="right") / n
        censored = 1.0 - ok.size / n
        ax.step(r, share, where="post", color=colour, linewidth=2,
                label=f"{label}; censored {censored:.0%}")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("rerun r")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("share of cells stabilised by r")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=style.font_size_pt - 2)
    _fontsize(fig, style)
    caption = ("Stabilisation: how many reruns a consumer needs before the mean node count "
               "settles; the gap above each curve is the censored share (never shown to settle).")
    return Figure("stabilisation", _png(fig, style), caption, "stabilisation curves")


STATUS_COLOURS = {"available": OKABE_ITO[2], "retired": OKABE_ITO[5], "not_listed": OKABE_ITO[0],
                  "not_found": OKABE_ITO[6], "auth_error": OKABE_ITO[3], "timeout": OKABE_ITO[1],
                  "error": "#000000"}


def availability_timeline(models: list[str], dates: list, statuses: list[str],
                          style: PlotStyle = PlotStyle()) -> Figure | None:
    """One row per model, one marker per availability check, coloured by status."""
    if not models:
        return None
    names = sorted(set(models))
    pos = {m: i for i, m in enumerate(names)}
    fig = _new_figure(style, max(2.2, style.row_height_in * len(names) + 1.4))
    ax = fig.subplots()
    seen = []
    for status in sorted(set(statuses)):
        idx = [i for i, s in enumerate(statuses) if s == status]
        ax.scatter([dates[i] for i in idx], [pos[models[i]] for i in idx], marker="s", s=30,
                   color=STATUS_COLOURS.get(status, "#999999"), label=status)
        seen.append(status)
    ax.set_yticks(range(len(names)), names if len(names) <= 60 else [""] * len(names))
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlabel("check date")
    ax.legend(ncols=min(4, len(seen)), loc="lower center", bbox_to_anchor=(0.5, 1.0),
              frameon=False, fontsize=style.font_size_pt - 2)
    fig.autofmt_xdate()
    _fontsize(fig, style)
    caption = ("Availability checks per model: a row turning from green to another colour marks "
               "when that model stopped being re-measurable.")
    return Figure("availability", _png(fig, style), caption, "availability timeline")
