"""The files workers uploaded to a bucket store, as a Redis list the orchestrator follows.

A bucket has no cheap "what is new" (listing costs a request per 1,000 objects, every
object every time), so each worker's uploader appends the paths it uploaded to
``<prefix>:objects:<store hash>`` and the orchestrator reads the list from where it stopped
(``LRANGE offset -1``): each look costs what was published since the last one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import redis

__all__ = ["PublishedObjects"]


class PublishedObjects:
    """The upload log of the store at ``store_url`` (``s3://…``) in ``client``'s Redis."""

    def __init__(self, client: redis.Redis, store_url: str, prefix: str = "irbench") -> None:
        self._client = client
        self.key = f"{prefix}:objects:{hashlib.sha256(store_url.encode()).hexdigest()[:16]}"

    def announce(self, relatives: Sequence[str]) -> None:
        """Append the store paths of files just uploaded (raises RedisError: the caller retries)."""
        if relatives:
            self._client.rpush(self.key, *relatives)

    def length(self) -> int:
        return int(self._client.llen(self.key))

    def since(self, offset: int) -> tuple[list[str], int]:
        """The paths announced from position ``offset`` on, and the offset after them."""
        raw = self._client.lrange(self.key, offset, -1)
        paths = [r.decode() if isinstance(r, bytes) else str(r) for r in raw]
        return paths, offset + len(paths)
