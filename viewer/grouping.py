"""Runs of one page grouped by a column, so a page can show them side by side per group.

Input: run rows (dicts, in page order) and a column name, or None for one group of every run.
Output: :class:`RunGroup` values in order of the key's first appearance; each keeps its runs in
page order. A page renders a heading per group only when the rows are grouped (``key`` set).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RunGroup:
    """``column`` (None: not grouped), the group's ``value`` and its ``runs`` in page order."""

    column: str | None
    value: Any
    runs: list[dict[str, Any]]

    @property
    def label(self) -> str:
        """What a heading says: "" when not grouped, else ``column value``."""
        return "" if self.column is None else f"{self.column} {self.value}"


def group_runs(runs: list[dict[str, Any]], column: str | None = None) -> list[RunGroup]:
    """``runs`` by the value of ``column`` (one group of all of them when None)."""
    if column is None:
        return [RunGroup(None, None, list(runs))]
    groups: dict[Any, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(run.get(column), []).append(run)
    return [RunGroup(column, value, members) for value, members in groups.items()]
