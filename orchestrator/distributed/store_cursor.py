"""An incremental view of one campaign's runs in the store: each look reads only new files.

The distributed orchestrator verifies completion against the store (the source of truth), but a
full scan costs ~2 ms per file and grows with the store. ``StoreCursor.refresh`` lists the data
files (a directory listing, no Parquet reads) and reads a few columns of the files it has not
seen; a file a compaction deleted has its rows in the compacted output, which is new and read
once. So a look costs O(files published since the last look).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from storage.runs import RunStore, latest_executions

COLUMNS = ["run_id", "model", "outcome", "measured_at", "execution_id", "finished_at"]


class StoreCursor:
    """Runs of ``campaign`` published in ``store`` so far (every execution seen, once).
    ``follow``: called before each look (a bucket store's mirror fetching the new uploads)."""

    def __init__(self, store: RunStore, campaign: str, follow: Callable[[], object] | None = None) -> None:
        self.store = store
        self._follow = follow
        self.campaign = campaign
        self._seen: set[Path] = set()
        self._tables: list[pa.Table] = []
        self.run_ids: set[str] = set()
        self.executions: dict[str, set[str | None]] = {}  # run_id -> execution ids seen
        self.files_read = 0
        self.rows_read = 0

    def refresh(self) -> set[str]:
        """Read the files published since the last call; returns the run_ids they hold."""
        dataset = self.store.dataset
        if self._follow is not None:
            self._follow()
        for _ in range(dataset.read_retries + 1):
            new = [f for f in dataset.data_files() if f not in self._seen]
            if not new:
                return set()
            try:
                table = dataset.read_files(new, columns=COLUMNS, dedupe=False, filters={"campaign": self.campaign})
            except FileNotFoundError:  # compacted away between listing and reading: list again
                continue
            self._seen.update(new)
            self.files_read += len(new)
            self._tables.append(table)
            self.rows_read += table.num_rows
            rids, eids = table.column("run_id").to_pylist(), table.column("execution_id").to_pylist()
            for rid, eid in zip(rids, eids):
                self.executions.setdefault(rid, set()).add(eid)
            ids = set(rids) - self.run_ids
            self.run_ids |= ids
            return set(rids)
        return set()

    def latest(self) -> pa.Table:
        """One row per stored run (``storage.runs.EXECUTION_RULE``): run_id, model, outcome,
        execution_id; sorted by run_id only when some run has several rows."""
        cols = ["run_id", "model", "outcome", "execution_id"]
        if not self._tables:
            return pa.table({c: pa.array([], pa.string()) for c in cols})
        table = pa.concat_tables(self._tables).select(cols + ["measured_at", "finished_at"])
        if self.rows_read == len(self.run_ids):
            # one row per run (the usual case): nothing to pick. The sort in latest_executions
            # took 2-5 s on 100k runs, at the end of a campaign, on a loaded 2-core machine.
            return table.select(cols)
        return latest_executions(table).select(cols)
