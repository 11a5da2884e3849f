"""The in-process executor: runs a campaign's plan on one event loop and writes it to the store."""

__all__ = [
    "batch_writer",
    "campaign",
    "campaign_lock",
    "executor",
    "progress",
    "writer",
]
