"""Per-campaign coordination state in Redis, shared by the orchestrator and every worker.

Keys (one hash tag per campaign, so a cluster keeps them on one slot), ``P = {prefix}:{<campaign>}``:

* ``P:planned``     HASH model -> planned runs (written by the orchestrator)
* ``P:counts``      HASH ``<model>|<outcome>`` -> runs done, and ``<model>|_failed``
* ``P:done:<run>``  STRING outcome: the run's record is stored (set only AFTER the write)
* ``P:claim:<run>`` STRING owner, with a TTL renewed by the executing worker's heartbeat:
  at most one live execution per run (a duplicate delivery sees it and steps aside)
* ``P:running``     HASH run_id -> model (in-flight display; cleaned when the run is done)
* ``P:dispatched``  ZSET run_id -> last sign of life in Redis-clock seconds (dispatch, start,
  heartbeat, deferral end). The reconciler re-dispatches runs whose score is older than a
  lease horizon and which have no stored outcome.
* ``P:cancel``      STRING reason: the campaign is cancelled
* ``P:gate`` / ``P:streak`` HASH model -> closed reason / consecutive disabling outcomes
  (``workers.celery.gate``)

Every time is Redis ``TIME`` (inside scripts), so machines' clocks never matter. Redis is a
cache of progress, not the truth: the Parquet store says which runs have an outcome, and the
orchestrator rebuilds everything else from the plan (e.g. after a Redis restart without AOF).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import redis

FAILED_FIELD = "_failed"
CLAIMED, DONE, BUSY = "ok", "done", "busy"

# ARGV: run_id, model, owner, ttl_ms. Done -> 'done'; someone else's live claim -> 'busy'.
_CLAIM = """
local p = KEYS[1]
if redis.call('EXISTS', p .. ':done:' .. ARGV[1]) == 1 then return 'done' end
local ok = redis.call('SET', p .. ':claim:' .. ARGV[1], ARGV[3], 'NX', 'PX', ARGV[4])
if not ok then
  if redis.call('GET', p .. ':claim:' .. ARGV[1]) ~= ARGV[3] then return 'busy' end
  redis.call('PEXPIRE', p .. ':claim:' .. ARGV[1], ARGV[4])
end
local t = redis.call('TIME')
redis.call('ZADD', p .. ':dispatched', tonumber(t[1]) + tonumber(t[2]) / 1e6, ARGV[1])
redis.call('HSET', p .. ':running', ARGV[1], ARGV[2])
return 'ok'
"""

# ARGV: run_id, owner, ttl_ms. Renews the claim and the sign of life; 0 if the claim is lost.
_RENEW = """
local p = KEYS[1]
if redis.call('GET', p .. ':claim:' .. ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('PEXPIRE', p .. ':claim:' .. ARGV[1], ARGV[3])
local t = redis.call('TIME')
redis.call('ZADD', p .. ':dispatched', 'XX', tonumber(t[1]) + tonumber(t[2]) / 1e6, ARGV[1])
return 1
"""

# ARGV: run_id, owner, defer_s. Drop our claim; the next sign of life is expected after defer_s.
_RELEASE = """
local p = KEYS[1]
if redis.call('GET', p .. ':claim:' .. ARGV[1]) == ARGV[2] then redis.call('DEL', p .. ':claim:' .. ARGV[1]) end
redis.call('HDEL', p .. ':running', ARGV[1])
local t = redis.call('TIME')
redis.call('ZADD', p .. ':dispatched', tonumber(t[1]) + tonumber(t[2]) / 1e6 + tonumber(ARGV[3]), ARGV[1])
return 1
"""

# ARGV: run_id, model, outcome, failed(0/1). Counts each run once; returns 1 if newly done.
_DONE = """
local p = KEYS[1]
local new = redis.call('SET', p .. ':done:' .. ARGV[1], ARGV[3], 'NX')
redis.call('ZREM', p .. ':dispatched', ARGV[1])
redis.call('HDEL', p .. ':running', ARGV[1])
redis.call('DEL', p .. ':claim:' .. ARGV[1])
if not new then return 0 end
redis.call('HINCRBY', p .. ':counts', ARGV[2] .. '|' .. ARGV[3], 1)
if ARGV[4] == '1' then redis.call('HINCRBY', p .. ':counts', ARGV[2] .. '|' .. '_failed', 1) end
return 1
"""


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


class CampaignState:
    """Sync view of one campaign's keys. ``client``: a ``redis.Redis`` (pooled, thread-safe)."""

    def __init__(self, client: redis.Redis, campaign: str, *, prefix: str = "irbench:camp") -> None:
        self.client = client
        self.campaign = campaign
        self.base = f"{prefix}:{{{campaign}}}"
        self._claim = client.register_script(_CLAIM)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._done = client.register_script(_DONE)

    def key(self, name: str) -> str:
        return f"{self.base}:{name}"

    # ----- time ------------------------------------------------------------------------------
    def now_s(self) -> float:
        """Redis's clock in seconds (the clock every score in ``dispatched`` is on)."""
        sec, usec = self.client.time()
        return float(sec) + float(usec) / 1e6

    # ----- plan --------------------------------------------------------------------------------
    def set_planned(self, totals: Mapping[str, int]) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self.key("planned"))
        if totals:
            pipe.hset(self.key("planned"), mapping={m: int(n) for m, n in totals.items()})
        pipe.execute()

    def planned(self) -> dict[str, int]:
        return {_s(k): int(v) for k, v in self.client.hgetall(self.key("planned")).items()}

    # ----- one run (worker side) ----------------------------------------------------------------
    def claim(self, run_id: str, model: str, owner: str, ttl_s: float) -> str:
        """``CLAIMED`` (execute it), ``DONE`` (already stored) or ``BUSY`` (live elsewhere)."""
        return _s(self._claim(keys=[self.base], args=[run_id, model, owner, max(int(ttl_s * 1000), 1)]))

    def renew_claim(self, run_id: str, owner: str, ttl_s: float) -> bool:
        return int(self._renew(keys=[self.base], args=[run_id, owner, max(int(ttl_s * 1000), 1)])) == 1

    def release_claim(self, run_id: str, owner: str, defer_s: float) -> None:
        self._release(keys=[self.base], args=[run_id, owner, max(defer_s, 0.0)])

    def mark_done(self, run_id: str, model: str, outcome: str, failed: bool) -> bool:
        """Record that ``run_id``'s record is stored; True the first time only."""
        return int(self._done(keys=[self.base], args=[run_id, model, outcome, "1" if failed else "0"])) == 1

    def is_done(self, run_id: str) -> bool:
        return bool(self.client.exists(self.key(f"done:{run_id}")))

    def done_among(self, run_ids: Iterable[str]) -> set[str]:
        """The subset of ``run_ids`` with a done marker (pipelined)."""
        ids = list(run_ids)
        pipe = self.client.pipeline(transaction=False)
        for r in ids:
            pipe.exists(self.key(f"done:{r}"))
        return {r for r, e in zip(ids, pipe.execute()) if e}

    # ----- progress ------------------------------------------------------------------------------
    def counts(self) -> dict[str, dict[str, int]]:
        """model -> outcome -> runs done (plus ``_failed``)."""
        out: dict[str, dict[str, int]] = {}
        for k, v in self.client.hgetall(self.key("counts")).items():
            model, _, outcome = _s(k).rpartition("|")
            out.setdefault(model, {})[outcome] = int(v)
        return out

    def running_by_model(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in self.client.hvals(self.key("running")):
            out[_s(v)] = out.get(_s(v), 0) + 1
        return out

    # ----- dispatch bookkeeping (orchestrator side) ------------------------------------------------
    def record_dispatch(self, run_ids: Iterable[str], now_s: float | None = None) -> None:
        ids = list(run_ids)
        if ids:
            now = self.now_s() if now_s is None else now_s
            self.client.zadd(self.key("dispatched"), {r: now for r in ids})

    def dispatched(self) -> dict[str, float]:
        """run_id -> last sign of life (Redis seconds) for every dispatched, not-done run."""
        return {_s(m): float(s) for m, s in self.client.zrange(self.key("dispatched"), 0, -1, withscores=True)}

    def forget_dispatch(self, run_ids: Iterable[str]) -> None:
        ids = list(run_ids)
        if ids:
            self.client.zrem(self.key("dispatched"), *ids)

    def outstanding(self) -> int:
        return int(self.client.zcard(self.key("dispatched")))

    # ----- cancel ----------------------------------------------------------------------------------
    def cancel(self, reason: str) -> None:
        self.client.set(self.key("cancel"), reason or "cancelled")

    def cancel_reason(self) -> str | None:
        v = self.client.get(self.key("cancel"))
        return None if v is None else _s(v)

    def clear_cancel(self) -> None:
        self.client.delete(self.key("cancel"))


# ARGV: pairs of run_id, model. Forget each run's done marker (``--retry-failed``: the run is to be
# executed again) and take it out of the counters; returns how many markers were removed.
_REOPEN = """
local p = KEYS[1]
local n = 0
for i = 1, #ARGV, 2 do
  local key = p .. ':done:' .. ARGV[i]
  local outcome = redis.call('GET', key)
  if outcome then
    redis.call('DEL', key)
    redis.call('HINCRBY', p .. ':counts', ARGV[i + 1] .. '|' .. outcome, -1)
    if outcome ~= 'ok' then redis.call('HINCRBY', p .. ':counts', ARGV[i + 1] .. '|_failed', -1) end
    n = n + 1
  end
end
return n
"""


def reopen_runs(state: CampaignState, runs: Mapping[str, str]) -> int:
    """Make ``runs`` (run_id -> model) executable again: workers' claims no longer see them done,
    and the progress counters no longer count them. Returns the done markers removed."""
    script = state.client.register_script(_REOPEN)
    items = list(runs.items())
    removed = 0
    for i in range(0, len(items), 500):  # bounded script arguments
        args = [x for pair in items[i : i + 500] for x in pair]
        removed += int(script(keys=[state.base], args=args))
    return removed
