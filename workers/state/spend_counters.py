"""The spend cap in Redis, shared by every worker of a campaign (the twin of
``workers.spend.MemorySpendMeter``; that module says what is reserved and settled).

One HASH per campaign, ``P:spend``, written whole by the orchestrator when the campaign starts
(:meth:`SpendCounters.configure`: the caps, the prices per token, what the store already holds,
nothing reserved) and then changed only by two scripts, each one atomic step:

* ``cap:tok:<s>`` / ``cap:usd:<s>``: the caps of scope ``s`` (``*`` the campaign, else a model id)
* ``pin:<model>`` / ``pout:<model>``: US dollars per prompt / completion token
* ``spent:tok:<s>`` / ``spent:usd:<s>``: settled spend; ``held:tok:<s>`` / ``held:usd:<s>``: reserved
* ``closed:<s>``: the reason the scope stopped (a refused reservation); every later reservation
  of the scope is refused with it

RESERVE checks and adds in one script, so two workers can never both take the last room under
a cap; SETTLE turns a reservation into the usage the provider reported. A worker that dies with
a reservation leaves it held (the cap then stops early, never late) until the next ``irbench
run`` rewrites the hash from the store.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from workers.runtask import RunTask
from workers.spend import CAMPAIGN_SCOPE, SPEND_CAP_REASON, Reservation, SpendPlan, Spent
from workers.state.campaign_keys import CampaignKeys, as_text

log = structlog.get_logger("irbench.spend")

ALL = "*"  # the campaign scope's name in the hash (no model id can be "*")

# KEYS[1] = P. ARGV: campaign, model, prompt tokens, completion tokens.
# -> {'ok', reserved usd} or {'no', reason}
RESERVE = f"""
local h = KEYS[1] .. ':spend'
local m = ARGV[2]
local p, c = tonumber(ARGV[3]), tonumber(ARGV[4])
local function num(f) return tonumber(redis.call('HGET', h, f) or '0') end
local tok, usd = p + c, p * num('pin:' .. m) + c * num('pout:' .. m)
local scopes = {{'{ALL}', m}}
for _, s in ipairs(scopes) do
  local closed = redis.call('HGET', h, 'closed:' .. s)
  if closed then return {{'no', closed}} end
end
local function whose(s) if s == '{ALL}' then return 'campaign ' .. ARGV[1] end return 'model ' .. s end
local function over(s, unit, what, amount)
  local cap = redis.call('HGET', h, 'cap:' .. unit .. ':' .. s)
  if not cap then return nil end
  local spent, held = num('spent:' .. unit .. ':' .. s), num('held:' .. unit .. ':' .. s)
  if spent + held + amount <= tonumber(cap) then return nil end
  return string.format('{SPEND_CAP_REASON}: %s %s of %s (spent %.6g, in flight %.6g); raise it and run again to resume',
                       what, cap, whose(s), spent, held)
end
for _, s in ipairs(scopes) do
  local reason = over(s, 'tok', 'max_total_tokens', tok) or over(s, 'usd', 'max_cost_usd', usd)
  if reason then
    redis.call('HSETNX', h, 'closed:' .. s, reason)
    return {{'no', redis.call('HGET', h, 'closed:' .. s)}}
  end
end
for _, s in ipairs(scopes) do
  if redis.call('HEXISTS', h, 'cap:tok:' .. s) == 1 or redis.call('HEXISTS', h, 'cap:usd:' .. s) == 1 then
    redis.call('HINCRBY', h, 'held:tok:' .. s, tok)
    redis.call('HINCRBYFLOAT', h, 'held:usd:' .. s, string.format('%.17g', usd))
  end
end
return {{'ok', string.format('%.17g', usd)}}
"""

# KEYS[1] = P. ARGV: model, reserved tokens, reserved usd, prompt tokens, completion tokens.
SETTLE = f"""
local h = KEYS[1] .. ':spend'
local m = ARGV[1]
local p, c = tonumber(ARGV[4]), tonumber(ARGV[5])
local function num(f) return tonumber(redis.call('HGET', h, f) or '0') end
local usd = p * num('pin:' .. m) + c * num('pout:' .. m)
for _, s in ipairs({{'{ALL}', m}}) do
  if redis.call('HEXISTS', h, 'cap:tok:' .. s) == 1 or redis.call('HEXISTS', h, 'cap:usd:' .. s) == 1 then
    -- never below zero: the hash may have been rewritten while this call was in flight
    redis.call('HSET', h, 'held:tok:' .. s, math.max(num('held:tok:' .. s) - tonumber(ARGV[2]), 0))
    redis.call('HSET', h, 'held:usd:' .. s, string.format('%.17g', math.max(num('held:usd:' .. s) - tonumber(ARGV[3]), 0)))
    redis.call('HINCRBY', h, 'spent:tok:' .. s, p + c)
    redis.call('HINCRBYFLOAT', h, 'spent:usd:' .. s, string.format('%.17g', usd))
  end
end
return 1
"""


def _scope(scope: str) -> str:
    return ALL if scope == CAMPAIGN_SCOPE else scope


class SpendCounters:
    """The orchestrator's side of ``P:spend``: write it for a run, read what closed."""

    def __init__(self, keys: CampaignKeys) -> None:
        self._keys = keys

    @property
    def key(self) -> str:
        return self._keys.key("spend")

    def configure(self, plan: SpendPlan) -> None:
        """Start the campaign's spend from ``plan`` (caps, prices, stored spend; nothing held,
        nothing closed). Without caps the hash is only removed."""
        fields: dict[Any, Any] = {}  # redis-py types its mapping keys invariantly
        for scope, cap in plan.caps.items():
            s = _scope(scope)
            if cap.max_total_tokens is not None:
                fields[f"cap:tok:{s}"] = cap.max_total_tokens
            if cap.max_cost_usd is not None:
                fields[f"cap:usd:{s}"] = repr(cap.max_cost_usd)
            spent = plan.spent.get(scope, Spent())
            fields[f"spent:tok:{s}"], fields[f"spent:usd:{s}"] = spent.tokens, repr(spent.cost_usd)
        for model, price in plan.prices.items():
            fields[f"pin:{model}"], fields[f"pout:{model}"] = repr(price.prompt), repr(price.completion)
        pipe = self._keys.client.pipeline(transaction=True)
        pipe.delete(self.key)
        if plan.capped:
            pipe.hset(self.key, mapping=fields)
        pipe.execute()

    def closed(self) -> dict[str, str]:
        """Scope (``workers.spend.CAMPAIGN_SCOPE`` or a model id) -> reason, of the closed scopes."""
        out = {}
        for k, v in self._keys.client.hgetall(self.key).items():
            name = as_text(k)
            if name.startswith("closed:"):
                scope = name[len("closed:"):]
                out[CAMPAIGN_SCOPE if scope == ALL else scope] = as_text(v)
        return out

    def spent(self, scope: str = CAMPAIGN_SCOPE) -> Spent:
        """The settled spend of ``scope`` (zero when it is not capped)."""
        s = _scope(scope)
        tok, usd = self._keys.client.hmget(self.key, [f"spent:tok:{s}", f"spent:usd:{s}"])
        return Spent(int(tok or 0), float(usd or 0.0))


class RedisSpendMeter:
    """A worker's ``SpendMeter`` over ``P:spend`` (``base`` = ``P``), on its async client."""

    def __init__(self, base: str, client: aioredis.Redis) -> None:
        self._base = base
        self._reserve = client.register_script(RESERVE)
        self._settle = client.register_script(SETTLE)

    async def reserve(self, task: RunTask, prompt_tokens: int, completion_tokens: int) -> Reservation | str:
        status, value = await self._reserve(keys=[self._base],
                                            args=[task.campaign, task.model, prompt_tokens, completion_tokens])
        if as_text(status) != "ok":
            return as_text(value)
        return Reservation(task.model, Spent(prompt_tokens + completion_tokens, float(as_text(value))))

    async def settle(self, reservation: Reservation, prompt_tokens: int, completion_tokens: int) -> None:
        """Never raises for Redis: the call was made and its record must be stored; a lost
        settle leaves the reservation held, so the cap stops early, never late."""
        amount = reservation.amount
        try:
            await self._settle(keys=[self._base], args=[reservation.model, amount.tokens, repr(amount.cost_usd),
                                                          prompt_tokens, completion_tokens])
        except RedisError as exc:
            log.warning("spend_settle_lost", model=reservation.model, error=str(exc))
