"""Per-campaign coordination state in Redis, shared by the orchestrator and every worker.

Keys (one hash tag per campaign, so a cluster keeps them on one slot), ``P = {prefix}:{<campaign>}``:

* ``P:planned``     HASH model -> planned runs (written by the orchestrator)
* ``P:counts``      HASH ``<model>|<outcome>`` -> runs done, ``<model>|_failed``, and
  ``<model>|_executions`` / ``<model>|_attempts`` (every stored execution, duplicates included)
* ``P:done:<run>``  STRING outcome: the run's record is durable (set only AFTER the write)
* ``P:donelog``     LIST run_ids in the order they were first marked done (and re-announced by
  a claim that finds them done): the orchestrator reads it with a cursor, so completion costs
  O(runs finished since its last look), never a scan of the store
* ``P:bydispatch``  HASH ``<dispatch>|<outcome>`` -> runs first marked done for the messages of
  one orchestrator run (its dispatch token): what that run executed, apart from another's
* ``P:claim:<run>`` STRING owner, with a TTL renewed by the executing worker's heartbeat:
  at most one live execution per run (a duplicate delivery sees it and steps aside)
* ``P:queued``      ZSET run_id -> dispatch time: published to the broker, not yet claimed
* ``P:running``     HASH run_id -> model: claimed (the claim key says whether its worker lives)
* ``P:delayed``     ZSET run_id -> due time: deferred (rate limit, cooldown, a task failure); the
  orchestrator moves due runs back to the broker (:meth:`DelayedRuns.pop_due`). Deferred runs
  are never parked as countdown messages inside a worker that can die.
* ``P:fails``       HASH run_id -> task failures and worker deaths; ``P:fail_text`` the last
  failure's text (poison runs end after N, ``orchestrator``'s ``max_task_failures``)
* ``P:cancel``      STRING reason: the campaign is cancelled
* ``P:gate`` / ``P:streak`` HASH model -> closed reason / consecutive disabling outcomes
  (``workers.state.gate``)
* ``P:spend``       HASH the spend cap's caps, prices, spent and reserved amounts, closed scopes
  (``workers.state.spend_counters``)

:class:`CampaignState` is the campaign's view, one object per concern over those keys:
``claims`` (``run_claims.RunClaims``: claim, renew, defer, running runs, dead claims, failure
counts), ``queued`` and ``delayed`` (``run_queues``: published and deferred runs), ``done``
(``done_runs.DoneRuns``: done markers, the done log, counts, the plan) and ``flags``
(``gate_flags.GateFlags``: the cancel flag and closed models) and ``spend``
(``spend_counters.SpendCounters``: the spend cap). The scripts are
``campaign_lua``'s.

Every time is Redis ``TIME`` (inside scripts), so machines' clocks never matter. Redis is a
cache of progress, not the truth: the Parquet store says which runs have a record, and the
orchestrator rebuilds everything else from the plan (e.g. after a Redis restart).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis

from workers.state import campaign_lua as lua
from workers.state.campaign_keys import CampaignKeys, as_text
from workers.state.done_runs import DoneRuns
from workers.state.gate_flags import GateFlags
from workers.state.run_claims import RunClaims
from workers.state.run_queues import DelayedRuns, QueuedRuns
from workers.state.spend_counters import SpendCounters


class CampaignState:
    """Sync view of one campaign's keys: the sub-objects ``claims``, ``queued``, ``delayed``,
    ``done`` and ``flags`` (see the module docstring), and the questions over several of them.
    ``client``: a ``redis.Redis`` (pooled, thread-safe)."""

    @staticmethod
    def finish_scripts(client: redis.Redis) -> list[Any]:
        """The scripts of ``DoneRuns.mark_call`` and ``RunClaims.defer_call``, registered on
        ``client`` (for a caller batching them with others: ``workers.state.script_batch``)."""
        return [client.register_script(lua.DONE), client.register_script(lua.DEFER)]

    def __init__(self, client: redis.Redis, campaign: str, *, prefix: str = "irbench:camp") -> None:
        self.client = client
        self.campaign = campaign
        self.base = f"{prefix}:{{{campaign}}}"
        self._keys = keys = CampaignKeys(client, self.base)
        self.claims = RunClaims(keys)
        self.queued = QueuedRuns(keys)
        self.delayed = DelayedRuns(keys)
        self.done = DoneRuns(keys)
        self.flags = GateFlags(keys)
        self.spend = SpendCounters(keys)

    def key(self, name: str) -> str:
        """The key ``P:<name>`` (see the module docstring for the names)."""
        return self._keys.key(name)

    def now_s(self) -> float:
        """Redis's clock in seconds (the clock every score here is on)."""
        return self._keys.now_s()

    def server_run_id(self) -> str:
        """The Redis server's run id: a new one after a restart (the state may be older then)."""
        return str(self.client.info("server").get("run_id", ""))

    def known(self, run_ids: Iterable[str], chunk: int = 5000) -> set[str]:
        """Of ``run_ids``, those Redis knows (queued, running, delayed or done).

        Read from Redis's side, so the cost is what Redis holds, not ``run_ids``: the queued,
        running and delayed runs (the outstanding window), then the done log in chunks of
        ``chunk`` entries, whose ids among ``run_ids`` are checked for their done marker (every
        marker is set by the DONE script, which logs its run; a marker undone stays logged).
        A fresh campaign costs four commands however many runs it plans."""
        wanted = run_ids if isinstance(run_ids, (set, frozenset, dict)) else set(run_ids)
        client = self.client
        pipe = client.pipeline(transaction=False)
        pipe.zrange(self.key("queued"), 0, -1)
        pipe.hkeys(self.key("running"))
        pipe.zrange(self.key("delayed"), 0, -1)
        pipe.llen(self.key("donelog"))
        queued, running, delayed, logged = pipe.execute()
        out = {r for r in (as_text(x) for x in [*queued, *running, *delayed]) if r in wanted}
        for start in range(0, int(logged), chunk):
            ids = {as_text(x) for x in client.lrange(self.key("donelog"), start, start + chunk - 1)}
            candidates = [r for r in ids if r in wanted and r not in out]
            if candidates:
                check = client.pipeline(transaction=False)
                for r in candidates:
                    check.exists(self.key(f"done:{r}"))
                out |= {r for r, hit in zip(candidates, check.execute()) if hit}
        return out

    def outstanding(self) -> int:
        """Published or executing, unfinished runs (what the broker and workers hold)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.key("queued"))
        pipe.hlen(self.key("running"))
        q, r = pipe.execute()
        return int(q) + int(r)
