"""Per-campaign coordination state in Redis, shared by the orchestrator and every worker.

Keys (one hash tag per campaign, so a cluster keeps them on one slot), ``P = {prefix}:{<campaign>}``:

* ``P:planned``     HASH model -> planned runs (written by the orchestrator)
* ``P:counts``      HASH ``<model>|<outcome>`` -> runs done, ``<model>|_failed``, and
  ``<model>|_executions`` / ``<model>|_attempts`` (every stored execution, duplicates included)
* ``P:done:<run>``  STRING outcome: the run's record is durable (set only AFTER the write)
* ``P:donelog``     LIST run_ids in the order they were first marked done (and re-announced by
  a claim that finds them done): the orchestrator reads it with a cursor, so completion costs
  O(runs finished since its last look), never a scan of the store
* ``P:claim:<run>`` STRING owner, with a TTL renewed by the executing worker's heartbeat:
  at most one live execution per run (a duplicate delivery sees it and steps aside)
* ``P:queued``      ZSET run_id -> dispatch time: published to the broker, not yet claimed
* ``P:running``     HASH run_id -> model: claimed (the claim key says whether its worker lives)
* ``P:delayed``     ZSET run_id -> due time: deferred (rate limit, cooldown, a task failure); the
  orchestrator moves due runs back to the broker (:meth:`CampaignState.pop_due`). Deferred runs
  are never parked as countdown messages inside a worker that can die.
* ``P:fails``       HASH run_id -> task failures and worker deaths; ``P:fail_text`` the last
  failure's text (poison runs end after N, ``orchestrator``'s ``max_task_failures``)
* ``P:cancel``      STRING reason: the campaign is cancelled
* ``P:gate`` / ``P:streak`` HASH model -> closed reason / consecutive disabling outcomes
  (``workers.state.gate``)

Every time is Redis ``TIME`` (inside scripts), so machines' clocks never matter. Redis is a
cache of progress, not the truth: the Parquet store says which runs have a record, and the
orchestrator rebuilds everything else from the plan (e.g. after a Redis restart).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis

FAILED_FIELD = "_failed"
EXECUTIONS_FIELD = "_executions"
ATTEMPTS_FIELD = "_attempts"
META_FIELDS = (FAILED_FIELD, EXECUTIONS_FIELD, ATTEMPTS_FIELD)
CLAIMED, DONE, BUSY = "ok", "done", "busy"
#: One script call to pipeline: (the registered script, KEYS, ARGV).
Call = tuple[Any, list[str], list[Any]]

_NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) + tonumber(t[2]) / 1e6"

# ARGV: run_id, model, owner, ttl_ms, with_gate. Done -> 'done' (re-announced); a live claim -> 'busy'.
# Claimed -> 'ok', or with_gate = '1': {'ok', cancel, gate, streak} of the run's model ('+value' or '-').
_CLAIM = """
local p = KEYS[1]
if redis.call('EXISTS', p .. ':done:' .. ARGV[1]) == 1 then
  redis.call('ZREM', p .. ':queued', ARGV[1])
  redis.call('RPUSH', p .. ':donelog', ARGV[1])
  return 'done'
end
local ok = redis.call('SET', p .. ':claim:' .. ARGV[1], ARGV[3], 'NX', 'PX', ARGV[4])
if not ok then
  if redis.call('GET', p .. ':claim:' .. ARGV[1]) ~= ARGV[3] then return 'busy' end
  redis.call('PEXPIRE', p .. ':claim:' .. ARGV[1], ARGV[4])
end
redis.call('ZREM', p .. ':queued', ARGV[1])
redis.call('ZREM', p .. ':delayed', ARGV[1])
redis.call('HSET', p .. ':running', ARGV[1], ARGV[2])
if ARGV[5] ~= '1' then return 'ok' end
local function opt(v) if v then return '+' .. v end return '-' end
return {'ok', opt(redis.call('GET', p .. ':cancel')), opt(redis.call('HGET', p .. ':gate', ARGV[2])),
        opt(redis.call('HGET', p .. ':streak', ARGV[2]))}
"""

# ARGV: run_id, owner, ttl_ms. Renews the claim; 0 if it is lost (expired or taken over).
_RENEW = """
local p = KEYS[1]
if redis.call('GET', p .. ':claim:' .. ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('PEXPIRE', p .. ':claim:' .. ARGV[1], ARGV[3])
return 1
"""

# ARGV: run_ids still queued in a live worker's hands (delivered, waiting there for a run slot,
# unclaimed): their queued time is refreshed, so the reconciler does not take them for lost.
_REFRESH_QUEUED = f"""
local p = KEYS[1]
{_NOW}
for i = 1, #ARGV do redis.call('ZADD', p .. ':queued', 'XX', now, ARGV[i]) end
return #ARGV
"""

# ARGV: run_id, owner, defer_s, failure text ('' = a deferral, not a failure).
# Drops our claim and parks the run in the delayed set, due in defer_s; returns the failure count.
_DEFER = f"""
local p = KEYS[1]
if redis.call('GET', p .. ':claim:' .. ARGV[1]) == ARGV[2] then redis.call('DEL', p .. ':claim:' .. ARGV[1]) end
redis.call('HDEL', p .. ':running', ARGV[1])
redis.call('ZREM', p .. ':queued', ARGV[1])  -- a run failed before its claim was queued still
local fails = 0
if ARGV[4] ~= '' then
  fails = redis.call('HINCRBY', p .. ':fails', ARGV[1], 1)
  redis.call('HSET', p .. ':fail_text', ARGV[1], ARGV[4])
end
if redis.call('EXISTS', p .. ':done:' .. ARGV[1]) == 0 then
  {_NOW}
  redis.call('ZADD', p .. ':delayed', now + tonumber(ARGV[3]), ARGV[1])
end
return fails
"""

# ARGV: run_id, model, outcome, failed(0/1), attempts. Returns 1 if newly done.
_DONE = """
local p = KEYS[1]
local new = redis.call('SET', p .. ':done:' .. ARGV[1], ARGV[3], 'NX')
redis.call('ZREM', p .. ':queued', ARGV[1])
redis.call('ZREM', p .. ':delayed', ARGV[1])
redis.call('HDEL', p .. ':running', ARGV[1])
redis.call('DEL', p .. ':claim:' .. ARGV[1])
redis.call('HINCRBY', p .. ':counts', ARGV[2] .. '|_executions', 1)
redis.call('HINCRBY', p .. ':counts', ARGV[2] .. '|_attempts', tonumber(ARGV[5]))
if not new then return 0 end
redis.call('RPUSH', p .. ':donelog', ARGV[1])
redis.call('HINCRBY', p .. ':counts', ARGV[2] .. '|' .. ARGV[3], 1)
if ARGV[4] == '1' then redis.call('HINCRBY', p .. ':counts', ARGV[2] .. '|_failed', 1) end
return 1
"""

# ARGV: run_id, model, ... Drops done markers and un-counts them (``--retry-failed``); returns
# how many markers were removed.
_REOPEN = """
local p = KEYS[1]
local n = 0
for i = 1, #ARGV, 2 do
  local r, m = ARGV[i], ARGV[i + 1]
  local outcome = redis.call('GET', p .. ':done:' .. r)
  if outcome then
    redis.call('DEL', p .. ':done:' .. r)
    redis.call('HINCRBY', p .. ':counts', m .. '|' .. outcome, -1)
    if outcome ~= 'ok' then redis.call('HINCRBY', p .. ':counts', m .. '|_failed', -1) end
    n = n + 1
  end
  redis.call('HDEL', p .. ':fails', r)
end
return n
"""

# ARGV: max, ahead_s. Moves up to max runs due within ahead_s from delayed to queued (now);
# returns {run_id, seconds until due (<= 0: overdue), ...}.
_POP_DUE = f"""
local p = KEYS[1]
{_NOW}
local due = redis.call('ZRANGEBYSCORE', p .. ':delayed', '-inf', now + tonumber(ARGV[2]), 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
local out = {{}}
for i = 1, #due, 2 do
  redis.call('ZREM', p .. ':delayed', due[i])
  redis.call('ZADD', p .. ':queued', now, due[i])
  table.insert(out, due[i])
  table.insert(out, tostring(tonumber(due[i + 1]) - now))
end
return out
"""

# ARGV: run_id... For each running run whose claim key is gone (its worker died or stalled
# past the TTL): drop it from running, count a failure; returns {run_id, failures, ...}.
_LOST = """
local p = KEYS[1]
local out = {}
for _, r in ipairs(ARGV) do
  if redis.call('EXISTS', p .. ':claim:' .. r) == 0 and redis.call('HEXISTS', p .. ':running', r) == 1 then
    redis.call('HDEL', p .. ':running', r)
    local n = 0
    if redis.call('EXISTS', p .. ':done:' .. r) == 0 then
      n = redis.call('HINCRBY', p .. ':fails', r, 1)
      redis.call('HSET', p .. ':fail_text', r, 'worker lost while executing the run (killed, or stalled past its claim TTL)')
    end
    table.insert(out, r)
    table.insert(out, n)
  end
end
return out
"""


@dataclass(frozen=True)
class GateView:
    """A model's gate as the claim script read it: the campaign's cancel reason, the model's
    closed reason (each None when open) and whether a disabling streak is being counted."""

    cancel_reason: str | None
    closed_reason: str | None
    streak: bool

    @property
    def reason(self) -> str | None:
        return self.cancel_reason if self.cancel_reason is not None else self.closed_reason


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


#: The claim script's Lua source (KEYS[1] = the campaign's base key; ARGV: :func:`claim_args`),
#: for a script that claims and does more in the same call (``workers.state.claim_permit``).
CLAIM_LUA = _CLAIM


def claim_args(run_id: str, model: str, owner: str, ttl_s: float) -> list[Any]:
    """ARGV of a gate-reading claim of ``run_id`` by ``owner`` for ``ttl_s`` seconds."""
    return [run_id, model, owner, max(int(ttl_s * 1000), 1), "1"]


def parse_claim(reply: Any) -> tuple[str, GateView | None]:
    """A gate-reading claim's reply: ``DONE``/``BUSY`` with no view, or ``CLAIMED`` and the view."""
    if not isinstance(reply, list):
        return _s(reply), None
    cancel, gate, streak = (None if _s(v) == "-" else _s(v)[1:] for v in reply[1:4])
    return _s(reply[0]), GateView(cancel, gate, streak is not None and int(streak) > 0)


class CampaignState:
    """Sync view of one campaign's keys. ``client``: a ``redis.Redis`` (pooled, thread-safe)."""

    @staticmethod
    def finish_scripts(client: redis.Redis) -> list[Any]:
        """The scripts of :meth:`done_call` and :meth:`defer_call`, registered on ``client``
        (for a caller batching them with others: ``workers.state.script_batch``)."""
        return [client.register_script(_DONE), client.register_script(_DEFER)]

    def __init__(self, client: redis.Redis, campaign: str, *, prefix: str = "irbench:camp") -> None:
        self.client = client
        self.campaign = campaign
        self.base = f"{prefix}:{{{campaign}}}"
        self._claim = client.register_script(_CLAIM)
        self._renew = client.register_script(_RENEW)
        self._defer = client.register_script(_DEFER)
        self._done = client.register_script(_DONE)
        self._pop_due = client.register_script(_POP_DUE)
        self._lost = client.register_script(_LOST)
        self._reopen = client.register_script(_REOPEN)
        self._refresh_queued = client.register_script(_REFRESH_QUEUED)

    def key(self, name: str) -> str:
        return f"{self.base}:{name}"

    # ----- time and server ----------------------------------------------------------------------
    def now_s(self) -> float:
        """Redis's clock in seconds (the clock every score here is on)."""
        sec, usec = self.client.time()
        return float(sec) + float(usec) / 1e6

    def server_run_id(self) -> str:
        """The Redis server's run id: a new one after a restart (the state may be older then)."""
        return str(self.client.info("server").get("run_id", ""))

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
        return _s(self._claim(keys=[self.base], args=[run_id, model, owner, max(int(ttl_s * 1000), 1), "0"]))

    def claim_with_gate(self, run_id: str, model: str, owner: str, ttl_s: float) -> tuple[str, GateView | None]:
        """:meth:`claim`, plus (when ``CLAIMED``) the model's gate as read in the same script."""
        return parse_claim(self._claim(keys=[self.base], args=claim_args(run_id, model, owner, ttl_s)))

    def renew_claim(self, run_id: str, owner: str, ttl_s: float) -> bool:
        script, keys, args = self.renew_call(run_id, owner, ttl_s)
        return int(script(keys=keys, args=args)) == 1

    def renew_call(self, run_id: str, owner: str, ttl_s: float) -> Call:
        """The script, KEYS and ARGV :meth:`renew_claim` runs; its reply is 1 if still ours."""
        return self._renew, [self.base], [run_id, owner, max(int(ttl_s * 1000), 1)]

    def refresh_queued(self, run_ids: Sequence[str]) -> None:
        """Runs delivered to a live worker, waiting there for a slot: still queued, not lost."""
        for i in range(0, len(run_ids), 500):  # bounded script arguments
            self._refresh_queued(keys=[self.base], args=list(run_ids[i : i + 500]))

    def defer(self, run_id: str, owner: str, defer_s: float, failure: str = "") -> int:
        """Release our claim and park the run for ``defer_s``; ``failure`` (text) also counts a
        task failure. Returns the run's failure count."""
        script, keys, args = self.defer_call(run_id, owner, defer_s, failure)
        return int(script(keys=keys, args=args))

    def defer_call(self, run_id: str, owner: str, defer_s: float, failure: str = ""
                   ) -> Call:
        """The script, KEYS and ARGV :meth:`defer` runs (to pipeline it); its reply is the run's
        failure count."""
        return self._defer, [self.base], [run_id, owner, max(defer_s, 0.0), failure]

    def mark_done(self, run_id: str, model: str, outcome: str, failed: bool, attempts: int = 0) -> bool:
        """Record that an execution of ``run_id`` is durable; True the first time only."""
        script, keys, args = self.done_call(run_id, model, outcome, failed, attempts)
        return int(script(keys=keys, args=args)) == 1

    def done_call(self, run_id: str, model: str, outcome: str, failed: bool, attempts: int = 0
                  ) -> Call:
        """The script, KEYS and ARGV :meth:`mark_done` runs (to pipeline it with other calls);
        its reply is 1 if the run is newly done."""
        return self._done, [self.base], [run_id, model, outcome, "1" if failed else "0", int(attempts)]

    def is_done(self, run_id: str) -> bool:
        return bool(self.client.exists(self.key(f"done:{run_id}")))

    def done_among(self, run_ids: Iterable[str]) -> set[str]:
        """The subset of ``run_ids`` with a done marker (pipelined)."""
        ids = list(run_ids)
        pipe = self.client.pipeline(transaction=False)
        for r in ids:
            pipe.exists(self.key(f"done:{r}"))
        return {r for r, e in zip(ids, pipe.execute()) if e}

    def undo_done(self, run_ids: Iterable[str]) -> None:
        """Forget done markers whose records are not in the store (lost): the runs go again."""
        ids = list(run_ids)
        if ids:
            self.client.delete(*(self.key(f"done:{r}") for r in ids))

    def reopen(self, runs: Mapping[str, str]) -> int:
        """Make ``runs`` (run_id -> model) executable again (``--retry-failed``): their done
        markers and counts are dropped, so claims do not see them done. Returns markers removed."""
        items = list(runs.items())
        removed = 0
        for i in range(0, len(items), 500):  # bounded script arguments
            removed += int(self._reopen(keys=[self.base], args=[x for pair in items[i : i + 500] for x in pair]))
        return removed

    # ----- completion and progress (orchestrator side) ---------------------------------------------
    def done_since(self, cursor: int, limit: int = 10_000) -> tuple[list[str], int]:
        """run_ids announced done after position ``cursor`` of the done log, and the new cursor.
        A log shorter than the cursor (Redis lost its tail in a restart) restarts from 0."""
        n = int(self.client.llen(self.key("donelog")))
        if n < cursor:
            cursor = 0
        ids = [_s(x) for x in self.client.lrange(self.key("donelog"), cursor, cursor + limit - 1)]
        return ids, cursor + len(ids)

    def done_log_length(self) -> int:
        """Entries in the done log so far (the cursor :meth:`done_since` would return at its end)."""
        return int(self.client.llen(self.key("donelog")))

    def counts(self) -> dict[str, dict[str, int]]:
        """model -> outcome -> runs done (plus ``_failed``, ``_executions``, ``_attempts``)."""
        out: dict[str, dict[str, int]] = {}
        for k, v in self.client.hgetall(self.key("counts")).items():
            model, _, outcome = _s(k).rpartition("|")
            out.setdefault(model, {})[outcome] = int(v)
        return out

    def running(self) -> dict[str, str]:
        """run_id -> model of every claimed, unfinished run."""
        return {_s(k): _s(v) for k, v in self.client.hgetall(self.key("running")).items()}

    def running_by_model(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in self.client.hvals(self.key("running")):
            out[_s(v)] = out.get(_s(v), 0) + 1
        return out

    # ----- dispatch bookkeeping (orchestrator side) ------------------------------------------------
    def record_dispatch(self, run_ids: Iterable[str]) -> None:
        ids = list(run_ids)
        if ids:
            now = self.now_s()
            self.client.zadd(self.key("queued"), {r: now for r in ids})

    def queued(self) -> dict[str, float]:
        """run_id -> dispatch time (Redis seconds) of every published, unclaimed run."""
        # withscores: (member, score) pairs, the scores cast by float
        scored = cast("list[tuple[bytes | str, float]]", self.client.zrange(self.key("queued"), 0, -1, withscores=True))
        return {_s(m): float(s) for m, s in scored}

    def next_due_in_s(self) -> float | None:
        """Seconds until the earliest deferred run is due (<= 0: due now), None if none."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(self.key("delayed"), 0, 0, withscores=True)
        pipe.time()
        first, (sec, usec) = pipe.execute()
        if not first:
            return None
        return float(first[0][1]) - (float(sec) + float(usec) / 1e6)

    def delayed_count(self) -> int:
        return int(self.client.zcard(self.key("delayed")))

    def pop_due(self, limit: int, ahead_s: float = 0.0) -> dict[str, float]:
        """Move up to ``limit`` deferred runs due within ``ahead_s`` to ``queued``; returns
        run_id -> seconds until due (<= 0: overdue), to publish with that countdown."""
        res = self._pop_due(keys=[self.base], args=[int(limit), max(ahead_s, 0.0)])
        return {_s(res[i]): float(res[i + 1]) for i in range(0, len(res), 2)}

    def lost_running(self, run_ids: Iterable[str]) -> dict[str, int]:
        """Of ``run_ids`` (running), those whose claim expired: run_id -> failure count."""
        ids = list(run_ids)
        if not ids:
            return {}
        res = self._lost(keys=[self.base], args=ids)
        return {_s(res[i]): int(res[i + 1]) for i in range(0, len(res), 2)}

    def failures(self, run_id: str) -> tuple[int, str | None]:
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(self.key("fails"), run_id)
        pipe.hget(self.key("fail_text"), run_id)
        n, text = pipe.execute()
        return (int(n) if n is not None else 0), (None if text is None else _s(text))

    def known(self, run_ids: Iterable[str], chunk: int = 5000) -> set[str]:
        """Of ``run_ids``, those Redis knows (queued, running, delayed or done; pipelined in
        chunks of ``chunk`` runs)."""
        ids = list(run_ids)
        out: set[str] = set()
        for start in range(0, len(ids), chunk):
            part = ids[start : start + chunk]
            pipe = self.client.pipeline(transaction=False)
            for r in part:
                pipe.zscore(self.key("queued"), r)
                pipe.hexists(self.key("running"), r)
                pipe.zscore(self.key("delayed"), r)
                pipe.exists(self.key(f"done:{r}"))
            res = pipe.execute()
            out |= {r for i, r in enumerate(part) if any(res[4 * i : 4 * i + 4])}
        return out

    def outstanding(self) -> int:
        """Published or executing, unfinished runs (what the broker and workers hold)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.key("queued"))
        pipe.hlen(self.key("running"))
        q, r = pipe.execute()
        return int(q) + int(r)

    # ----- cancel ----------------------------------------------------------------------------------
    def cancel(self, reason: str) -> None:
        self.client.set(self.key("cancel"), reason or "cancelled")

    def cancel_reason(self) -> str | None:
        v = self.client.get(self.key("cancel"))
        return None if v is None else _s(v)

    def clear_cancel(self) -> None:
        self.client.delete(self.key("cancel"))

    def reopen_disabled(self, models: Iterable[str]) -> None:
        """Open those of ``models`` closed as 'disabled' (a streak of disabling outcomes), and
        drop their streaks; other closures (retired, unavailable) stay."""
        for model in models:
            reason = self.client.hget(self.key("gate"), model)
            if reason is not None and _s(reason).startswith("disabled"):
                self.client.hdel(self.key("gate"), model)
                self.client.hdel(self.key("streak"), model)
