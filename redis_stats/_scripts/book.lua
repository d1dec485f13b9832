-- redis_stats book: store a router's bookings of requests on engines (redis_stats/bookings.py).
--
-- KEYS[1] the shard's bookings hash, KEYS[2] its routers zset (router -> end of its lease, ms)
-- ARGV: router, lease ms, bounded time ms, then request id, engine pairs
-- Stores each booking as "<engine>|<ends ms>|<router>" (ends: now + the bounded time, server
-- clock) and extends the router's lease to now + lease: a booking counts while both last.
-- Returns the server time (ms) and 1 if the router's lease had ended or was unknown (the store
-- lost it: the caller books its open bookings again), else 0.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local router, lease, bound = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local held = tonumber(redis.call('ZSCORE', KEYS[2], router))
redis.call('ZADD', KEYS[2], now + lease, router)
local ends = tostring(now + bound)
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1] .. '|' .. ends .. '|' .. router)
end
-- Neither key outlives the last router by much: once every router stopped, both go.
local keep = math.max(lease, bound) + 60000
for _, key in ipairs(KEYS) do
  if redis.call('PTTL', key) < keep then redis.call('PEXPIRE', key, keep) end
end
local lost = 0
if held == nil or held <= now then lost = 1 end
return {now, lost}
