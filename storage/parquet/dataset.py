"""A generic date-partitioned, append-only Parquet dataset with atomic, idempotent writes.

Layout (hive partitioning; the partition column lives in the directory name, not the file)::

    ROOT/<name>/<partition_col>=YYYY-MM-DD/<stem>.parquet     published data files
    ROOT/<name>/<partition_col>=YYYY-MM-DD/.<stem>.<hex>.tmp  in-flight writes (ignored)
    ROOT/<name>/_compaction/                                  manifests and locks (ignored)
    ROOT/<name>/.compact-<date>-<hex>/                        compaction scratch (ignored)

Writers never expose a partial file: each file is written under a dot-name, fsynced, then
published with ``os.link`` (first writer wins: a second writer of the same stem is a no-op)
or ``os.replace`` (last writer wins), and the directory is fsynced. Parquet has no
transactions (apache/arrow#11781) and appends are not idempotent (apache/arrow#3605), so
readers deduplicate by the key column.
"""

from __future__ import annotations

import datetime as dt
import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from storage.parquet.dedupe import dedupe_copies, dedupe_table, pick_latest
from storage.parquet.atomic import link_first_wins
from storage.errors import StorageError
from storage.parquet.read_checks import FILENAME_COLUMN, check_required, check_versions
from storage.parquet.scan import (
    ScanLayout, fill_null_defaults, filter_expression, parquet_format, scan_files, with_file_names,
)
from storage.parquet.spec import STEM_RE as _STEM_RE
from storage.parquet.spec import DatasetSpec
from storage.schema import schema_version_of

_HIDDEN_PREFIXES = (".", "_")


@dataclass(frozen=True)
class WriteResult:
    """Outcome of one :meth:`ParquetDataset.write` call."""

    rows_written: int
    files_written: tuple[Path, ...] = ()
    files_already_present: tuple[Path, ...] = field(default=())  # lost the first-writer race


def fsync_dir(path: Path) -> None:
    """Persist a directory entry change (create/rename/unlink) in ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_visible(name: str) -> bool:
    """True for names a reader considers (pyarrow's default ``ignore_prefixes``)."""
    return not name.startswith(_HIDDEN_PREFIXES)


class ParquetDataset:
    """One dataset under ``root/<spec.name>``.

    ``fsync`` makes published files durable across power loss (costs a few ms per write);
    ``compression`` is the Parquet codec of appended files (snappy: measured 2x faster than
    zstd to write and read for small files; compaction picks its own); ``read_retries`` re-lists files when a concurrent
    compaction deletes one between listing and reading.
    """

    def __init__(
        self,
        root: Path,
        spec: DatasetSpec,
        *,
        fsync: bool = True,
        compression: str = "snappy",
        read_retries: int = 8,
    ) -> None:
        self.root = Path(root)
        self.spec = spec
        self.path = self.root / spec.name
        self.fsync = fsync
        self.compression = compression
        self.read_retries = read_retries
        self.version = schema_version_of(spec.schema)
        pidx = spec.schema.get_field_index(spec.partition_col)
        self.file_schema = spec.schema.remove(pidx)
        partitioning = ds.partitioning(pa.schema([spec.schema.field(spec.partition_col)]), flavor="hive")
        # no pre-buffering: many small files
        self._layout = ScanLayout(spec, self.version, self.path, parquet_format(), partitioning)

    # ------------------------------------------------------------------ layout
    def partition_dir(self, day: dt.date) -> Path:
        """Directory of the partition for ``day``."""
        return self.path / f"{self.spec.partition_col}={day.isoformat()}"

    def partitions(
        self, date_from: dt.date | None = None, date_to: dt.date | None = None
    ) -> list[dt.date]:
        """Partition dates present on disk within ``[date_from, date_to]`` (inclusive), sorted."""
        prefix = f"{self.spec.partition_col}="
        if not self.path.is_dir():
            return []
        days = []
        for entry in os.scandir(self.path):
            if not entry.name.startswith(prefix) or not entry.is_dir():
                continue
            try:
                day = dt.date.fromisoformat(entry.name[len(prefix) :])
            except ValueError as exc:
                raise StorageError(
                    f"{entry.path}: not a YYYY-MM-DD partition; rename or remove the directory"
                ) from exc
            if (date_from is None or day >= date_from) and (date_to is None or day <= date_to):
                days.append(day)
        return sorted(days)

    def partition_files(self, day: dt.date) -> list[Path]:
        """Published data files of one partition, sorted by name."""
        pdir = self.partition_dir(day)
        try:
            names = [e.name for e in os.scandir(pdir) if e.is_file()]
        except FileNotFoundError:
            return []
        return [pdir / n for n in sorted(names) if is_visible(n) and n.endswith(".parquet")]

    def data_files(
        self, date_from: dt.date | None = None, date_to: dt.date | None = None
    ) -> list[Path]:
        """Published data files of the partitions in the date range (partition pruning)."""
        return [f for day in self.partitions(date_from, date_to) for f in self.partition_files(day)]

    # ------------------------------------------------------------------ writing
    def write(
        self, table: pa.Table, *, stem: str | None = None, overwrite: bool = False
    ) -> WriteResult:
        """Append ``table``: one file per partition date, published atomically.

        ``stem`` names the files (``<stem>.parquet`` in each partition; must match
        ``[A-Za-z0-9][A-Za-z0-9._-]*``); ``None`` gives ``batch-<uuid>``. With
        ``overwrite=False`` an existing file of that name wins and this write is skipped
        (idempotent redelivery); with ``True`` this write replaces it.
        Returns the rows actually published.
        """
        if stem is not None and not _STEM_RE.match(stem):
            raise StorageError(f"file stem {stem!r} is not a safe file name; hash it first")
        table = self._conform(table)
        if table.num_rows == 0:
            return WriteResult(0)
        stem = stem or f"batch-{uuid.uuid4().hex}"
        written: list[Path] = []
        present: list[Path] = []
        rows = 0
        for day, part in self._split_by_day(table):
            target = self.partition_dir(day) / f"{stem}.parquet"
            if self._publish(part.drop_columns([self.spec.partition_col]), target, overwrite):
                written.append(target)
                rows += part.num_rows
            else:
                present.append(target)
        return WriteResult(rows, tuple(written), tuple(present))

    def _conform(self, table: pa.Table) -> pa.Table:
        missing = set(self.spec.schema.names) - set(table.column_names)
        if missing:
            raise StorageError(f"dataset {self.spec.name!r}: rows lack columns {sorted(missing)}")
        try:
            return table.select(self.spec.schema.names).cast(self.spec.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise StorageError(
                f"dataset {self.spec.name!r}: rows do not match the schema "
                f"(version {self.version}): {exc}"
            ) from exc

    def _split_by_day(self, table: pa.Table) -> Iterable[tuple[dt.date, pa.Table]]:
        col = table[self.spec.partition_col]
        if col.null_count:
            raise StorageError(f"dataset {self.spec.name!r}: {self.spec.partition_col} is null")
        days = pc.unique(col).to_pylist()
        if len(days) == 1:
            yield days[0], table
            return
        for day in sorted(days):
            yield day, table.filter(pc.equal(col, pa.scalar(day, pa.date32())))

    def _ensure_dir(self, pdir: Path) -> None:
        if pdir.is_dir():
            return
        pdir.mkdir(parents=True, exist_ok=True)
        if self.fsync:  # make the new directory entries themselves durable
            fsync_dir(pdir.parent)
            fsync_dir(pdir.parent.parent)

    def write_file(self, table: pa.Table, path: Path, compression: str | None = None) -> None:
        """Write ``table`` (file schema, no partition column) to ``path`` and fsync it."""
        pq.write_table(table, path, compression=compression or self.compression)
        if self.fsync:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _publish(self, table: pa.Table, target: Path, overwrite: bool) -> bool:
        pdir = target.parent
        if not overwrite and target.exists():  # fast path for a redelivery; link re-checks
            return False
        self._ensure_dir(pdir)
        tmp = pdir / f".{target.stem}.{uuid.uuid4().hex}.tmp"
        try:
            self.write_file(table.replace_schema_metadata(self.spec.schema.metadata), tmp)
            if overwrite:
                os.replace(tmp, target)
                published = True
            else:
                published = link_first_wins(tmp, target)
            if published and self.fsync:
                fsync_dir(pdir)
        except OSError as exc:
            raise StorageError(f"cannot write {target}: {exc}; check space and permissions") from exc
        finally:
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
        return published

    def remove_stale_tmp(self, older_than_s: float = 3600.0, now_s: float | None = None) -> int:
        """Delete in-flight ``.tmp`` files left by killed writers; returns how many.

        Only files older than ``older_than_s`` (mtime) are touched, so live writers are safe.
        Looks in the dataset directory and every directory directly under it: the date
        partitions and ``_compaction/``, where a compactor killed mid-manifest leaves one.
        """
        now_s = time.time() if now_s is None else now_s
        removed = 0
        if not self.path.is_dir():
            return 0
        dirs = [self.path] + [Path(e.path) for e in os.scandir(self.path) if e.is_dir()]
        for pdir in dirs:
            for entry in os.scandir(pdir):
                if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                    try:
                        if now_s - entry.stat().st_mtime > older_than_s:
                            os.unlink(entry.path)
                            removed += 1
                    except FileNotFoundError:
                        pass
        return removed

    # ------------------------------------------------------------------ reading
    def filter_expression(
        self,
        date_from: dt.date | None = None,
        date_to: dt.date | None = None,
        filters: Mapping[str, Any] | None = None,
    ) -> ds.Expression | None:
        """Build the row filter: date range on the partition column plus ``filters``
        (:func:`storage.parquet.scan.filter_expression`)."""
        return filter_expression(self.spec, date_from, date_to, filters)

    def read(
        self,
        *,
        date_from: dt.date | None = None,
        date_to: dt.date | None = None,
        filters: Mapping[str, Any] | None = None,
        columns: Sequence[str] | None = None,
        dedupe: bool | str = True,
        sort_by_key: bool = True,
        dictionary_columns: Sequence[str] = (),
    ) -> pa.Table:
        """Rows in ``[date_from, date_to]`` matching ``filters``, one per key if ``dedupe``.

        ``columns`` projects (default: all, in schema order). Deduplicated output is sorted
        by key; the surviving row is the one with the smallest ``order_col``, ties broken by
        file name, then row position — or, for a dataset of executions, the latest execution
        (see :class:`DatasetSpec`). ``dedupe="executions"``: one row per (key, execution),
        i.e. every execution once, sorted by key. ``sort_by_key=False``: when no key repeats,
        the rows come in file order without the sorted copy (the memory peak of a large read).
        ``dictionary_columns``: string columns returned as ``dictionary<int32, string>`` (read
        so from Parquet's own dictionary pages: 4 bytes a row instead of the strings).
        """
        columns = list(columns) if columns is not None else list(self.spec.schema.names)
        unknown = [c for c in columns if c not in self.spec.schema.names]
        if unknown:
            raise StorageError(f"dataset {self.spec.name!r} has no columns {unknown}")
        expr = self.filter_expression(date_from, date_to, filters)
        for attempt in range(self.read_retries + 1):
            files = self.data_files(date_from, date_to)
            try:
                return self._read_files(files, expr, columns, dedupe, sort_by_key,
                                        tuple(dictionary_columns))
            except FileNotFoundError as exc:  # a compaction deleted an input we had listed
                # its outputs were published before the delete, so re-listing finds the rows;
                # back off so a reader is not starved by back-to-back compactions
                time.sleep(min(0.02 * 2**attempt, 0.5))
                if attempt == self.read_retries:
                    raise StorageError(
                        f"dataset {self.spec.name!r}: files vanished while reading "
                        f"{self.read_retries + 1} times ({exc}); is something deleting files "
                        f"under {self.path} other than the compactor? retry later"
                    ) from exc
        raise AssertionError("unreachable")

    def read_files(
        self,
        files: Sequence[Path],
        *,
        dedupe: bool | str = True,
        with_filename: bool = False,
        columns: Sequence[str] | None = None,
        filters: Mapping[str, Any] | None = None,
    ) -> pa.Table:
        """``columns`` (default all) of exactly ``files`` (compaction, incremental readers);
        ``with_filename`` adds the source path as column ``__filename``; ``filters`` as in
        :meth:`read`. Raises FileNotFoundError if a file vanished (a compaction)."""
        cols = list(columns) if columns is not None else list(self.spec.schema.names)
        cols += [FILENAME_COLUMN] if with_filename else []
        expr = self.filter_expression(filters=filters) if filters else None
        return self._read_files(list(files), expr, cols, dedupe)

    def _dedupe_columns(self) -> list[str]:
        spec = self.spec
        cols = [spec.key, spec.order_col, spec.execution_col, spec.finish_col]
        return [c for c in cols if c is not None]

    def _read_files(
        self, files: list[Path], expr: ds.Expression | None, columns: list[str], dedupe: bool | str,
        sort_by_key: bool = True, dictionary_columns: tuple[str, ...] = (),
    ) -> pa.Table:
        schema = self.spec.schema
        if not files:
            empty = schema.empty_table()
            if FILENAME_COLUMN in columns:
                empty = empty.append_column(FILENAME_COLUMN, pa.array([], pa.string()))
            return empty.select(columns)
        extra = [*self._dedupe_columns(), self.spec.version_col] if dedupe else [self.spec.version_col]
        wanted = [c for c in columns if c != FILENAME_COLUMN]
        needed = list(dict.fromkeys(wanted + [c for c in extra if c is not None]))
        table, names = scan_files(self._layout, files, needed, expr, dictionary_columns=dictionary_columns)
        check_versions(self.spec, self.version, table, names)
        check_required(self.spec, self.version, self.path, table, names)
        table = fill_null_defaults(table, self.spec)
        if dedupe == "executions":
            table = dedupe_copies(table, self.spec, FILENAME_COLUMN)
        elif dedupe:
            table = self.pick(table, columns=columns, sort_by_key=sort_by_key)
            return with_file_names(table, names)
        return with_file_names(table.select(columns), names)

    def pick(
        self, table: pa.Table, *, columns: Sequence[str] | None = None, sort_by_key: bool = True
    ) -> pa.Table:
        """One row per key by this dataset's rule (needs the key/order/execution columns);
        ``columns``/``sort_by_key`` as in :func:`dedupe_table`."""
        spec = self.spec
        if spec.execution_col is None:
            return dedupe_table(table, spec.key, spec.order_col, FILENAME_COLUMN, columns=columns,
                                sort_by_key=sort_by_key)
        if table.num_rows == 0 or pc.count_distinct(table[spec.key]).as_py() == table.num_rows:
            # one execution per key: nothing to pick (dedupe_table's no-copy fast paths)
            return dedupe_table(table, spec.key, None, None, columns=columns, sort_by_key=sort_by_key)
        out = pick_latest(table, spec, FILENAME_COLUMN)
        return out.select(list(columns)) if columns is not None else out

    def keys(
        self,
        *,
        date_from: dt.date | None = None,
        date_to: dt.date | None = None,
        filters: Mapping[str, Any] | None = None,
    ) -> set[str]:
        """Distinct keys matching the filters, reading only the columns the filter needs."""
        table = self.read(
            date_from=date_from, date_to=date_to, filters=filters,
            columns=[self.spec.key], dedupe=False,
        )
        return set(pc.unique(table[self.spec.key]).to_pylist())
