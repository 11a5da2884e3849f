-- One admission decision for one model, atomic, on Redis's clock.
-- KEYS[1] lease ZSET (member = holder, score = expiry in us)
-- KEYS[2] state HASH (tat_r, tat_t, ivt, cool, disabled)
-- ARGV[1] holder
-- ARGV[2] concurrency cap (<= 0: unlimited)
-- ARGV[3] request emission interval in us (0: unlimited)
-- ARGV[4] token emission interval in us per token (0: unlimited)
-- ARGV[5] cost in tokens
-- ARGV[6] lease TTL in us
-- Returns {code, wait_us, reason, now_us, detail}
--   code 1 granted, 2 adopted (holder already had a live lease), 0 denied, -1 disabled.
-- Times are returned as integer strings: Lua numbers returned to Redis are truncated to integers.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function us(x) return string.format('%.0f', x) end

local holder = ARGV[1]
local cap = tonumber(ARGV[2])
local ivr = tonumber(ARGV[3])
local ivt = tonumber(ARGV[4])
local cost = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])

local st = redis.call('HMGET', KEYS[2], 'disabled', 'cool', 'tat_r', 'tat_t')
if st[1] then return {-1, '0', 'disabled', us(now), st[1]} end
local cool = tonumber(st[2] or '0')
if cool > now then return {0, us(cool - now), 'cooldown', us(now), ''} end

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], holder) then
  redis.call('ZADD', KEYS[1], now + ttl, holder)
  return {2, '0', 'adopted', us(now), ''}
end
if cap > 0 and redis.call('ZCARD', KEYS[1]) >= cap then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, us(tonumber(first[2]) - now), 'concurrency', us(now), ''}
end

-- GCRA with zero burst tolerance: grant only when TAT is not in the future.
local tat_r = tonumber(st[3] or '0')
local tat_t = tonumber(st[4] or '0')
local wait_r = 0
local wait_t = 0
if ivr > 0 and tat_r > now then wait_r = tat_r - now end
if ivt > 0 and tat_t > now then wait_t = tat_t - now end
if wait_r > 0 or wait_t > 0 then
  if wait_r >= wait_t then return {0, us(wait_r), 'requests', us(now), ''} end
  return {0, us(wait_t), 'tokens', us(now), ''}
end

if ivr > 0 then redis.call('HSET', KEYS[2], 'tat_r', string.format('%.3f', now + ivr)) end
if ivt > 0 then
  redis.call('HSET', KEYS[2], 'tat_t', string.format('%.3f', now + cost * ivt), 'ivt', string.format('%.6f', ivt))
end
redis.call('ZADD', KEYS[1], now + ttl, holder)
return {1, '0', 'granted', us(now), ''}
