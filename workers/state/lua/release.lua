-- Release one lease and settle its tokens; wake waiters.
-- KEYS[1] lease ZSET, KEYS[2] state HASH
-- ARGV[1] holder, ARGV[2] cost tokens charged at grant, ARGV[3] actual tokens ('' = unknown),
-- ARGV[4] channel to publish the change on, ARGV[5] how recent (us) a concurrency denial must be
--         for a release to publish
-- Returns {removed (1/0), now_us}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
local removed = 0
if score then
  redis.call('ZREM', KEYS[1], ARGV[1])
  if tonumber(score) > now then removed = 1 end
end
if ARGV[3] ~= '' then
  local ivt = tonumber(redis.call('HGET', KEYS[2], 'ivt') or '0')
  if ivt > 0 then
    local delta = tonumber(ARGV[3]) - tonumber(ARGV[2])
    local tat = tonumber(redis.call('HGET', KEYS[2], 'tat_t') or '0')
    if delta > 0 then
      -- under-estimate: charge the difference
      redis.call('HSET', KEYS[2], 'tat_t', string.format('%.3f', math.max(tat, now) + delta * ivt))
    elseif delta < 0 and removed == 1 then
      -- refund once (live lease only), never into the past
      redis.call('HSET', KEYS[2], 'tat_t', string.format('%.3f', math.max(now, tat + delta * ivt)))
    end
  end
end
-- Wake waiters only if some acquirer was denied for concurrency within ARGV[5] us (each denial
-- re-stamps 'cwait'; waits are bounded by max_block_s, so a skipped wake-up never strands one).
-- Without this every release reached every worker's listener: 4 workers, 4 messages per run.
local cwait = redis.call('HGET', KEYS[2], 'cwait')
if cwait and now - tonumber(cwait) < tonumber(ARGV[5]) then
  redis.call('PUBLISH', ARGV[4], 'release')
end
return {removed, string.format('%.0f', now)}
