-- Block new permits until now + ARGV[1] us (never shortens an existing cooldown), and restart the
-- rate schedule there: reservations made before now are void (their holders reserve again, in
-- the order they come back) and the request TAT moves to the cooldown's end, so permits resume
-- one interval apart instead of every overdue reservation being claimed at once. The grant log
-- still bounds every window. KEYS[1] state HASH; ARGV[2] channel to publish on.
-- Returns the cooldown end in us.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local untl = now + tonumber(ARGV[1])
local cur = tonumber(redis.call('HGET', KEYS[1], 'cool') or '0')
if cur > untl then untl = cur end
redis.call('HSET', KEYS[1], 'cool', string.format('%.0f', untl), 'tat_r', string.format('%.0f', untl))
redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('PUBLISH', ARGV[2], 'cooldown')
return string.format('%.0f', untl)
