"""An incremental view of one campaign's runs in the store: each look reads only new files.

The distributed orchestrator verifies completion against the store (the source of truth), but a
full scan costs ~2 ms per file and grows with the store. ``StoreCursor.refresh`` lists the data
files (a directory listing, no Parquet reads) and reads a few columns of the files it has not
seen; a file a compaction deleted has its rows in the compacted output, which is new and read
once. So a look costs O(files published since the last look).

Given ``locate`` (a plan's row -> plan index, ``plan_view.PlanView.locate``), the cursor reads the
columns that place a row on the plan's axes and keeps, instead of them, its index
(``plan_index``); a row of no planned run (another wave's) is left out, and no run id is held
beside the rows. Without it, ``run_ids`` holds the run ids seen.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from storage.runs import RunStore, latest_executions

COLUMNS = ["run_id", "model", "outcome", "measured_at", "execution_id", "finished_at"]
#: what ``locate`` reads beside ``COLUMNS`` (``orchestrator.campaign.plan.LOCATE_COLUMNS``)
AXES_COLUMNS = ["prompt_sha256", "budget_max_tokens", "run_index"]
PLAN_INDEX = "plan_index"


class StoreCursor:
    """Runs of ``campaign`` published in ``store`` so far (every execution seen, once).
    ``follow``: called before each look (a bucket store's mirror fetching the new uploads);
    ``locate``: rows -> plan indices (the rows then carry ``plan_index``)."""

    def __init__(self, store: RunStore, campaign: str, follow: Callable[[], object] | None = None,
                 locate: Callable[[pa.Table], np.ndarray] | None = None) -> None:
        self.store = store
        self._follow = follow
        self._locate = locate
        self.campaign = campaign
        self._seen: set[Path] = set()
        self._tables: list[pa.Table] = []
        self._keep_rows = True
        self.run_ids: set[str] = set()  # without ``locate`` only
        self.files_read = 0
        self.rows_read = 0

    def refresh(self) -> pa.Table | None:
        """Read the files published since the last call; returns their rows of the campaign
        (``COLUMNS``, and ``plan_index`` given ``locate``), None when there is no new file."""
        dataset = self.store.dataset
        if self._follow is not None:
            self._follow()
        columns = COLUMNS + AXES_COLUMNS if self._locate is not None else COLUMNS
        for _ in range(dataset.read_retries + 1):
            new = [f for f in dataset.data_files() if f not in self._seen]
            if not new:
                return None
            try:
                table = dataset.read_files(new, columns=columns, dedupe=False, filters={"campaign": self.campaign})
            except FileNotFoundError:  # compacted away between listing and reading: list again
                continue
            if self._locate is not None:
                found = self._locate(table)
                keep = np.flatnonzero(found >= 0)
                table = table.select(COLUMNS).take(pa.array(keep)).append_column(PLAN_INDEX, pa.array(found[keep]))
            else:
                self.run_ids.update(table.column("run_id").to_pylist())
            self._seen.update(new)
            self.files_read += len(new)
            if self._keep_rows:
                self._tables.append(table)
            self.rows_read += table.num_rows
            return table
        return None

    def latest(self) -> pa.Table:
        """One row per stored run (``storage.runs.EXECUTION_RULE``): run_id, model, outcome,
        execution_id (and ``plan_index`` given ``locate``); sorted by run_id only when some run
        has several rows."""
        cols = ["run_id", "model", "outcome", "execution_id"] + ([PLAN_INDEX] if self._locate is not None else [])
        if not self._tables:
            return pa.table({c: pa.array([], pa.int64() if c == PLAN_INDEX else pa.string()) for c in cols})
        table = pa.concat_tables(self._tables).select(cols + ["measured_at", "finished_at"])
        if self._one_row_per_run():
            # one row per run (the usual case): nothing to pick. The sort in latest_executions
            # took 2-5 s on 100k runs, at the end of a campaign, on a loaded 2-core machine.
            return table.select(cols)
        return latest_executions(table).select(cols)

    def forget_rows(self) -> None:
        """Drop the rows read so far and keep none from now on (``latest`` is then empty): for a
        caller that keeps what it needs of each look's rows itself."""
        self._tables.clear()
        self._keep_rows = False

    def _one_row_per_run(self) -> bool:
        if self._locate is None:
            return self.rows_read == len(self.run_ids)
        index = np.concatenate([t.column(PLAN_INDEX).to_numpy() for t in self._tables])
        return bool(np.unique(index).size == index.size)
