"""The plan of one distributed campaign by plan index, and the run ids this orchestrator has out.

A prepared campaign's plan is a ``LazyPlan`` (index arithmetic over its axes): the orchestrator
holds no task and no run id for it. What Redis and the workers say comes back as run ids, so the
view keeps ``inflight``, run_id -> plan index of the runs this orchestrator sent (or found queued
or running at its start) that it has not yet seen done: at most what the broker, the workers and
the delayed set hold, never the plan. A stored row maps back to its index by its axes
(``LazyPlan.locate``). A hand-made list of tasks (tests) is a plan too: its ids are a dict.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from orchestrator.campaign.plan import LazyPlan, planned_models
from workers.runtask import RunTask

if TYPE_CHECKING:
    import pyarrow as pa


class PlanView:
    """``tasks`` (a ``LazyPlan``, or any list of tasks) read by index: ``len``, :meth:`task`,
    :meth:`run_id`, :meth:`model_positions`, :meth:`locate`; ``inflight`` maps the run ids of
    runs out to their index (:meth:`out`, :meth:`index_of`, :meth:`settled`)."""

    def __init__(self, tasks: Sequence[RunTask]) -> None:
        self.tasks = tasks
        self._lazy = tasks if isinstance(tasks, LazyPlan) else None
        self._ids: dict[str, int] = {}
        self._model_codes = np.zeros(0, dtype=np.int64)
        if self._lazy is not None:
            self.models: tuple[str, ...] = self._lazy.models
        else:
            self.models = tuple(dict.fromkeys(t.model for t in tasks))
            position = {m: k for k, m in enumerate(self.models)}
            self._ids = {t.run_id: i for i, t in enumerate(tasks)}
            self._model_codes = np.array([position[t.model] for t in tasks], dtype=np.int64)
        self.inflight: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.tasks)

    def task(self, i: int) -> RunTask:
        return self.tasks[i]

    def run_id(self, i: int) -> str:
        return self._lazy.run_id(i) if self._lazy is not None else self.tasks[i].run_id

    def planned(self) -> dict[str, int]:
        """model -> runs planned (from the axes of a ``LazyPlan``)."""
        return planned_models(self.tasks)

    def allowed_calls(self) -> int | None:
        """Calls the planned models allow at once: the sum of their ``max_concurrency`` (None
        when a model sets none, or the plan is empty)."""
        if self._lazy is not None:
            limits = self._lazy.model_limits() if len(self._lazy) else {}
        else:
            limits = {}
            for t in self.tasks:
                limits.setdefault(t.model, t.limits)
        caps = [m.max_concurrency for m in limits.values()]
        if not caps or any(c is None for c in caps):
            return None
        return sum(c for c in caps if c is not None)

    def spend_capped(self) -> bool:
        """Whether a spend cap covers any planned run."""
        if self._lazy is not None:
            return self._lazy.spend_capped()
        return any(t.spend_capped for t in self.tasks)

    def model_positions(self, indices: np.ndarray) -> np.ndarray:
        """The model (position in ``models``) of each plan index (int64)."""
        idx = np.asarray(indices, dtype=np.int64)
        if self._lazy is not None:
            return self._lazy.model_positions(idx)
        return self._model_codes[idx]

    def locate(self, table: pa.Table) -> np.ndarray:
        """The plan index of each row of ``table`` (``LOCATE_COLUMNS``), -1 for a row that is not
        a run of this plan (int64)."""
        if self._lazy is not None:
            return self._lazy.locate(table)
        ids = table.column("run_id").to_pylist()
        return np.fromiter((self._ids.get(r, -1) for r in ids), dtype=np.int64, count=len(ids))

    def out(self, indices: Iterable[int]) -> list[RunTask]:
        """The tasks of ``indices``, each noted in ``inflight`` (about to be sent)."""
        tasks = []
        for i in indices:
            task = self.task(int(i))
            self.inflight[task.run_id] = int(i)
            tasks.append(task)
        return tasks

    def index_of(self, run_id: str) -> int | None:
        """The plan index of a run this orchestrator has out (None: not one of them)."""
        return self.inflight.get(run_id)

    def settled(self, run_id: str) -> int | None:
        """Forget ``run_id`` (seen done or stored); its plan index if it was out."""
        return self.inflight.pop(run_id, None)
