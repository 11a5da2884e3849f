"""The in-process executor: runs a campaign's plan on one event loop and writes it to the store."""

__all__ = [
    "campaign",
    "executor",
    "progress",
    "writer",
]
