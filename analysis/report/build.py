"""``irbench report``: analysis outputs on disk → a dated, self-contained ``report.html`` and
``report.md``.

Inputs: ``analysis_dir`` — the output directory of ``irbench analyze`` (one subdirectory per
panel holding ``manifest.json`` and Parquet files; a single panel directory also works);
optionally ``data_dir`` — the dataset root, for raw-run provenance (outcome classes, instruction
hash, parameters) and the ``availability/`` dataset. Every number shown is read from those
files; the report never re-runs a statistic. Missing files degrade to one-line notices.

Outputs in ``out_dir``: ``report.html`` (plots embedded as data URIs, one inline script, no
external assets), ``report.md`` and ``figures/*.png`` (the Markdown links them).
"""

from __future__ import annotations

import datetime as dt
from typing import Any
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from analysis.errors import ReportInputError
from analysis.progress import REPORT_STAGES, Reporter, Stage, silent
from analysis.report.doc import Document, Section
from analysis.report.html import render_html
from analysis.report.md import render_md
from analysis.report.health import health_blocks, load_runs
from analysis.report.overtime import CampaignOverTime, load_over_time, over_time_blocks
from analysis.report.spend import load_spend, spend_blocks
from analysis.report.provenance import CELL_KEY, availability_blocks, provenance_blocks
from analysis.report.sections import (
    Availability, PanelData, ReportOptions, _correctness, _leaderboard, _pairs, _partition,
    _per_panel, _plots, _sensitivity,
)
from storage.parquet.atomic import write_text_atomic
from storage.clock import utc_now
from storage.wave_selection import WaveSelection

OUTPUT_TABLES = ("cells", "models", "excluded", "pairs", "sensitivity", "drift", "stabilisation",
                 "correctness", "correlations", "normalised")
SECTION_TITLES = (
    ("partition", "Headline partition"), ("leaderboard", "Leaderboard"), ("plots", "Plots"),
    ("sensitivity", "Sensitivity"), ("pairs", "Pairs"),
    ("correctness", "Correctness versus stability"), ("availability", "Availability"),
    ("overtime", "Over time"), ("health", "Run health"), ("provenance", "Provenance"),
)
#: sections left out when they have nothing to show (a store measured in one wave has no "Over time")
OPTIONAL_SECTIONS = frozenset({"overtime"})


@dataclass(frozen=True)
class ReportPaths:
    """Where the report went and how big it is (bytes)."""

    html: Path
    md: Path
    figures: tuple[Path, ...]
    html_bytes: int
    md_bytes: int


# ------------------------------------------------------------------ loading

def _panel_dirs(analysis_dir: Path) -> list[Path]:
    if (analysis_dir / "manifest.json").is_file() or (analysis_dir / "models.parquet").is_file():
        return [analysis_dir]
    found = sorted(d for d in analysis_dir.iterdir() if d.is_dir() and (
        (d / "manifest.json").is_file() or (d / "models.parquet").is_file()))
    return found


def load_panel(directory: Path) -> PanelData:
    """Read every known output file of one panel directory; absent → None, unreadable → problem."""
    tables: dict[str, pa.Table | None] = {}
    problems: dict[str, str] = {}
    for name in OUTPUT_TABLES:
        path = directory / f"{name}.parquet"
        if not path.is_file():
            tables[name] = None
            continue
        try:
            tables[name] = pq.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            tables[name] = None
            problems[name] = f"{type(exc).__name__}: {exc}"
    manifest: dict = {}
    mpath = directory / "manifest.json"
    if mpath.is_file():
        try:
            manifest = json.loads(mpath.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            problems["manifest"] = f"{type(exc).__name__}: {exc}"
    name = manifest.get("panel") or directory.name
    return PanelData(name, directory, manifest, tables, problems)


def load_availability(data_dir: Path | None) -> Availability:
    """Every check in ``DATA/availability/`` (:class:`storage.availability.AvailabilityStore`),
    as ``model, status, check_date, checked_at, retired_on`` sorted by (model, checked_at)."""
    if data_dir is None:
        return Availability(None, "no --data given, so the availability dataset was not read")
    root = Path(data_dir) / "availability"
    if not root.is_dir():
        return Availability(None, f"{root} missing (run `irbench availability`)")
    from storage.availability import AvailabilityStore
    from storage.errors import StorageError

    try:
        table = AvailabilityStore(Path(data_dir), fsync=False).read()
    except (OSError, pa.ArrowException, StorageError, ValueError) as exc:
        return Availability(None, f"{root} unreadable: {exc}")
    if table.num_rows == 0:
        return Availability(None, f"{root} holds no checks (run `irbench availability`)")
    return Availability(table.select(["model", "status", "check_date", "checked_at",
                                      "retired_on"]))


def load_run_provenance(data_dir: Path | None, panel: str, waves: WaveSelection | None = None) -> pa.Table | None:
    """Per cell of ``panel``: outcome class counts, instruction hash(es), request parameters
    (runs of ``waves``; default each campaign's latest)."""
    if data_dir is None or not (Path(data_dir) / "runs").is_dir():
        return None
    from storage.wave_selection import read_runs

    cols = list(CELL_KEY) + ["outcome", "instruction_sha256", "temperature", "max_tokens",
                             "total_timeout_s"]
    try:
        runs = read_runs(Path(data_dir), waves or WaveSelection(), columns=cols)
    except (OSError, pa.ArrowException, ValueError):
        return None
    runs = runs.filter(pc.equal(runs.column("panel"), panel))
    if runs.num_rows == 0:
        return None
    key = list(CELL_KEY)
    counts = runs.group_by(key + ["outcome"]).aggregate([("outcome", "count")])
    params = runs.group_by(key).aggregate([(c, "distinct") for c in
                                           ("instruction_sha256", "temperature", "max_tokens",
                                            "total_timeout_s")])
    out: dict[tuple, dict] = {}
    for r in counts.to_pylist():
        entry = out.setdefault(tuple(r[k] for k in key), {"outcomes": {}})
        entry["outcomes"][r["outcome"]] = r["outcome_count"]
    for r in params.to_pylist():
        entry = out.setdefault(tuple(r[k] for k in key), {"outcomes": {}})
        entry["instruction_sha256"] = ", ".join(sorted(h[:12] for h in r["instruction_sha256_distinct"] if h))
        entry["parameters"] = "; ".join(
            f"{c} {', '.join('none' if v is None else str(v) for v in r[c + '_distinct'])}"
            for c in ("temperature", "max_tokens", "total_timeout_s"))
    rows = [{**dict(zip(key, k, strict=True)),
             "outcomes": ", ".join(f"{o} {n}" for o, n in sorted(v["outcomes"].items())),
             "instruction_sha256": v.get("instruction_sha256"), "parameters": v.get("parameters")}
            for k, v in out.items()]
    return pa.Table.from_pylist(rows)


# ------------------------------------------------------------------ assembly

def measurement_window(panels: list[PanelData]) -> tuple[str | None, str | None]:
    """First and last measurement date over the panels' manifests (ISO strings)."""
    firsts, lasts = [], []
    for p in panels:
        w = p.manifest.get("data_window") or {}
        if w.get("first_measurement_date"):
            firsts.append(w["first_measurement_date"])
        if w.get("last_measurement_date"):
            lasts.append(w["last_measurement_date"])
    return (min(firsts) if firsts else None, max(lasts) if lasts else None)


def build_document(panels: list[PanelData], avail: Availability, opts: ReportOptions,
                   made_on: dt.datetime, runs: pa.Table | None = None,
                   spend: dict[str, Any] | None = None,
                   over_time: list[CampaignOverTime] | None = None) -> Document:
    """All sections, in order, from loaded outputs (``runs``: raw-run columns for the health
    section, :func:`analysis.report.health.load_runs`; ``spend``: panel → its tokens and cost,
    :func:`analysis.report.spend.load_spend`, shown after the health tables; ``over_time``: the
    campaigns of two or more waves, :func:`analysis.report.overtime.load_over_time`)."""
    first, last = measurement_window(panels)
    window = f"{first} to {last}" if first else "unknown measurement window"
    if any((pd.manifest.get("data_window") or {}).get("includes_windows") for pd in panels):
        window += " (some dates are study windows, not stamps)"
    title = f"irbench report — measured {window} — reported {made_on.date().isoformat()}"
    subtitle = (f"Panels: {', '.join(p.name for p in panels)}. Report made "
                f"{made_on.astimezone(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')} from the analysis "
                "outputs on disk; every figure below is read from them.")
    builders = {
        "partition": lambda: _per_panel(panels, _partition),
        "leaderboard": lambda: _per_panel(panels, lambda p: _leaderboard(p, opts)),
        "plots": lambda: _per_panel(panels, lambda p: _plots(p, opts, avail)),
        "sensitivity": lambda: _per_panel(panels, lambda p: _sensitivity(p, opts)),
        "pairs": lambda: _per_panel(panels, lambda p: _pairs(p, opts)),
        "correctness": lambda: _per_panel(panels, lambda p: _correctness(p, opts)),
        "availability": lambda: availability_blocks(panels, avail, opts),
        "overtime": lambda: over_time_blocks(over_time or [], opts.plot_style),
        "health": lambda: _per_panel(panels, lambda p: health_blocks(p.name, runs) + (
            spend_blocks(p.name, spend.get(p.name)) if spend is not None else [])),
        "provenance": lambda: _per_panel(panels, lambda p: provenance_blocks(p, opts)),
    }
    built = [(anchor, title_, tuple(builders[anchor]())) for anchor, title_ in SECTION_TITLES]
    shown = [b for b in built if b[2] or b[0] not in OPTIONAL_SECTIONS]
    sections = tuple(Section(anchor, f"{i}. {title_}", blocks)
                     for i, (anchor, title_, blocks) in enumerate(shown, start=1))
    return Document(title, subtitle, sections)


def build_report(analysis_dir: Path, out_dir: Path, *, data_dir: Path | None = None,
                 now: Callable[[], dt.datetime] = utc_now,
                 options: ReportOptions | None = None,
                 progress: Reporter = silent) -> ReportPaths:
    """Write ``report.html``, ``report.md`` and ``figures/`` into ``out_dir``; see module doc.

    ``now`` is the clock giving the report date (injected for reproducible tests). Raises
    :class:`ReportInputError` when ``analysis_dir`` holds no panel outputs. ``progress``
    receives a :class:`analysis.progress.Stage` as each stage starts.
    """
    analysis_dir, out_dir = Path(analysis_dir), Path(out_dir)
    if not analysis_dir.is_dir():
        raise ReportInputError(f"analysis directory {analysis_dir} does not exist; run "
                               "`irbench analyze --data DIR --out DIR` first and pass its --out")
    dirs = _panel_dirs(analysis_dir)
    if not dirs:
        raise ReportInputError(f"{analysis_dir} holds no panel outputs (no */manifest.json or "
                               "*/models.parquet); run `irbench analyze` and pass its --out")
    opts = options or ReportOptions()
    panels = []
    total = len(REPORT_STAGES)
    progress(Stage("load", index=1, total=total, count=len(dirs), unit="panels"))
    for d in dirs:
        p = load_panel(d)
        prov = load_run_provenance(data_dir, p.name, opts.waves)
        panels.append(PanelData(p.name, p.directory, p.manifest, p.tables, p.problems, prov))
    progress(Stage("document", index=2, total=total, count=len(panels), unit="panels"))
    spend = {p.name: load_spend(data_dir, p.name) for p in panels} if data_dir is not None else None
    doc = build_document(panels, load_availability(data_dir), opts, now(), load_runs(data_dir, opts.waves), spend,
                         load_over_time(data_dir))
    progress(Stage("render", index=3, total=total, count=2, unit="files (HTML, Markdown)"))
    out_dir.mkdir(parents=True, exist_ok=True)
    html_path, md_path, fig_dir = out_dir / "report.html", out_dir / "report.md", out_dir / "figures"
    html = render_html(doc)
    md, figures = render_md(doc, fig_dir)
    write_text_atomic(html, html_path)
    write_text_atomic(md, md_path)
    return ReportPaths(html_path, md_path, figures, html_path.stat().st_size,
                       md_path.stat().st_size)
