"""The data contract and the Parquet storage layer (imports nothing else of irbench).

The names below are loaded on first use (PEP 562): importing any ``storage`` module runs this
file, and an eager import here would load pyarrow into every process that only needs
``storage.errors`` -- e.g. each ``irbench`` start-up, before it knows which command it runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from storage.parquet.compaction import CompactionConfig, CompactionReport, PartitionCompaction
    from storage.parquet.dataset import DatasetSpec, ParquetDataset, WriteResult
    from storage.errors import StorageError
    from storage.runs import RunStore
    from storage.schema import RUN_SCHEMA, records_to_table, table_to_records

_HOME = {
    "RUN_SCHEMA": "storage.schema",
    "CompactionConfig": "storage.parquet.compaction",
    "CompactionReport": "storage.parquet.compaction",
    "DatasetSpec": "storage.parquet.dataset",
    "ParquetDataset": "storage.parquet.dataset",
    "PartitionCompaction": "storage.parquet.compaction",
    "RunStore": "storage.runs",
    "StorageError": "storage.errors",
    "WriteResult": "storage.parquet.dataset",
    "records_to_table": "storage.schema",
    "table_to_records": "storage.schema",
}

__all__ = [
    "RUN_SCHEMA",
    "CompactionConfig",
    "CompactionReport",
    "DatasetSpec",
    "ParquetDataset",
    "PartitionCompaction",
    "RunStore",
    "StorageError",
    "WriteResult",
    "records_to_table",
    "table_to_records",
]


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'storage' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
