-- One admission decision for one model, atomic, on Redis's clock.
-- KEYS[1] lease ZSET (member = holder, score = expiry in us)
-- KEYS[2] state HASH (tat_r, tat_t, ivt, cool, disabled, epoch: bumped by every cooldown,
--         cwait: the last concurrency denial, in us)
-- KEYS[3] grant log ZSET (member = holder:time, score = grant time in us): actual grants in the
--         last window, so no window of window_us ever holds more than `limit` grants even when
--         reservations are claimed late
-- KEYS[4] this holder's reservation STRING ('<slot us>:<epoch>'), with a TTL; a reservation made
--         before the last cooldown is void (the schedule restarted at the cooldown's end)
-- ARGV[1] holder
-- ARGV[2] concurrency cap (<= 0: unlimited)
-- ARGV[3] request emission interval in us (0: unlimited) = window_us / limit
-- ARGV[4] token emission interval in us per token (0: unlimited)
-- ARGV[5] cost in tokens
-- ARGV[6] lease TTL in us
-- ARGV[7] request limit per window (0: unlimited)
-- ARGV[8] window in us (provider period + jitter allowance)
-- ARGV[9] 1: on a rate denial reserve the next slot for this holder; 0: only report the wait
-- ARGV[10] reserve at most this far ahead, in us (farther: report the wait, reserve nothing)
-- ARGV[11] a reservation lives this long past its slot, in us (then it is abandoned)
-- Returns {code, wait_us, reason, now_us, detail, slot_us}
--   code 1 granted (reason 'granted', or 'claimed' for a reservation), 2 adopted (holder already
--   had a live lease), 0 denied, -1 disabled. slot_us is the holder's reserved slot or ''.
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
local limit = tonumber(ARGV[7])
if limit > 0 then limit = math.max(1, math.floor(limit)) end  -- whole grants per window, as log_limit()
local window = tonumber(ARGV[8])
local reserve = ARGV[9] == '1'
local ahead = tonumber(ARGV[10])
local grace = tonumber(ARGV[11])

local st = redis.call('HMGET', KEYS[2], 'disabled', 'cool', 'tat_r', 'tat_t', 'epoch')
local epoch = st[5] or '0'
local resv = nil
local slot_s = ''
local raw = redis.call('GET', KEYS[4])
if raw then
  local sep = string.find(raw, ':', 1, true)
  if string.sub(raw, sep + 1) == epoch then
    resv = string.sub(raw, 1, sep - 1)
    slot_s = resv
  else
    redis.call('DEL', KEYS[4])
  end
end
if st[1] then return {-1, '0', 'disabled', us(now), st[1], slot_s} end
local cool = tonumber(st[2] or '0')
if cool > now then return {0, us(cool - now), 'cooldown', us(now), '', slot_s} end

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], holder) then
  redis.call('ZADD', KEYS[1], now + ttl, holder)
  return {2, '0', 'adopted', us(now), '', slot_s}
end
if cap > 0 and redis.call('ZCARD', KEYS[1]) >= cap then
  redis.call('HSET', KEYS[2], 'cwait', us(now))  -- someone waits for a release: release.lua publishes
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, us(tonumber(first[2]) - now), 'concurrency', us(now), '', slot_s}
end

-- Earliest time the grant log allows one more grant (now when it does).
local free = now
if limit > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - window)
  local n = redis.call('ZCARD', KEYS[3])
  if n >= limit then
    local e = redis.call('ZRANGE', KEYS[3], n - limit, n - limit, 'WITHSCORES')
    free = tonumber(e[2]) + window
  end
end

local function grant(reason)
  if limit > 0 then
    redis.call('ZADD', KEYS[3], now, holder .. ':' .. us(now))
    redis.call('PEXPIRE', KEYS[3], math.ceil(window / 1000) + 1)
  end
  redis.call('ZADD', KEYS[1], now + ttl, holder)
  return {1, '0', reason, us(now), '', slot_s}
end

if resv then
  -- Already charged when reserved: claim it once its slot is due, without a second charge.
  local slot = tonumber(resv)
  if slot > now then return {0, us(slot - now), 'reserved', us(now), '', slot_s} end
  if free > now then
    redis.call('PEXPIRE', KEYS[4], math.ceil((free - now + grace) / 1000))
    return {0, us(free - now), 'window', us(now), '', slot_s}
  end
  redis.call('DEL', KEYS[4])
  return grant('claimed')
end

-- GCRA with zero burst tolerance: grant only when TAT is not in the future.
local tat_r = tonumber(st[3] or '0')
local tat_t = tonumber(st[4] or '0')
local wait_r = 0
local wait_t = 0
if ivr > 0 and tat_r > now then wait_r = tat_r - now end
if ivt > 0 and tat_t > now then wait_t = tat_t - now end
local wait_w = free - now
if wait_r > 0 or wait_t > 0 or wait_w > 0 then
  local wait, reason = wait_r, 'requests'
  if wait_t > wait then wait, reason = wait_t, 'tokens' end
  if wait_w > wait then wait, reason = wait_w, 'window' end
  if reserve and wait <= ahead then
    local slot = now + wait
    if ivr > 0 then redis.call('HSET', KEYS[2], 'tat_r', string.format('%.3f', slot + ivr)) end
    if ivt > 0 then
      redis.call('HSET', KEYS[2], 'tat_t', string.format('%.3f', slot + cost * ivt), 'ivt', string.format('%.6f', ivt))
    end
    redis.call('SET', KEYS[4], us(slot) .. ':' .. epoch, 'PX', math.ceil((wait + grace) / 1000))
    return {0, us(wait), reason, us(now), '', us(slot)}
  end
  return {0, us(wait), reason, us(now), '', ''}
end

if ivr > 0 then redis.call('HSET', KEYS[2], 'tat_r', string.format('%.3f', now + ivr)) end
if ivt > 0 then
  redis.call('HSET', KEYS[2], 'tat_t', string.format('%.3f', now + cost * ivt), 'ivt', string.format('%.6f', ivt))
end
return grant('granted')
