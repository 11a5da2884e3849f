"""Reading a dataset that may hold unreadable (corrupt, truncated) Parquet files.

``read_checked`` reads like ``ParquetDataset.read``; when that fails it finds the files that
cannot be read and either raises one ``StorageError`` naming them (and the flag that skips
them) or, with ``skip=True``, reads the others and returns the skipped paths.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from storage.parquet.dataset import ParquetDataset
from storage.errors import StorageError


def unreadable_files(files: Sequence[Path]) -> list[Path]:
    """The files of ``files`` that Parquet cannot read whole."""
    bad = []
    for f in files:
        try:
            pq.read_table(f)
        except (OSError, pa.ArrowException):
            bad.append(Path(f))
    return bad


@dataclass(frozen=True)
class RowSelection:
    """Which rows and columns a read asks for, as in ``ParquetDataset.read``: the partition dates
    ``[date_from, date_to]``, the column ``filters``, the ``columns`` (``None``: all)."""

    date_from: dt.date | None = None
    date_to: dt.date | None = None
    filters: Mapping[str, Any] | None = None
    columns: Sequence[str] | None = None


def read_checked(
    dataset: ParquetDataset,
    *,
    skip: bool,
    selection: RowSelection = RowSelection(),
    flag: str = "--skip-corrupt",
    dedupe: bool | str = True,
) -> tuple[pa.Table, list[Path]]:
    """``(rows of selection, skipped files)``; see the module docstring. ``flag`` names the option
    in the error message; ``dedupe`` as in ``ParquetDataset.read`` (``"executions"``: every
    execution once)."""
    date_from, date_to, filters, columns = selection.date_from, selection.date_to, selection.filters, selection.columns
    try:
        return dataset.read(
            date_from=date_from, date_to=date_to, filters=filters, columns=columns, dedupe=dedupe
        ), []
    except StorageError:
        files = dataset.data_files(date_from, date_to)
        bad = unreadable_files(files)
        if not bad:
            raise
        if not skip:
            raise StorageError(
                f"{len(bad)} unreadable Parquet file(s) under {dataset.path}: {', '.join(map(str, bad))}; move "
                f"them out of the data directory, or pass {flag} to go on without them"
            ) from None
    table = dataset.read_files([f for f in files if f not in bad], dedupe=dedupe)
    expr = dataset.filter_expression(date_from, date_to, filters)
    if expr is not None:
        table = table.filter(expr)
    if columns is not None:
        table = table.select(list(columns))
    return table, bad
