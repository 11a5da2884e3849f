"""A terminal display of ``irbench analyze`` / ``report`` stages (analysis.progress events).

One line per panel (and one for reading the store): a bar over the panel's stages, the stage
now running and what it works on ("intervals: 10,000 replicates"), the time elapsed. Disabled
— prints nothing at all — when the console is not a terminal (pipes, CI logs, files).
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from analysis.progress import Stage

_STORE = "data"


class StageProgress:
    """Context manager; pass its :meth:`report` as the ``progress`` reporter."""

    def __init__(self, console: Console, *, title: str = "analyze") -> None:
        self.enabled = console.is_terminal
        self._title = title
        self._progress = Progress(
            TextColumn("[bold]{task.description:<24}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[what]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not self.enabled,
        )
        self._tasks: dict[str, TaskID] = {}

    def report(self, stage: Stage) -> None:
        """Show ``stage`` as started (the ones before it in its panel as done)."""
        key = stage.panel if stage.panel is not None else _STORE
        what = stage.name if stage.count is None else (
            f"{stage.name}: {stage.count:,} {stage.unit}".rstrip())
        if stage.panel is None and stage.count is None and stage.unit:
            what = f"{stage.name} {stage.unit}"
        if key not in self._tasks:
            for other in self._tasks.values():  # a new line starts: the earlier ones are done
                self._finish(other)
            label = f"{self._title} {key}" if stage.panel is not None else self._title
            self._tasks[key] = self._progress.add_task(label, total=stage.total or 1, what=what)
        self._progress.update(self._tasks[key], completed=max(0, stage.index - 1), what=what)
        # draw now rather than at the next 10 Hz tick: stages are few, and a short stage would
        # otherwise never be shown at all
        self._progress.refresh()

    def _finish(self, task: TaskID) -> None:
        t = self._progress.tasks[self._progress.task_ids.index(task)]
        if t.total is not None and t.completed < t.total:
            self._progress.update(task, completed=t.total, what="done")

    def __enter__(self) -> StageProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            for task in self._tasks.values():
                self._finish(task)
        self._progress.__exit__(exc_type, exc, tb)
