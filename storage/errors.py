"""The one exception the storage layer raises on purpose.

``storage`` imports nothing of ours, so this is its own root; ``workers.errors.StorageError``
is expected to subclass it (``class StorageError(IrbenchError, storage.errors.StorageError)``)
so that callers catching either name see every storage failure.
"""

from __future__ import annotations


class StorageError(Exception):
    """The dataset cannot be read or written.

    Messages name the file or partition involved and say what to do about it.
    """
