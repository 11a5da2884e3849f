"""What the store says about a lazy plan, kept as plan indices: which runs are stored, the latest
outcome of each, which are still to run, and those runs as per-model streams of ``RunTask``.

Every reader here scans the projected columns of the campaign's rows once and maps each row to
its plan index (``LazyPlan.locate``); nothing holds the plan's run ids. A selection of runs to
execute is a ``RunBitmap`` over the plan, enumerated model by model in windows of
``window_runs`` positions, so a 10**8-run plan costs its bitmap, not its tasks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from orchestrator.campaign.plan import LOCATE_COLUMNS, LazyPlan
from orchestrator.campaign.run_bitmap import RunBitmap
from storage.outcomes import CLOSES_MODEL
from storage.parquet.unreadable import RowSelection, read_checked
from storage.records import Outcome
from storage.runs import RunStore
from workers.runtask import RunTask

WINDOW_RUNS = 4096  # plan positions per model read from the bitmap at a time
STORED_FILES_PER_READ = 64  # data files per read of the resume scan


def stored_rows(plan: LazyPlan, store: RunStore, files_per_read: int = STORED_FILES_PER_READ) -> tuple[RunBitmap, int]:
    """(the runs of ``plan`` with at least one stored execution, any outcome; the rows of its
    campaign read, of any wave or plan). Read ``files_per_read`` files at a time: no dedupe is
    needed for a bit per run, so the scan's memory is one group's columns, whatever the store."""
    bitmap, rows = RunBitmap(len(plan)), 0
    columns, filters = list(LOCATE_COLUMNS), {"campaign": [plan.campaign]}
    files = store.dataset.data_files()
    try:
        for start in range(0, len(files), files_per_read):
            table = store.dataset.read_files(files[start:start + files_per_read], dedupe=False, columns=columns,
                                             filters=filters)
            found = plan.locate(table)
            bitmap.add(found[found >= 0])
            rows += table.num_rows
    except FileNotFoundError:  # a compaction replaced files listed above: one read that re-lists
        table = store.dataset.read(filters=filters, columns=columns, dedupe=False)
        found = plan.locate(table)
        return RunBitmap.of(len(plan), found[found >= 0]), table.num_rows
    return bitmap, rows


def stored_bitmap(plan: LazyPlan, store: RunStore) -> RunBitmap:
    """The runs of ``plan`` with at least one stored execution (any outcome)."""
    return stored_rows(plan, store)[0]


def stored_count(tasks: Sequence[RunTask], store: RunStore) -> int:
    """Planned runs with a stored execution: from the bitmap of a ``LazyPlan``, from the run ids
    of a hand-made task list."""
    if isinstance(tasks, LazyPlan):
        return stored_bitmap(tasks, store).count()
    if not tasks:
        return 0
    return len(store.completed_run_ids(tasks[0].campaign) & {t.run_id for t in tasks})


@dataclass(frozen=True)
class LatestRuns:
    """The latest stored execution (``storage.runs.EXECUTION_RULE``) of each stored run of a plan:
    its plan index (ascending) and outcome, plus the columns asked for beside them."""

    indices: np.ndarray  # int64
    outcomes: np.ndarray  # str objects, one per index
    skipped_files: tuple[Path, ...] = ()

    def by_outcome(self) -> dict[str, int]:
        if not self.outcomes.size:
            return {}
        values, counts = np.unique(self.outcomes, return_counts=True)
        return {str(v): int(c) for v, c in zip(values.tolist(), counts.tolist())}


def latest_runs(plan: LazyPlan, store: RunStore, *, skip_corrupt: bool = False) -> LatestRuns:
    """One read of the campaign's rows (``skip_corrupt``: unreadable files left out)."""
    selection = RowSelection(filters={"campaign": [plan.campaign]}, columns=[*LOCATE_COLUMNS, "outcome"])
    table, skipped = read_checked(store.dataset, skip=skip_corrupt, selection=selection)
    found = plan.locate(table)
    keep = np.flatnonzero(found >= 0)
    outcomes = np.asarray(table.column("outcome").to_pylist(), dtype=object)[keep] if keep.size else np.zeros(0, object)
    order = np.argsort(found[keep], kind="stable")
    return LatestRuns(found[keep][order], outcomes[order], tuple(skipped))


class ModelPositions(Protocol):
    """A plan that says which model (spec position) each plan index is of (``LazyPlan`` does)."""

    def model_positions(self, indices: np.ndarray) -> np.ndarray: ...


def retryable_mask(plan: ModelPositions, latest: LatestRuns, outcomes: frozenset[Outcome]) -> np.ndarray:
    """Which of ``latest``'s runs ended in ``outcomes``; a ``cancelled`` run of a model that
    another run shows closed (``CLOSES_MODEL``, a class not in ``outcomes``) is left out: retrying
    it would meet the same wall (``orchestrator.campaign.retry.retryable_tasks``, on indices)."""
    if latest.indices.size == 0:
        return np.zeros(0, dtype=bool)
    wanted = np.isin(latest.outcomes, [o.value for o in outcomes])
    walls = np.isin(latest.outcomes, [o.value for o in CLOSES_MODEL - outcomes])
    models = plan.model_positions(latest.indices)
    closed = np.isin(models, np.unique(models[walls]))
    cancelled_closed = (latest.outcomes == Outcome.CANCELLED.value) & closed
    return np.asarray(wanted & ~cancelled_closed, dtype=bool)


def retryable_bitmap(plan: LazyPlan, latest: LatestRuns, outcomes: frozenset[Outcome]) -> RunBitmap:
    """The runs of :func:`retryable_mask`, as a bitmap over the plan."""
    return RunBitmap.of(len(plan), latest.indices[retryable_mask(plan, latest, outcomes)])


class PlanSelection:
    """The runs of ``plan`` set in ``bits``, as one lazy ``RunTask`` stream per model (each in
    planned order); the local executor drains them without holding them."""

    def __init__(self, plan: LazyPlan, bits: RunBitmap, window_runs: int = WINDOW_RUNS) -> None:
        if bits.size != len(plan):
            raise ValueError(f"a selection of {bits.size} bits over a plan of {len(plan)} runs")
        self.plan, self.bits, self._window = plan, bits, max(window_runs, 1)
        self._counts = self._per_model_counts()

    @classmethod
    def pending(cls, plan: LazyPlan, done: RunBitmap, again: RunBitmap | None = None) -> PlanSelection:
        """The runs not in ``done``, and those in ``again`` (``--retry-failed``)."""
        todo = RunBitmap.full(len(plan)).difference(done)
        return cls(plan, todo.union(again) if again is not None else todo)

    def _per_model_counts(self) -> dict[str, int]:
        m = len(self.plan.models)
        totals = np.zeros(m, dtype=np.int64)
        step = m * self._window * 16
        for start in range(0, len(self.plan), step):
            totals += self.bits.mask(start, start + step).reshape(-1, m).sum(axis=0)
        return {name: int(n) for name, n in zip(self.plan.models, totals.tolist())}

    def __len__(self) -> int:
        return sum(self._counts.values())

    def counts(self) -> dict[str, int]:
        """Selected runs per model (spec order; models with none included)."""
        return dict(self._counts)

    def indices_of(self, model: str) -> Iterator[int]:
        """The selected plan indices of ``model``, ascending, read a window at a time."""
        m_count, m = len(self.plan.models), self.plan.models.index(model)
        for j0 in range(0, self.plan.per_model, self._window):
            j1 = min(j0 + self._window, self.plan.per_model)
            window = self.bits.mask(j0 * m_count, j1 * m_count).reshape(-1, m_count)[:, m]
            for j in np.flatnonzero(window).tolist():
                yield (j0 + j) * m_count + m

    def tasks_of(self, model: str) -> Iterator[RunTask]:
        return (self.plan.task(i) for i in self.indices_of(model))

    def __iter__(self) -> Iterator[RunTask]:
        """Every selected task in planned order, a window at a time."""
        step = len(self.plan.models) * self._window
        for start in range(0, len(self.plan), step):
            for i in np.flatnonzero(self.bits.mask(start, start + step)).tolist():
                yield self.plan.task(start + i)
