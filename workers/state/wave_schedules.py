"""Scheduled measurement waves, kept in Redis so every beat and every ``irbench schedule`` of a
cluster sees the same list.

``P:schedules`` is a HASH campaign name -> the schedule as JSON. A beat tick asks
:meth:`WaveSchedules.take_due` for the schedules whose time has come; taking one moves its next
due time past now in the same script, so two beats (or a tick repeated after a redelivery) start
a wave once per period. Periods missed while nothing ran are skipped, not replayed.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import redis

from workers.errors import ConfigError
from workers.state.campaign_keys import as_text

SCHEDULES_KEY = "schedules"
#: The shortest period accepted: a wave is a whole campaign, so a shorter one is a typo.
MIN_EVERY_S = 60.0

# Take every due schedule and move its next due time past now (KEYS[1]: the hash; ARGV[1]: now).
_TAKE_DUE = """
local taken = {}
local all = redis.call('HGETALL', KEYS[1])
local now = tonumber(ARGV[1])
for i = 1, #all, 2 do
  local s = cjson.decode(all[i + 1])
  if s.next_due_s <= now then
    local periods = math.floor((now - s.next_due_s) / s.every_s) + 1
    local due = s.next_due_s
    s.next_due_s = s.next_due_s + periods * s.every_s
    redis.call('HSET', KEYS[1], all[i], cjson.encode(s))
    table.insert(taken, cjson.encode({name = all[i], due_s = due, schedule = s}))
  end
end
return taken
"""


@dataclass(frozen=True)
class WaveSchedule:
    """One campaign re-measured every ``every_s`` seconds: ``campaign`` (its name),
    ``campaign_path`` (the TOML file, as the workers see it), ``data`` (the store root, as the
    workers see it), ``next_due_s`` (Unix seconds of the next wave). The broker is the one the
    schedule is kept in: its URL (which may carry a password) is never stored."""

    campaign: str
    campaign_path: str
    data: str
    every_s: float
    next_due_s: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.every_s) or self.every_s < MIN_EVERY_S:
            raise ConfigError(f"a wave schedule needs a period of at least {MIN_EVERY_S:g} s, got {self.every_s:g} s")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> WaveSchedule:
        d = json.loads(text)
        return cls(campaign=str(d["campaign"]), campaign_path=str(d["campaign_path"]), data=str(d["data"]),
                   every_s=float(d["every_s"]), next_due_s=float(d["next_due_s"]))


@dataclass(frozen=True)
class DueWave:
    """A wave a tick has taken: ``schedule`` (its next due time already moved on) and ``due_s``
    (when this wave was due, Unix seconds)."""

    schedule: WaveSchedule
    due_s: float


class WaveSchedules:
    """The cluster's wave schedules under ``prefix`` (``irbench`` by default)."""

    def __init__(self, client: redis.Redis, prefix: str = "irbench") -> None:
        self._client = client
        self._key = f"{prefix}:{SCHEDULES_KEY}"
        self._take = client.register_script(_TAKE_DUE)

    def put(self, schedule: WaveSchedule) -> None:
        """Add ``schedule``, or replace the campaign's schedule."""
        self._client.hset(self._key, schedule.campaign, schedule.to_json())

    def remove(self, campaign: str) -> bool:
        """Drop the campaign's schedule; False when it had none."""
        return bool(self._client.hdel(self._key, campaign))

    def all(self) -> list[WaveSchedule]:
        """Every schedule, by campaign name."""
        raw = self._client.hgetall(self._key)
        return sorted((WaveSchedule.from_json(as_text(v)) for v in raw.values()), key=lambda s: s.campaign)

    def take_due(self, now_s: float) -> list[DueWave]:
        """The schedules due at ``now_s`` (Unix seconds), each moved to its next period in the
        same script: a wave is handed out once however many ticks ask."""
        out = []
        for item in self._take(keys=[self._key], args=[repr(float(now_s))]):
            d = json.loads(as_text(item))
            out.append(DueWave(WaveSchedule.from_json(json.dumps(d["schedule"])), float(d["due_s"])))
        return out


def parse_every(text: str) -> float:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"90s"`` (or plain seconds) as seconds; ConfigError otherwise."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"--every {text!r} is not a period: write e.g. 7d, 12h, 30m or 3600 (seconds)")
    return value
