"""Formatting analysis tables into report blocks: numbers → text, rows → :class:`Table`.

Input: pyarrow tables as written by ``irbench analyze``. Output: report_doc blocks. Values are
only formatted (rounded for display; the raw value is kept as the cell's sort key), never
re-estimated.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from typing import SupportsFloat, SupportsInt

import pyarrow as pa

from analysis.report.doc import Cell, Note, Table

DASH = "–"


def is_missing(value: object) -> bool:
    """None or a float NaN."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt_num(value: SupportsFloat | None, digits: int = 3) -> str:
    """A float with ``digits`` decimals, an int as is, missing as an en dash."""
    if value is None or is_missing(value):
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    return f"{float(value):.{digits}f}"


def fmt_p(value: SupportsFloat | None) -> str:
    """A p-value with three significant digits (small ones in scientific notation)."""
    if value is None or is_missing(value):
        return DASH
    return f"{float(value):.3g}"


def fmt_interval(low: SupportsFloat | None, high: SupportsFloat | None, digits: int = 3) -> str:
    """``[low, high]`` or an en dash when either end is missing."""
    if is_missing(low) or is_missing(high):
        return DASH
    return f"[{fmt_num(low, digits)}, {fmt_num(high, digits)}]"


def fmt_range(low: SupportsInt | None, high: SupportsInt | None) -> str:
    """An integer range ``low–high`` (a single number when they coincide)."""
    if low is None or high is None or is_missing(low) or is_missing(high):
        return DASH
    lo, hi = int(low), int(high)
    return str(lo) if lo == hi else f"{lo}–{hi}"


def fmt_value(name: str, value: object) -> Cell:
    """Format one value by its column name and Python type; keeps the raw value as sort key."""
    if is_missing(value):
        return Cell(DASH, None)
    if isinstance(value, bool):
        return Cell("yes" if value else "no", int(value))
    if isinstance(value, int):
        return Cell(str(value), value)
    if isinstance(value, float):
        lower = name.lower()
        if lower.startswith("p_") or lower.endswith("_p") or lower in ("p", "pvalue", "p_value"):
            return Cell(fmt_p(value), value)
        return Cell(fmt_num(value), value)
    if isinstance(value, dt.datetime | dt.date):
        return Cell(value.isoformat(), value.isoformat())
    if isinstance(value, list | tuple):
        text = ", ".join(str(v) for v in value)
        return Cell(text, text)
    if isinstance(value, dict):
        text = ", ".join(f"{k} {v}" for k, v in value.items())
        return Cell(text, text)
    return Cell(str(value), str(value))


def generic_table(table: pa.Table, *, table_id: str, columns: Sequence[str] | None = None,
                  highlight: Sequence[bool] = (), caption: str = "",
                  max_rows: int | None = None, page_rows: int | None = None
                  ) -> tuple[Table, Note | None]:
    """Every column (or ``columns``, in that order, those present) as formatted cells.

    With ``max_rows`` only the first rows are kept and a note says how many were left out.
    """
    names = [c for c in (columns or table.column_names) if c in table.column_names]
    shown = table if max_rows is None or table.num_rows <= max_rows else table.slice(0, max_rows)
    data = {c: shown.column(c).to_pylist() for c in names}
    rows = tuple(tuple(fmt_value(c, data[c][i]) for c in names) for i in range(shown.num_rows))
    note = None
    if shown.num_rows < table.num_rows:
        note = Note(f"showing the first {shown.num_rows} of {table.num_rows} rows; the full "
                    f"table is in the analysis output ({table_id}).", "info")
    out = Table(tuple(names), rows, table_id=table_id, caption=caption,
                highlight=tuple(highlight[: shown.num_rows]), page_rows=page_rows)
    return out, note


def missing_note(file: str, columns: Sequence[str] = ()) -> Note:
    """The standard one-line notice for an absent input file or columns."""
    if columns:
        return Note(f"not available: {file} lacks column(s) {', '.join(columns)} "
                    "(run irbench analyze)", "missing")
    return Note(f"not available: {file} missing (run irbench analyze)", "missing")


def absent_columns(table: pa.Table | None, columns: Sequence[str]) -> list[str]:
    """The names in ``columns`` that ``table`` lacks (all of them when there is no table)."""
    if table is None:
        return list(columns)
    return [c for c in columns if c not in table.column_names]
