"""What the provider said it served, per model, in two waves (:func:`served_columns`), and the
text the report and the CLI show for it (:func:`served_text`).

A served-identity column (``served_model``, ``system_fingerprint``, ``served_digest``) is compared
only when both waves hold values of it: rows without one (written before the column existed, or
from a provider that names nothing, or a failed call) are no evidence of a change. The values come
from the endpoint, so each is at most ``SERVED_IDENTITY_MAX_CHARS`` as stored, and at most
:data:`SERVED_VALUES_KEPT` distinct values per wave are kept for display (an endpoint naming a
new version on every answer must not grow the comparison with the number of runs it answered).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = ["SERVED_VALUES_KEPT", "ServedColumn", "served_columns", "served_changed", "served_text"]

SERVED_VALUES_KEPT = 3


@dataclass(frozen=True)
class ServedColumn:
    """One served-identity column of one model: its distinct non-null values in each wave (sorted,
    the first :data:`SERVED_VALUES_KEPT`) and how many there were. ``changed``: both waves hold
    values and their sets differ; None when a wave holds none (nothing to compare)."""

    column: str
    from_values: tuple[str, ...]
    to_values: tuple[str, ...]
    from_distinct: int
    to_distinct: int
    changed: bool | None

    def to_json(self) -> dict[str, object]:
        return {"column": self.column, "from": list(self.from_values), "to": list(self.to_values),
                "from_distinct": self.from_distinct, "to_distinct": self.to_distinct,
                "changed": self.changed}


def served_columns(served: dict[str, list[object]], idx: Iterable[int], wave_of: Sequence[int] | np.ndarray,
                   waves: tuple[int, int]) -> tuple[ServedColumn, ...]:
    """The columns of ``served`` (column -> one value per row) holding a value in either wave,
    over rows ``idx``; ``wave_of`` gives each row's wave."""
    rows = list(idx)
    out = []
    for column, values in served.items():
        seen = [{str(values[i]) for i in rows if wave_of[i] == w and values[i] is not None} for w in waves]
        if not seen[0] and not seen[1]:
            continue
        changed = seen[0] != seen[1] if seen[0] and seen[1] else None
        out.append(ServedColumn(column, tuple(sorted(seen[0])[:SERVED_VALUES_KEPT]),
                                tuple(sorted(seen[1])[:SERVED_VALUES_KEPT]), len(seen[0]),
                                len(seen[1]), changed))
    return tuple(out)


def served_changed(columns: Sequence[ServedColumn]) -> bool | None:
    """Any comparable column changed; None when no column holds values in both waves."""
    verdicts = [c.changed for c in columns if c.changed is not None]
    return any(verdicts) if verdicts else None


def _values(values: tuple[str, ...], distinct: int) -> str:
    shown = ", ".join(values) or "—"
    return shown + (f" (+{distinct - len(values)} more)" if distinct > len(values) else "")


def served_text(columns: Sequence[ServedColumn]) -> str:
    """``served_digest: X → Y`` for each changed column (``; ``-joined), else ``same`` or
    ``unknown`` (no column with values in both waves)."""
    changed = [c for c in columns if c.changed]
    if changed:
        return "; ".join(f"{c.column}: {_values(c.from_values, c.from_distinct)} → "
                         f"{_values(c.to_values, c.to_distinct)}" for c in changed)
    return {None: "unknown", False: "same", True: "changed"}[served_changed(columns)]
