"""Merge a partition's many small files into a few, deduplicated by key; crash-safe.

Per partition, under an exclusive ``flock`` (one compactor per partition; released by the
kernel if the process dies):

1. finish any manifest left by an earlier, interrupted compaction (see :func:`recover`);
2. read the partition's published files and drop copies (same key, or for a dataset of
   executions same key and execution id: every execution is kept);
3. write the result into a hidden scratch dir ``.compact-<date>-<hex>/`` (fsynced);
4. rename each output into the partition as ``part-<hex>.parquet`` and fsync the partition;
5. atomically write a JSON manifest ``_compaction/<date>-<hex>.json`` (inputs -> outputs);
6. delete the inputs, then the manifest.

A crash before 4 leaves only hidden files. A crash between 4 and 5 leaves outputs next to
inputs: readers deduplicate, and the next run simply merges them again. A crash after 5 is
finished by :func:`recover` (outputs present -> delete the inputs). Writers are never
blocked: files published after the listing in step 2 are not inputs and are kept.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from storage.parquet.dataset import FILENAME_COLUMN, ParquetDataset, fsync_dir
from storage.parquet.dedupe import dedupe_copies
from storage.errors import StorageError

MANIFEST_DIR = "_compaction"


@dataclass(frozen=True)
class CompactionConfig:
    """``min_files``: compact a partition only if it has at least this many files (or
    an unfinished manifest); ``max_rows_per_file``: split larger outputs; ``stale_tmp_s``:
    age after which orphaned ``.tmp`` files of killed writers are deleted; ``compression``:
    Parquet codec of the merged files (zstd: smaller; they are written once, read often)."""

    min_files: int = 2
    max_rows_per_file: int = 1_000_000
    stale_tmp_s: float = 3600.0
    compression: str = "zstd"


@dataclass(frozen=True)
class PartitionCompaction:
    """What happened to one partition."""

    partition: dt.date
    files_before: int
    files_after: int
    rows_before: int
    rows_after: int
    recovered: bool = False  # an interrupted compaction was finished
    skipped: str | None = None  # why nothing was merged


@dataclass(frozen=True)
class CompactionReport:
    """Summary over the partitions visited."""

    dataset: str
    partitions: tuple[PartitionCompaction, ...]
    tmp_files_removed: int = 0

    @property
    def files_before(self) -> int:
        return sum(p.files_before for p in self.partitions)

    @property
    def files_after(self) -> int:
        return sum(p.files_after for p in self.partitions)

    @property
    def rows_before(self) -> int:
        return sum(p.rows_before for p in self.partitions)

    @property
    def rows_after(self) -> int:
        return sum(p.rows_after for p in self.partitions)


@dataclass(frozen=True)
class CompactionManifest:
    """Record of one merge: ``inputs`` are replaced by ``outputs`` (file names in partition)."""

    dataset: str
    partition: dt.date
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    rows_before: int
    rows_after: int
    path: Path

    def to_json(self) -> str:
        return json.dumps(
            {
                "dataset": self.dataset,
                "partition": self.partition.isoformat(),
                "inputs": list(self.inputs),
                "outputs": list(self.outputs),
                "rows_before": self.rows_before,
                "rows_after": self.rows_after,
            },
            indent=1,
        )

    @classmethod
    def load(cls, path: Path) -> CompactionManifest:
        try:
            data = json.loads(path.read_text())
            return cls(
                dataset=data["dataset"],
                partition=dt.date.fromisoformat(data["partition"]),
                inputs=tuple(data["inputs"]),
                outputs=tuple(data["outputs"]),
                rows_before=int(data["rows_before"]),
                rows_after=int(data["rows_after"]),
                path=path,
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StorageError(
                f"compaction manifest {path} is unreadable ({exc}); it is written atomically, so "
                "it was edited by hand: delete it (no data is lost, readers deduplicate)"
            ) from exc


def _manifest_dir(dataset: ParquetDataset) -> Path:
    return dataset.path / MANIFEST_DIR


@contextmanager
def partition_lock(dataset: ParquetDataset, day: dt.date) -> Iterator[bool]:
    """Yield True if this process holds the partition's compaction lock, False if busy."""
    mdir = _manifest_dir(dataset)
    mdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(mdir / f"{day.isoformat()}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing releases the flock


def _manifests_for(dataset: ParquetDataset, day: dt.date) -> list[Path]:
    mdir = _manifest_dir(dataset)
    if not mdir.is_dir():
        return []
    prefix = f"{day.isoformat()}-"
    return sorted(p for p in mdir.iterdir() if p.name.startswith(prefix) and p.suffix == ".json")


def recover(dataset: ParquetDataset, day: dt.date) -> bool:
    """Finish interrupted compactions of ``day`` (caller holds the lock). True if any.

    Outputs all present: delete the leftover inputs. Outputs missing (removed by hand):
    keep the inputs, they are the data. Either way drop the manifest and scratch dirs.
    """
    found = False
    for path in _manifests_for(dataset, day):
        found = True
        finish(dataset, CompactionManifest.load(path))
    for scratch in dataset.path.glob(f".compact-{day.isoformat()}-*"):
        shutil.rmtree(scratch, ignore_errors=True)
    return found


def finish(dataset: ParquetDataset, manifest: CompactionManifest) -> None:
    """Step 6: delete the inputs named by ``manifest`` (if its outputs exist), then it."""
    pdir = dataset.partition_dir(manifest.partition)
    if all((pdir / o).is_file() for o in manifest.outputs):
        for name in manifest.inputs:
            if name in manifest.outputs:
                continue
            try:
                (pdir / name).unlink()
            except FileNotFoundError:
                pass
        if dataset.fsync:
            fsync_dir(pdir)
    manifest.path.unlink(missing_ok=True)


def write_outputs(
    dataset: ParquetDataset, day: dt.date, config: CompactionConfig = CompactionConfig()
) -> CompactionManifest | None:
    """Steps 2-5 for ``day`` (caller holds the lock): merged outputs + manifest, inputs kept.

    Returns the manifest to pass to :func:`finish`, or None if there was nothing to read.
    """
    inputs = dataset.partition_files(day)
    if not inputs:
        return None
    raw = dataset.read_files(inputs, dedupe=False, with_filename=True)
    spec = dataset.spec
    # copies of one row collapse; a dataset of executions keeps every execution
    merged = dedupe_copies(raw, spec, FILENAME_COLUMN)  # sorted by key
    merged = merged.drop_columns([FILENAME_COLUMN, spec.partition_col])
    merged = merged.replace_schema_metadata(spec.schema.metadata)
    scratch = dataset.path / f".compact-{day.isoformat()}-{uuid.uuid4().hex}"
    scratch.mkdir(parents=True)
    pdir = dataset.partition_dir(day)
    outputs: list[str] = []
    try:
        step = max(1, config.max_rows_per_file)
        for start in range(0, merged.num_rows, step):
            name = f"part-{uuid.uuid4().hex}.parquet"
            dataset.write_file(merged.slice(start, step), scratch / name, config.compression)
            outputs.append(name)
        for name in outputs:
            os.rename(scratch / name, pdir / name)
        if dataset.fsync:
            fsync_dir(pdir)
    except OSError as exc:
        raise StorageError(f"compaction of {pdir} failed writing outputs: {exc}") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    mdir = _manifest_dir(dataset)
    mpath = mdir / f"{day.isoformat()}-{uuid.uuid4().hex}.json"
    manifest = CompactionManifest(
        dataset=dataset.spec.name,
        partition=day,
        inputs=tuple(p.name for p in inputs),
        outputs=tuple(outputs),
        rows_before=raw.num_rows,
        rows_after=merged.num_rows,
        path=mpath,
    )
    tmp = mdir / f".{mpath.name}.tmp"
    with open(tmp, "w") as fh:
        fh.write(manifest.to_json())
        fh.flush()
        if dataset.fsync:
            os.fsync(fh.fileno())
    os.replace(tmp, mpath)
    if dataset.fsync:
        fsync_dir(mdir)
    return manifest


def compact_partition(
    dataset: ParquetDataset, day: dt.date, config: CompactionConfig = CompactionConfig()
) -> PartitionCompaction:
    """Recover, then merge ``day``'s files if there are at least ``config.min_files``."""
    with partition_lock(dataset, day) as held:
        if not held:
            n = len(dataset.partition_files(day))
            return PartitionCompaction(day, n, n, 0, 0, skipped="another compactor holds the lock")
        recovered = recover(dataset, day)
        files = dataset.partition_files(day)
        if len(files) < config.min_files:
            return PartitionCompaction(
                day, len(files), len(files), 0, 0, recovered=recovered,
                skipped=f"fewer than {config.min_files} files",
            )
        manifest = write_outputs(dataset, day, config)
        if manifest is None:
            return PartitionCompaction(day, 0, 0, 0, 0, recovered=recovered, skipped="empty")
        finish(dataset, manifest)
        after = len(dataset.partition_files(day))
        return PartitionCompaction(
            day, len(files), after, manifest.rows_before, manifest.rows_after, recovered=recovered
        )


def compact(
    dataset: ParquetDataset,
    day: dt.date | None = None,
    config: CompactionConfig = CompactionConfig(),
) -> CompactionReport:
    """Compact one partition (``day``) or every partition (``None``) of ``dataset``."""
    days = [day] if day is not None else dataset.partitions()
    removed = dataset.remove_stale_tmp(config.stale_tmp_s)
    results = tuple(compact_partition(dataset, d, config) for d in days)
    return CompactionReport(dataset.spec.name, results, removed)
