"""How the viewer's pages are rendered: the Jinja environment and its filters, the legend of
terms, the security headers every response carries, and JSON-safe values."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape

from analysis.waves.served import served_text

CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"}


#: One line per term a page shows without saying what it means (``macros.legend``).
LEGEND = {
    "drift class": "what first differs between the two runs, tested in this order: count (node "
                   "count or node kinds differ), id-label (same count and kinds, other ids), "
                   "metadata (same ids, a range or meta field differs), agree (none of these; "
                   "label text alone is not drift); unparsed: a run has no parseable IR.",
    "rank held": "share of bootstrap replicates (prompts resampled with replacement) in which the "
                 "model sits at exactly its rank in the table.",
    "rank interval": "marginal bootstrap interval of the model's rank at the analysis' level "
                     "(95% by default: the 2.5th to 97.5th percentile of its replicate ranks); "
                     "a per-model statement, with no guarantee for all models at once.",
    "rank set": "simultaneous rank confidence set (pairwise paired t-tests over common prompts, "
                "Holm-corrected): at the analysis' level (95% by default) every model's true "
                "rank lies in its set at once; the partition is read from it.",
    "run": "the store's run_index: the repetition number within the cell, counted from 0.",
}


def seg(value: Any) -> str:
    """One URL path segment (everything escaped, "/" included)."""
    return quote(str(value), safe="")


def jsonable(value: Any) -> Any:
    """Dates and datetimes (at any depth) as ISO strings."""
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def ts(value: Any) -> str:
    """A UTC instant to the second (the JSON API keeps the full precision)."""
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    return fmt(value)


def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["seg"] = seg
    env.filters["fmt"] = fmt
    env.filters["ts"] = ts
    env.globals["LEGEND"] = LEGEND
    env.globals["served_text"] = served_text
    return env
