"""A rich progress display with one bar per model, fed by executor callbacks.

It writes to stderr (stdout is for results). Each bar shows ``done/total done``, then every count
with its label — ``ok``, ``failed``, ``cancelled`` (cancelled runs never reached the endpoint, so
they are not failures of the model) — runs in flight, the model's own completion rate (runs/s over rich's recent-samples
window, the final average once the model is done) and its ETA from that rate.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from orchestrator.local.executor import ModelProgress


class _RateColumn(ProgressColumn):
    """This model's runs/s: the recent-window rate while running, the final one when finished."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("    – runs/s" if speed is None else f"{speed:6.1f} runs/s")


def stderr_console() -> Console:
    return Console(stderr=True, width=None if sys.stderr.isatty() else 150)


class ModelBars:
    """Context manager; ``update(model, state)`` is the executor's ``on_progress`` callback.

    ``console`` defaults to a stderr console; ``get_time`` (monotonic seconds) is rich's clock.
    """

    def __init__(
        self, console: Console | None = None, enabled: bool = True, get_time: Callable[[], float] | None = None
    ) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.fields[model]:<22}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("done  ok {task.fields[ok]:>3}  failed {task.fields[failed]:>3}  "
                       "cancelled {task.fields[cancelled]:>3}  in flight {task.fields[in_flight]:>2}"),
            _RateColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TimeElapsedColumn(),
            console=console or stderr_console(),
            disable=not enabled,
            transient=False,
            get_time=get_time,
        )
        self._tasks: dict[str, TaskID] = {}

    def update(self, model: str, state: ModelProgress) -> None:
        ok = max(state.done - state.failed - state.cancelled, 0)
        if model not in self._tasks:
            self._tasks[model] = self._progress.add_task(
                model, total=state.total, model=model,
                ok=ok, failed=state.failed, cancelled=state.cancelled, in_flight=state.in_flight,
            )
        self._progress.update(
            self._tasks[model], completed=state.done, total=state.total,
            ok=ok, failed=state.failed, cancelled=state.cancelled, in_flight=state.in_flight,
        )

    def __enter__(self) -> ModelBars:
        self._progress.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.__exit__(exc_type, exc, tb)
