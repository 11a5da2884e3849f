"""Claims of a campaign's runs: who executes a run now, and what became of runs whose worker went.

Keys under the campaign's base ``P`` (``workers.state.campaign_state`` lists them all):
``P:claim:<run>`` (owner, with a TTL the executing worker's heartbeat renews), ``P:running``
(run_id -> model of claimed runs), ``P:fails`` / ``P:fail_text`` (task failures and worker
deaths, and the last one's text). A deferral drops the claim and parks the run in ``P:delayed``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from workers.state import campaign_lua as lua
from workers.state.campaign_keys import Call, CampaignKeys, as_text, ttl_ms

CLAIMED, DONE, BUSY = "ok", "done", "busy"

#: The claim script's Lua source (KEYS[1] = the campaign's base key; ARGV: :func:`claim_args`),
#: for a script that claims and does more in the same call (``workers.state.claim_permit``).
CLAIM_LUA = lua.CLAIM


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


def claim_args(run_id: str, model: str, owner: str, ttl_s: float) -> list[Any]:
    """ARGV of a gate-reading claim of ``run_id`` by ``owner`` for ``ttl_s`` seconds."""
    return [run_id, model, owner, ttl_ms(ttl_s), "1"]


def parse_claim(reply: Any) -> tuple[str, GateView | None]:
    """A gate-reading claim's reply: ``DONE``/``BUSY`` with no view, or ``CLAIMED`` and the view."""
    if not isinstance(reply, list):
        return as_text(reply), None
    cancel, gate, streak = (None if as_text(v) == "-" else as_text(v)[1:] for v in reply[1:4])
    return as_text(reply[0]), GateView(cancel, gate, streak is not None and int(streak) > 0)


class RunClaims:
    """Claim, renew and defer a run (worker side); running runs, dead claims and failure counts
    (orchestrator side)."""

    def __init__(self, keys: CampaignKeys) -> None:
        self._keys = keys
        client = keys.client
        self._claim = client.register_script(lua.CLAIM)
        self._renew = client.register_script(lua.RENEW)
        self._defer = client.register_script(lua.DEFER)
        self._lost = client.register_script(lua.LOST)

    def claim(self, run_id: str, model: str, owner: str, ttl_s: float) -> str:
        """``CLAIMED`` (execute it), ``DONE`` (already stored) or ``BUSY`` (live elsewhere)."""
        return as_text(self._claim(keys=[self._keys.base], args=[run_id, model, owner, ttl_ms(ttl_s), "0"]))

    def claim_with_gate(self, run_id: str, model: str, owner: str, ttl_s: float) -> tuple[str, GateView | None]:
        """:meth:`claim`, plus (when ``CLAIMED``) the model's gate as read in the same script."""
        return parse_claim(self._claim(keys=[self._keys.base], args=claim_args(run_id, model, owner, ttl_s)))

    def renew(self, run_id: str, owner: str, ttl_s: float) -> bool:
        """Extend ``owner``'s claim of ``run_id`` to ``ttl_s`` seconds; False if it is lost."""
        script, keys, args = self.renew_call(run_id, owner, ttl_s)
        return int(script(keys=keys, args=args)) == 1

    def renew_call(self, run_id: str, owner: str, ttl_s: float) -> Call:
        """The script, KEYS and ARGV :meth:`renew` runs; its reply is 1 if still ours."""
        return self._renew, [self._keys.base], [run_id, owner, ttl_ms(ttl_s)]

    def defer(self, run_id: str, owner: str, defer_s: float, failure: str = "") -> int:
        """Release our claim and park the run for ``defer_s``; ``failure`` (text) also counts a
        task failure. Returns the run's failure count."""
        script, keys, args = self.defer_call(run_id, owner, defer_s, failure)
        return int(script(keys=keys, args=args))

    def defer_call(self, run_id: str, owner: str, defer_s: float, failure: str = "") -> Call:
        """The script, KEYS and ARGV :meth:`defer` runs (to pipeline it); its reply is the run's
        failure count."""
        return self._defer, [self._keys.base], [run_id, owner, max(defer_s, 0.0), failure]

    def running(self) -> dict[str, str]:
        """run_id -> model of every claimed, unfinished run."""
        return {as_text(k): as_text(v) for k, v in self._keys.client.hgetall(self._keys.key("running")).items()}

    def running_by_model(self) -> dict[str, int]:
        """model -> claimed, unfinished runs."""
        out: dict[str, int] = {}
        for v in self._keys.client.hvals(self._keys.key("running")):
            out[as_text(v)] = out.get(as_text(v), 0) + 1
        return out

    def lost(self, run_ids: Iterable[str]) -> dict[str, int]:
        """Of ``run_ids`` (running), those whose claim expired: run_id -> failure count."""
        ids = list(run_ids)
        if not ids:
            return {}
        res = self._lost(keys=[self._keys.base], args=ids)
        return {as_text(res[i]): int(res[i + 1]) for i in range(0, len(res), 2)}

    def failures(self, run_id: str) -> tuple[int, str | None]:
        """The run's task failures and worker deaths so far, and the last one's text."""
        keys = self._keys
        pipe = keys.client.pipeline(transaction=False)
        pipe.hget(keys.key("fails"), run_id)
        pipe.hget(keys.key("fail_text"), run_id)
        n, text = pipe.execute()
        return (int(n) if n is not None else 0), (None if text is None else as_text(text))
