"""What closes a campaign's runs before their call: the cancel flag (``P:cancel``, every model)
and per-model closures (``P:gate`` model -> reason, ``P:streak`` model -> consecutive disabling
outcomes). ``workers.state.gate.RedisGate`` is the workers' gate over the same keys, which it
takes from here."""

from __future__ import annotations

from collections.abc import Iterable

from workers.state.campaign_keys import CampaignKeys, as_text


class GateFlags:
    """The campaign's cancel flag and its closed models, for the orchestrator and the CLI."""

    def __init__(self, keys: CampaignKeys) -> None:
        self._keys = keys

    @property
    def cancel_key(self) -> str:
        """``P:cancel``: STRING, the cancel reason."""
        return self._keys.key("cancel")

    @property
    def gate_key(self) -> str:
        """``P:gate``: HASH model -> the reason it is closed."""
        return self._keys.key("gate")

    @property
    def streak_key(self) -> str:
        """``P:streak``: HASH model -> consecutive disabling outcomes."""
        return self._keys.key("streak")

    def cancel(self, reason: str) -> None:
        """Cancel the campaign: every run a worker picks up from now on is recorded cancelled."""
        self._keys.client.set(self.cancel_key, reason or "cancelled")

    def cancel_reason(self) -> str | None:
        """The cancel reason, None when the campaign is not cancelled."""
        v = self._keys.client.get(self.cancel_key)
        return None if v is None else as_text(v)

    def clear_cancel(self) -> None:
        """Lift the cancel flag (a retry of the campaign's runs)."""
        self._keys.client.delete(self.cancel_key)

    def closed_models(self) -> dict[str, str]:
        """model -> reason of every closed model (retired, disabled, unavailable)."""
        return {as_text(k): as_text(v) for k, v in self._keys.client.hgetall(self.gate_key).items()}

    def close(self, model: str, reason: str) -> None:
        """Close ``model`` for the campaign; a reason already set is kept."""
        self._keys.client.hsetnx(self.gate_key, model, reason)

    def open(self, model: str) -> None:
        """Open ``model`` again (its streak, if any, stays)."""
        self._keys.client.hdel(self.gate_key, model)

    def reopen_disabled(self, models: Iterable[str]) -> None:
        """Open those of ``models`` closed as 'disabled' (a streak of disabling outcomes), and
        drop their streaks; other closures (retired, unavailable) stay."""
        client, gate, streak = self._keys.client, self.gate_key, self.streak_key
        for model in models:
            reason = client.hget(gate, model)
            if reason is not None and as_text(reason).startswith("disabled"):
                client.hdel(gate, model)
                client.hdel(streak, model)
