"""The Parquet machinery: date-partitioned datasets, atomic writes, scans, dedupe, compaction, spool and its intents."""

__all__ = [
    "atomic",
    "compaction",
    "dataset",
    "dedupe",
    "intents",
    "read_checks",
    "scan",
    "spec",
    "spool",
    "store_marker",
    "unreadable",
]
