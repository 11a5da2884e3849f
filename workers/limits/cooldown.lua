-- Block new permits until now + ARGV[1] us (never shortens an existing cooldown).
-- KEYS[1] state HASH; ARGV[2] channel to publish on. Returns the cooldown end in us.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local untl = now + tonumber(ARGV[1])
local cur = tonumber(redis.call('HGET', KEYS[1], 'cool') or '0')
if cur > untl then untl = cur end
redis.call('HSET', KEYS[1], 'cool', string.format('%.0f', untl))
redis.call('PUBLISH', ARGV[2], 'cooldown')
return string.format('%.0f', untl)
