"""Progress of a long analysis step, as events a front end may show (or ignore).

The pipeline and the report builder call a :data:`Reporter` with a :class:`Stage` when a stage
starts; ``count``/``unit`` say what it works on (e.g. 20,000 runs, 100 models, 10,000
replicates). ``index``/``total`` place it among the stages of its panel. The default reporter,
:func:`silent`, does nothing; the CLI passes a terminal one only when stdout is a terminal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ANALYZE_STAGES", "REPORT_STAGES", "Reporter", "Stage", "silent"]

# the per-panel stages of ``irbench analyze``, in order
ANALYZE_STAGES = ("cells", "merge", "intervals", "pairs", "run level", "sensitivity",
                  "write", "timeouts")
REPORT_STAGES = ("load", "document", "render")


@dataclass(frozen=True)
class Stage:
    """One stage starting: ``name`` (one of the stage tuples above, or "read"), the panel it
    belongs to (None for whole-store stages), ``index`` (1-based) of ``total`` stages of that
    panel, and what it works on: ``count`` items of ``unit``."""

    name: str
    panel: str | None = None
    index: int = 0
    total: int = 0
    count: int | None = None
    unit: str = ""


Reporter = Callable[[Stage], None]


def silent(stage: Stage) -> None:
    """Ignore every stage."""
