"""Report sections 7 (availability) and 8 (provenance and the analysis manifest).

Availability: per model, the latest check's status and the date since which every check has
returned it; per table, the share of rows that rest on models whose current status is in
``ReportOptions.gone_statuses`` (cannot be re-measured). Provenance: per cell, campaign,
measurement dates, runs attempted/successful (``cells.parquet``) and — when the raw runs are
available — outcome classes, instruction hash and request parameters; then the manifest.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from analysis.report.doc import Block, Cell, Heading, Note, Paragraph, Table
from analysis.report.sections import Availability, PanelData, ReportOptions
from analysis.report.tables import fmt_num, generic_table, missing_note

CELL_KEY = ("panel", "campaign", "model", "prompt_sha256", "budget_max_tokens")


def current_status(avail: pa.Table) -> dict[str, tuple[str, Any, Any, Any]]:
    """``{model: (status now, since date, last check date, retired_on)}``; "since" is the first
    check of the current unbroken run of that status. Input sorted by (model, checked_at)."""
    out: dict[str, tuple[str, Any, Any, Any]] = {}
    retired = (avail.column("retired_on").to_pylist() if "retired_on" in avail.column_names
               else [None] * avail.num_rows)
    for model, date, status, ret in zip(avail.column("model").to_pylist(),
                                        avail.column("check_date").to_pylist(),
                                        avail.column("status").to_pylist(), retired, strict=True):
        prev = out.get(model)
        if prev is None or prev[0] != status:
            out[model] = (status, date, date, ret)
        else:
            out[model] = (status, prev[1], date, ret or prev[3])
    return out


def _share_gone(table: pa.Table | None, gone: set[str]) -> str | None:
    if table is None or table.num_rows == 0:
        return None
    cols = [c for c in ("model", "model_a", "model_b") if c in table.column_names]
    if not cols:
        return None
    values = [table.column(c).to_pylist() for c in cols]
    hit = sum(any(v[i] in gone for v in values) for i in range(table.num_rows))
    return f"{hit}/{table.num_rows} rows ({hit / table.num_rows:.0%})"


def availability_blocks(panels: list[PanelData], avail: Availability,
                        opts: ReportOptions) -> tuple[Block, ...]:
    """Section 7 blocks (availability is global, tables are per panel)."""
    if avail.table is None:
        return (Note(f"not available: {avail.reason}", "missing"),)
    status = current_status(avail.table)
    rows = tuple((Cell(m, m), Cell(s, s), Cell(str(since), str(since)), Cell(str(last), str(last)),
                  Cell(ret or "", ret or ""))
                 for m, (s, since, last, ret) in sorted(status.items()))
    blocks: list[Block] = [Table(("model", "status now", "since", "last check", "retired on"),
                                 rows, table_id="availability", page_rows=opts.page_rows)]
    gone = {m for m, (s, _, _, _) in status.items() if s in opts.gone_statuses}
    blocks.append(Paragraph(f"{len(gone)} model(s) can no longer be re-measured (status "
                            f"{' / '.join(opts.gone_statuses)}): {', '.join(sorted(gone)) or 'none'}."))
    for p in panels:
        cells = p.table("cells")
        measured = set() if cells is None else set(cells.column("model").to_pylist())
        never = sorted(measured - set(status))
        shares = []
        for name in ("models", "cells", "pairs", "sensitivity", "correctness", "drift"):
            share = _share_gone(p.table(name), gone)
            if share is not None:
                shares.append((Cell(name, name), Cell(share, share)))
        if len(panels) > 1:
            blocks.append(Heading(f"panel {p.name}"))
        blocks.append(Table(("table", "rows on models that cannot be re-measured"),
                            tuple(shares), table_id=f"availability-share-{p.name}"))
        if never:
            blocks.append(Note(f"{len(never)} measured model(s) have no availability check: "
                               f"{', '.join(never[:20])}{' …' if len(never) > 20 else ''}",
                               "warning"))
    return tuple(blocks)


PROV_COLS = ("model", "prompt_name", "campaign", "source", "chosen_highest_budget_first",
             "chosen_earliest_then_top_up", "budget_max_tokens", "first_date", "last_date",
             "runs_total", "runs_ok", "included", "outcomes", "instruction_sha256", "parameters")


def _provenance_rows(cells: pa.Table, runs: pa.Table | None) -> pa.Table:
    if runs is None or runs.num_rows == 0:
        return cells
    lookup = {tuple(r[k] for k in CELL_KEY): r for r in runs.to_pylist()}
    extra: dict[str, list] = {"outcomes": [], "instruction_sha256": [], "parameters": []}
    keys = [cells.column(k).to_pylist() for k in CELL_KEY]
    for i in range(cells.num_rows):
        r = lookup.get(tuple(k[i] for k in keys))
        extra["outcomes"].append(r["outcomes"] if r else None)
        extra["instruction_sha256"].append(r["instruction_sha256"] if r else None)
        extra["parameters"].append(r["parameters"] if r else None)
    for name, values in extra.items():
        cells = cells.append_column(name, pa.array(values, pa.string()))
    return cells


def provenance_blocks(p: PanelData, opts: ReportOptions) -> list[Block]:
    """Section 8 blocks for one panel: the capped, paginated per-cell table and the manifest."""
    blocks: list[Block] = []
    cells = p.table("cells")
    if cells is None:
        blocks.append(missing_note("cells.parquet"))
    else:
        ordered = cells.sort_by([("model", "ascending"), ("prompt_name", "ascending"),
                                 ("campaign", "ascending")])
        shown = ordered.slice(0, opts.max_table_rows)
        table = _provenance_rows(shown, p.provenance)
        out, note = generic_table(table, table_id=f"provenance-{p.name}", columns=PROV_COLS,
                                  page_rows=opts.page_rows)
        blocks.append(out)
        if shown.num_rows < cells.num_rows:
            blocks.append(Note(f"showing the first {shown.num_rows} of {cells.num_rows} cells "
                               "(sorted by model, prompt); every cell is in cells.parquet.", "info"))
        if p.provenance is None:
            blocks.append(Note("outcome classes, instruction hash and parameters need the raw "
                               "runs: pass --data to irbench report.", "info"))
    blocks.extend(manifest_blocks(p))
    return blocks


def manifest_blocks(p: PanelData) -> list[Block]:
    """The analysis manifest: seed, replicates, options with units, window, inputs."""
    m = p.manifest
    if not m:
        return [missing_note("manifest.json")]
    window = m.get("data_window", {})
    blocks: list[Block] = [Heading("analysis manifest"), Paragraph(
        f"seed {m.get('seed')}, {m.get('replicates')} bootstrap replicates; data window "
        f"{window.get('first_measurement_date')} to {window.get('last_measurement_date')} "
        f"({window.get('unit', 'UTC date')}); analysis generated {m.get('generated_at')} by irbench "
        f"{m.get('irbench_version')}.")]
    opt_rows = tuple((Cell(k), Cell(_json_text(v.get("value"))), Cell(str(v.get("unit", ""))),
                      Cell(str(v.get("description", ""))))
                     for k, v in (m.get("options") or {}).items() if isinstance(v, dict))
    blocks.append(Table(("option", "value", "unit", "meaning"), opt_rows,
                        table_id=f"manifest-options-{p.name}"))
    flat = {**{f"input.{k}": v for k, v in (m.get("input") or {}).items()},
            **{f"output.{k}": v for k, v in (m.get("output") or {}).items()}}
    blocks.append(Table(("entry", "value"), tuple((Cell(k), Cell(_json_text(v)))
                                                 for k, v in flat.items()),
                        table_id=f"manifest-counts-{p.name}"))
    return blocks


def _json_text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        shown = ", ".join(str(v) for v in value[:30])
        return shown + (f" … ({len(value)} in all)" if len(value) > 30 else "")
    if isinstance(value, float):
        return fmt_num(value, 4)
    return str(value)
