"""The spend cap: a campaign (or one model) stops calling before its tokens or cost pass a cap.

Each attempt reserves an upper bound of what it can spend before its permit is asked for — its
prompt tokens estimated as characters ÷ ``chars_per_token`` (the count the simulator reports;
a model's own tokenizer may count more) plus ``max_tokens`` (or ``assumed_completion_tokens``
when the model has no cap) — and settles to the usage the provider reported once it ended (an
attempt that failed without a usage report settles to zero: the store counts it so). A
reservation that would take spent + reserved past a cap is refused and closes the cap's scope
for good: that call and every later one of the scope end ``cancelled`` with the reason, never
sent. So a cap is passed only by what calls already reserved spend beyond their bound: nothing
when every reply's usage stays within its reservation, otherwise at most the sum over the calls
in flight of (actual − reserved).

``MemorySpendMeter`` serves the local executor; ``workers.state.spend_counters`` is the Redis
twin the workers share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from workers.runtask import RunTask

#: Every cancel reason written by a spend cap starts so (the CLI and the dispatcher look for it).
SPEND_CAP_REASON = "spend cap reached"
CAMPAIGN_SCOPE = ""  # the key of the campaign-wide cap in ``SpendPlan.caps``


@dataclass(frozen=True)
class SpendCap:
    """A cap on tokens (prompt + completion) and/or on cost in US dollars (None: no cap)."""

    max_total_tokens: int | None = None
    max_cost_usd: float | None = None

    @property
    def capped(self) -> bool:
        return self.max_total_tokens is not None or self.max_cost_usd is not None


@dataclass(frozen=True)
class Spent:
    """Tokens and dollars (spent, or reserved)."""

    tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: Spent) -> Spent:
        return Spent(self.tokens + other.tokens, self.cost_usd + other.cost_usd)

    def __sub__(self, other: Spent) -> Spent:
        return Spent(self.tokens - other.tokens, self.cost_usd - other.cost_usd)


@dataclass(frozen=True)
class UsdPerToken:
    """A model's price in US dollars per prompt and per completion token (0 when not given:
    a cost cap requires prices, ``orchestrator.campaign.spend_cap`` checks it)."""

    prompt: float = 0.0
    completion: float = 0.0

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return prompt_tokens * self.prompt + completion_tokens * self.completion


@dataclass(frozen=True)
class SpendPlan:
    """The caps of one campaign run: ``caps`` scope -> cap (``CAMPAIGN_SCOPE`` for the campaign,
    a model id for one model), ``prices`` model -> price, ``spent`` scope -> what the store
    already holds (the starting point: the same command again picks up where it stopped)."""

    campaign: str
    caps: Mapping[str, SpendCap] = field(default_factory=dict)
    prices: Mapping[str, UsdPerToken] = field(default_factory=dict)
    spent: Mapping[str, Spent] = field(default_factory=dict)

    @property
    def capped(self) -> bool:
        return any(c.capped for c in self.caps.values())

    def scopes(self, model: str) -> tuple[str, ...]:
        """The capped scopes a call of ``model`` counts against."""
        return tuple(s for s in (CAMPAIGN_SCOPE, model) if s in self.caps and self.caps[s].capped)


@dataclass(frozen=True)
class Reservation:
    model: str
    amount: Spent


def reservation_tokens(task: RunTask, chars_per_token: float, assumed_completion_tokens: int) -> tuple[int, int]:
    """(prompt, completion) tokens one attempt of ``task`` is reserved for."""
    prompt = math.ceil(len(task.user_message) / chars_per_token)
    completion = task.max_tokens if task.max_tokens is not None else assumed_completion_tokens
    return prompt, completion


def cap_reason(scope: str, campaign: str, what: str, cap: float, spent: float, held: float) -> str:
    """The cancel reason of a refused reservation, one line."""
    whose = f"campaign {campaign}" if scope == CAMPAIGN_SCOPE else f"model {scope}"
    return (f"{SPEND_CAP_REASON}: {what} {cap:g} of {whose} (spent {spent:g}, in flight {held:g}); "
            f"raise it and run again to resume")


class SpendMeter(Protocol):
    async def reserve(self, task: RunTask, prompt_tokens: int, completion_tokens: int) -> Reservation | str:
        """Reserve this upper bound for one attempt of ``task``, or say why not (the cancel reason)."""
        ...

    async def settle(self, reservation: Reservation, prompt_tokens: int, completion_tokens: int) -> None:
        """The attempt ended having used these tokens: the reservation becomes that spend."""
        ...


class MemorySpendMeter:
    """In-process meter (one event loop: each method runs without a suspension point, so a
    check and its reservation are one step)."""

    def __init__(self, plan: SpendPlan) -> None:
        self._plan = plan
        self._spent: dict[str, Spent] = {s: plan.spent.get(s, Spent()) for s in plan.caps}
        self._held: dict[str, Spent] = {s: Spent() for s in plan.caps}
        self._closed: dict[str, str] = {}

    def closed(self) -> dict[str, str]:
        """scope -> reason of every scope closed so far."""
        return dict(self._closed)

    async def reserve(self, task: RunTask, prompt_tokens: int, completion_tokens: int) -> Reservation | str:
        price = self._plan.prices.get(task.model, UsdPerToken())
        amount = Spent(prompt_tokens + completion_tokens, price.cost(prompt_tokens, completion_tokens))
        scopes = self._plan.scopes(task.model)
        for scope in scopes:
            if scope in self._closed:
                return self._closed[scope]
            reason = self._refusal(scope, amount)
            if reason is not None:
                self._closed[scope] = reason
                return reason
        for scope in scopes:
            self._held[scope] = self._held[scope] + amount
        return Reservation(task.model, amount)

    def _refusal(self, scope: str, amount: Spent) -> str | None:
        cap, spent, held = self._plan.caps[scope], self._spent[scope], self._held[scope]
        campaign = self._plan.campaign
        if cap.max_total_tokens is not None and spent.tokens + held.tokens + amount.tokens > cap.max_total_tokens:
            return cap_reason(scope, campaign, "max_total_tokens", cap.max_total_tokens, spent.tokens, held.tokens)
        if cap.max_cost_usd is not None and spent.cost_usd + held.cost_usd + amount.cost_usd > cap.max_cost_usd:
            return cap_reason(scope, campaign, "max_cost_usd", cap.max_cost_usd, round(spent.cost_usd, 6),
                              round(held.cost_usd, 6))
        return None

    async def settle(self, reservation: Reservation, prompt_tokens: int, completion_tokens: int) -> None:
        price = self._plan.prices.get(reservation.model, UsdPerToken())
        actual = Spent(prompt_tokens + completion_tokens, price.cost(prompt_tokens, completion_tokens))
        for scope in self._plan.scopes(reservation.model):
            self._held[scope] = self._held[scope] - reservation.amount
            self._spent[scope] = self._spent[scope] + actual

    def spent(self, scope: str = CAMPAIGN_SCOPE) -> Spent:
        return self._spent.get(scope, Spent())
