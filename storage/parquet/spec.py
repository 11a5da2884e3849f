"""``DatasetSpec``: what makes one dataset (directory name, schema, dedupe key, partitioning).

Its own module so the scan, read checks and dedupe rules can name it without importing the
dataset class that uses them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

from storage.errors import StorageError

#: A dataset's directory name and a published file's stem: a plain name, no path separators.
STEM_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


@dataclass(frozen=True)
class DatasetSpec:
    """What makes one dataset: directory name, schema, dedupe key and partitioning.

    ``schema`` must contain ``key`` (string), ``partition_col`` (date32) and, if given,
    ``order_col`` (dedupe keeps the row with the smallest value) and ``version_col`` (rows
    with a value above the schema-metadata version are refused on read).

    ``execution_col`` (optional) makes the dataset one of *executions*: several rows per key
    are kept, one per execution id, and the deduplicating read picks the **latest** execution
    of each key: the largest ``finish_col`` (``order_col`` where that is null), ties broken by
    the smallest execution id, then file name, then row position (:func:`pick_latest`).
    Compaction then only collapses copies of the same (key, execution) (:func:`dedupe_copies`).

    ``null_defaults``: ``(column, value)`` pairs for nullable columns a schema version added
    whose null (a row of an older version) means ``value``: reads fill it, filters match it.
    """

    name: str
    schema: pa.Schema
    key: str
    partition_col: str
    order_col: str | None = None
    version_col: str | None = None
    execution_col: str | None = None
    finish_col: str | None = None
    null_defaults: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        names = set(self.schema.names)
        for col in (self.key, self.partition_col, self.order_col, self.version_col,
                    self.execution_col, self.finish_col):
            if col is not None and col not in names:
                raise StorageError(f"dataset {self.name!r}: column {col!r} is not in its schema")
        if self.schema.field(self.partition_col).type != pa.date32():
            raise StorageError(f"dataset {self.name!r}: partition column must be date32")
        if not STEM_RE.match(self.name):
            raise StorageError(f"dataset name {self.name!r} must be a plain directory name")
