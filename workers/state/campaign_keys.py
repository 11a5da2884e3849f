"""Where one campaign's Redis state lives: the client, the base key and Redis's clock, shared by
the classes of ``workers.state.campaign_state`` (each owns some of the keys under the base)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

#: One script call to pipeline: (the registered script, KEYS, ARGV).
Call = tuple[Any, list[str], list[Any]]


def as_text(x: Any) -> str:
    """A Redis reply as text (the clients here return bytes)."""
    return x.decode() if isinstance(x, bytes) else str(x)


def ttl_ms(ttl_s: float) -> int:
    """A TTL in seconds as the whole milliseconds the scripts take (at least 1)."""
    return max(int(ttl_s * 1000), 1)


@dataclass(frozen=True)
class CampaignKeys:
    """``client``: a ``redis.Redis`` (pooled, thread-safe); ``base``: the campaign's base key
    ``P`` (KEYS[1] of every campaign script)."""

    client: redis.Redis
    base: str

    def key(self, name: str) -> str:
        """The key ``P:<name>``."""
        return f"{self.base}:{name}"

    def now_s(self) -> float:
        """Redis's clock in seconds (the clock every score of the campaign is on)."""
        sec, usec = self.client.time()
        return float(sec) + float(usec) / 1e6
