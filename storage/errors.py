"""The root of irbench's exception tree and the one exception the storage layer raises.

``storage`` imports nothing of ours, so the root lives here, at the bottom of the dependency
graph. ``workers/errors.py`` should import both names from this module instead of defining its
own (``from storage.errors import IrbenchError, StorageError``), so that ``except IrbenchError``
and ``except workers.errors.StorageError`` both catch what storage raises.
"""

from __future__ import annotations


class IrbenchError(Exception):
    """Root of every error irbench raises on purpose."""


class StorageError(IrbenchError):
    """The dataset cannot be read or written.

    Messages name the file or partition involved and say what to do about it.
    """
