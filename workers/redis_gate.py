"""``ModelGate`` shared by every worker of a campaign, in Redis (the twin of ``workers.gate.MemoryGate``).

A 410 retires the model for the campaign on every worker; ``disable_after_consecutive``
auth/not-found/client errors in a row (counted across workers) disable it; ``cancel_all`` closes
every model (``irbench cancel``). Keys live under the campaign (``workers.campaign_state``):
``P:gate`` HASH model -> reason, ``P:streak`` HASH model -> count, ``P:cancel`` STRING reason.

The methods are synchronous because ``execute_run`` calls them synchronously; each is one
round trip on a sync client with short socket timeouts. ``closed_reason`` lets a Redis error
propagate (the caller defers the run: an unknown gate must not be read as "open"), while
``observe`` retries briefly and then logs, since losing a streak increment only delays a disable.
"""

from __future__ import annotations

import time

import redis
import structlog
from redis.exceptions import RedisError

from storage.records import Outcome
from workers.campaign_state import CampaignState
from workers.retry import DISABLING

log = structlog.get_logger("irbench.gate")


class RedisGate:
    """Gate of one campaign. ``observe_retries``/``observe_backoff_s``: best-effort persistence."""

    def __init__(
        self,
        state: CampaignState,
        *,
        disable_after_consecutive: int = 3,
        observe_retries: int = 3,
        observe_backoff_s: float = 0.1,
    ) -> None:
        self._state = state
        self._client: redis.Redis = state.client
        self._limit = disable_after_consecutive
        self._retries = observe_retries
        self._backoff_s = observe_backoff_s

    def closed_reason(self, model: str) -> str | None:
        pipe = self._client.pipeline(transaction=False)
        pipe.get(self._state.key("cancel"))
        pipe.hget(self._state.key("gate"), model)
        cancel, closed = pipe.execute()
        value = cancel if cancel is not None else closed
        return None if value is None else (value.decode() if isinstance(value, bytes) else str(value))

    def _observe_once(self, model: str, outcome: Outcome, detail: str | None) -> None:
        gate, streak = self._state.key("gate"), self._state.key("streak")
        if outcome is Outcome.RETIRED:
            self._client.hsetnx(gate, model, "retired" + (f": {detail}" if detail else ""))
        elif outcome in DISABLING:
            n = int(self._client.hincrby(streak, model, 1))
            if n >= self._limit:
                self._client.hsetnx(
                    gate,
                    model,
                    f"disabled after {n} consecutive {outcome.value} outcomes" + (f" (last: {detail})" if detail else ""),
                )
        else:
            self._client.hdel(streak, model)

    def observe(self, model: str, outcome: Outcome, detail: str | None = None) -> None:
        for i in range(self._retries):
            try:
                self._observe_once(model, outcome, detail)
                return
            except RedisError as exc:
                if i + 1 == self._retries:
                    log.warning("gate_observe_lost", model=model, outcome=outcome.value, error=str(exc))
                    return
                time.sleep(self._backoff_s * (2**i))

    def cancel_all(self, reason: str) -> None:
        self._state.cancel(reason)

    def reopen(self, model: str) -> None:
        """Undo a retirement/disable for this campaign (operator decision)."""
        pipe = self._client.pipeline(transaction=True)
        pipe.hdel(self._state.key("gate"), model)
        pipe.hdel(self._state.key("streak"), model)
        pipe.execute()
