"""Campaigns end to end: the ``irbench`` CLI, campaign specs and plans, the local and distributed
executors, and the jobs beside them (analysis, probes, availability)."""

__all__ = [
    "campaign",
    "cli",
    "distributed",
    "jobs",
    "local",
]
