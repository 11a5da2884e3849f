-- Extend a live lease by the TTL from now. KEYS[1] lease ZSET; ARGV[1] holder, ARGV[2] TTL in us.
-- Returns 1 if renewed, 0 if the lease had expired or never existed (the slot is lost).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if (not score) or tonumber(score) <= now then
  if score then redis.call('ZREM', KEYS[1], ARGV[1]) end
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
