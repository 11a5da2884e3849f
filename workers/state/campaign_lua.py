"""The Lua scripts of a campaign's Redis state (``workers.state.campaign_state`` lists the keys).

Each script takes KEYS[1] = the campaign's base key ``P`` and reads or writes ``P:<name>`` keys
under it. Stored campaigns and running workers depend on these sources as they are: a worker
calls a script by its SHA, so a changed source is a different script to a live server.
"""

from __future__ import annotations

NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) + tonumber(t[2]) / 1e6"

# ARGV: run_id, model, owner, ttl_ms, with_gate. Done -> 'done' (re-announced); a live claim -> 'busy'.
# Claimed -> 'ok', or with_gate = '1': {'ok', cancel, gate, streak} of the run's model ('+value' or '-').
CLAIM = """
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
RENEW = """
local p = KEYS[1]
if redis.call('GET', p .. ':claim:' .. ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('PEXPIRE', p .. ':claim:' .. ARGV[1], ARGV[3])
return 1
"""

# ARGV: run_ids still queued in a live worker's hands (delivered, waiting there for a run slot,
# unclaimed): their queued time is refreshed, so the reconciler does not take them for lost.
REFRESH_QUEUED = f"""
local p = KEYS[1]
{NOW}
for i = 1, #ARGV do redis.call('ZADD', p .. ':queued', 'XX', now, ARGV[i]) end
return #ARGV
"""

# ARGV: run_id, owner, defer_s, failure text ('' = a deferral, not a failure).
# Drops our claim and parks the run in the delayed set, due in defer_s; returns the failure count.
DEFER = f"""
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
  {NOW}
  redis.call('ZADD', p .. ':delayed', now + tonumber(ARGV[3]), ARGV[1])
end
return fails
"""

# ARGV: run_id, model, outcome, failed(0/1), attempts. Returns 1 if newly done.
DONE = """
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
if ARGV[6] and ARGV[6] ~= '' then redis.call('HINCRBY', p .. ':bydispatch', ARGV[6] .. '|' .. ARGV[3], 1) end
return 1
"""

# ARGV: run_id, model, ... Drops done markers and un-counts them (``--retry-failed``); returns
# how many markers were removed.
REOPEN = """
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
POP_DUE = f"""
local p = KEYS[1]
{NOW}
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
LOST = """
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
