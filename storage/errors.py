"""The root of irbench's exception tree, and the storage layer's own error.

``storage`` imports nothing of ours, so the root lives here, at the bottom of the dependency
graph; ``workers.errors`` re-exports it and draws the rest of the tree, and ``analysis`` can
raise ``IrbenchError`` subclasses without importing ``workers``.
"""

from __future__ import annotations


class IrbenchError(Exception):
    """Root of every error irbench raises on purpose."""


class StorageError(IrbenchError):
    """The dataset cannot be read or written.

    Messages name the file or partition involved and say what to do about it.
    """
