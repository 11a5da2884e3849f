"""When Redis received each limiter cooldown: ``MONITOR`` on a real redis-server, keeping the
``HSET <prefix>:{<model>}:state cool <until_us> ...`` that ``cooldown.lua`` runs.

Both times are on Redis's clock, which is the host's CLOCK_REALTIME (``TIME``; MONITOR stamps
with the same clock): comparable with ``simulator.wire`` kernel timestamps. From that moment
every worker's next admission check sees the cooldown.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
from types import TracebackType

import redis


@dataclass(frozen=True)
class CooldownRecord:
    """``recorded_s``: when Redis ran the cooldown script; ``until_s``: the cooldown's end."""

    recorded_s: float
    until_s: float


class CooldownMonitor:
    """Watch one Redis (``url``) from ``__enter__`` to ``__exit__``; then :meth:`records` of a model."""

    def __init__(self, url: str, key_prefix: str = "irbench:lim") -> None:
        self._url, self._prefix = url, key_prefix
        self._records: dict[str, list[CooldownRecord]] = defaultdict(list)
        self._client = redis.Redis.from_url(url)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.error: str | None = None
        self._t = threading.Thread(target=self._run, name="redis-monitor", daemon=True)

    def records(self, model: str) -> list[CooldownRecord]:
        return sorted(self._records.get(model, []), key=lambda r: r.recorded_s)

    def _run(self) -> None:
        head, tail = f"{self._prefix}:{{", "}:state"
        try:
            with self._client.monitor() as m:
                self._ready.set()
                for cmd in m.listen():
                    if self._stop.is_set():
                        return
                    words = cmd["command"].split(" ")
                    if (len(words) >= 4 and words[0].upper() == "HSET" and words[2] == "cool"
                            and words[1].startswith(head) and words[1].endswith(tail)):
                        model = words[1][len(head):-len(tail)]
                        self._records[model].append(CooldownRecord(float(cmd["time"]), int(words[3]) / 1e6))
        except (redis.RedisError, OSError) as exc:
            self.error = str(exc)
            self._ready.set()

    def __enter__(self) -> CooldownMonitor:
        self._t.start()
        self._ready.wait(10)
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        try:
            redis.Redis.from_url(self._url).ping()  # one more MONITOR line: the thread sees the stop
        except (redis.RedisError, OSError):
            pass
        self._t.join(10)
        self._client.close()
