"""The data contract and the Parquet storage layer (imports nothing else of irbench)."""

from storage.compaction import CompactionConfig, CompactionReport, PartitionCompaction
from storage.dataset import DatasetSpec, ParquetDataset, WriteResult
from storage.errors import StorageError
from storage.runs import RunStore
from storage.schema import RUN_SCHEMA, records_to_table, table_to_records

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
