"""Which runs of a campaign are durable, in what order they became so, and the counts.

Keys under the campaign's base ``P`` (``workers.state.campaign_state`` lists them all):
``P:done:<run>`` (outcome; set only AFTER the record's write), ``P:donelog`` (run_ids in the
order first marked done, and re-announced by a claim that finds them done), ``P:counts``
(``<model>|<outcome>`` -> runs, plus the meta fields below) and ``P:planned`` (model -> runs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from workers.state import campaign_lua as lua
from workers.state.campaign_keys import Call, CampaignKeys, as_text

FAILED_FIELD = "_failed"
EXECUTIONS_FIELD = "_executions"
ATTEMPTS_FIELD = "_attempts"
META_FIELDS = (FAILED_FIELD, EXECUTIONS_FIELD, ATTEMPTS_FIELD)

#: (run_id, model) pairs per script call (bounded script arguments)
_CHUNK = 500


class DoneRuns:
    """Done markers (worker side: :meth:`mark`), the done log read from a cursor (orchestrator
    side: :meth:`since`), the per-model counts and the plan they are counted against."""

    def __init__(self, keys: CampaignKeys) -> None:
        self._keys = keys
        self._done = keys.client.register_script(lua.DONE)
        self._reopen = keys.client.register_script(lua.REOPEN)

    def set_planned(self, totals: Mapping[str, int]) -> None:
        """The plan: model -> planned runs (replaces the last one)."""
        keys = self._keys
        pipe = keys.client.pipeline(transaction=True)
        pipe.delete(keys.key("planned"))
        if totals:
            pipe.hset(keys.key("planned"), mapping={m: int(n) for m, n in totals.items()})
        pipe.execute()

    def planned(self) -> dict[str, int]:
        """model -> planned runs, as :meth:`set_planned` wrote it."""
        return {as_text(k): int(v) for k, v in self._keys.client.hgetall(self._keys.key("planned")).items()}

    def mark(self, run_id: str, model: str, outcome: str, failed: bool, attempts: int = 0, dispatch: str = "") -> bool:
        """Record that an execution of ``run_id`` is durable; True the first time only."""
        script, keys, args = self.mark_call(run_id, model, outcome, failed, attempts, dispatch)
        return int(script(keys=keys, args=args)) == 1

    def mark_call(self, run_id: str, model: str, outcome: str, failed: bool, attempts: int = 0,
                  dispatch: str = "") -> Call:
        """The script, KEYS and ARGV :meth:`mark` runs (to pipeline it with other calls);
        its reply is 1 if the run is newly done. ``dispatch``: the token of the orchestrator run
        whose message this execution came from; a newly done run counts for it (:meth:`by_dispatch`)."""
        return self._done, [self._keys.base], [run_id, model, outcome, "1" if failed else "0", int(attempts), dispatch]

    def by_dispatch(self, dispatch: str) -> dict[str, int]:
        """outcome -> runs first marked done for the messages of ``dispatch`` (an orchestrator run)."""
        head = f"{dispatch}|"
        raw = self._keys.client.hgetall(self._keys.key("bydispatch"))
        return {k[len(head):]: int(v) for k, v in ((as_text(k), v) for k, v in raw.items()) if k.startswith(head)}

    def is_done(self, run_id: str) -> bool:
        """Whether ``run_id`` has a done marker."""
        return bool(self._keys.client.exists(self._keys.key(f"done:{run_id}")))

    def among(self, run_ids: Iterable[str]) -> set[str]:
        """The subset of ``run_ids`` with a done marker (pipelined)."""
        ids = list(run_ids)
        pipe = self._keys.client.pipeline(transaction=False)
        for r in ids:
            pipe.exists(self._keys.key(f"done:{r}"))
        return {r for r, e in zip(ids, pipe.execute()) if e}

    def undo(self, run_ids: Iterable[str]) -> None:
        """Forget done markers whose records are not in the store (lost): the runs go again."""
        ids = list(run_ids)
        if ids:
            self._keys.client.delete(*(self._keys.key(f"done:{r}") for r in ids))

    def reopen(self, runs: Mapping[str, str]) -> int:
        """Make ``runs`` (run_id -> model) executable again (``--retry-failed``): their done
        markers and counts are dropped, so claims do not see them done. Returns markers removed."""
        items = list(runs.items())
        removed = 0
        for i in range(0, len(items), _CHUNK):
            args = [x for pair in items[i : i + _CHUNK] for x in pair]
            removed += int(self._reopen(keys=[self._keys.base], args=args))
        return removed

    def since(self, cursor: int, limit: int = 10_000) -> tuple[list[str], int]:
        """run_ids announced done after position ``cursor`` of the done log, and the new cursor.
        A log shorter than the cursor (Redis lost its tail in a restart) restarts from 0."""
        client, log_key = self._keys.client, self._keys.key("donelog")
        n = int(client.llen(log_key))
        if n < cursor:
            cursor = 0
        ids = [as_text(x) for x in client.lrange(log_key, cursor, cursor + limit - 1)]
        return ids, cursor + len(ids)

    def log_length(self) -> int:
        """Entries in the done log so far (the cursor :meth:`since` returns at its end)."""
        return int(self._keys.client.llen(self._keys.key("donelog")))

    def counts(self) -> dict[str, dict[str, int]]:
        """model -> outcome -> runs done (plus ``_failed``, ``_executions``, ``_attempts``)."""
        out: dict[str, dict[str, int]] = {}
        for k, v in self._keys.client.hgetall(self._keys.key("counts")).items():
            model, _, outcome = as_text(k).rpartition("|")
            out.setdefault(model, {})[outcome] = int(v)
        return out
