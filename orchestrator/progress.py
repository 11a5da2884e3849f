"""A rich progress display with one bar per model, fed by executor callbacks."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from orchestrator.local import ModelProgress


class ModelBars:
    """Context manager; ``update(model, state)`` is the executor's ``on_progress`` callback."""

    def __init__(self, console: Console | None = None, enabled: bool = True) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.fields[model]:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("failed {task.fields[failed]:>3}  in flight {task.fields[in_flight]:>2}  {task.fields[rate]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
            transient=False,
        )
        self._tasks: dict[str, TaskID] = {}
        self._started = time.monotonic()

    def update(self, model: str, state: ModelProgress) -> None:
        elapsed = max(time.monotonic() - self._started, 1e-6)
        fields = dict(failed=state.failed, in_flight=state.in_flight, rate=f"{state.done / elapsed:6.1f} runs/s")
        if model not in self._tasks:
            self._tasks[model] = self._progress.add_task(model, total=state.total, model=model, **fields)
        self._progress.update(self._tasks[model], completed=state.done, **fields)

    def __enter__(self) -> ModelBars:
        self._progress.__enter__()
        self._started = time.monotonic()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.__exit__(exc_type, exc, tb)
