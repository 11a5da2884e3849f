"""The Parquet machinery: date-partitioned datasets, atomic writes, scans, dedupe, compaction, spool."""

__all__ = [
    "atomic",
    "compaction",
    "dataset",
    "dedupe",
    "read_checks",
    "scan",
    "spec",
    "spool",
    "store_marker",
    "unreadable",
]
