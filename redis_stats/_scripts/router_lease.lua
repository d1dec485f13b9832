-- redis_stats router lease: renew or release a router's lease, and drop the bookings that no
-- longer count (redis_stats/bookings.py).
--
-- KEYS[1] the shard's bookings hash, KEYS[2] its routers zset (router -> end of its lease, ms)
-- ARGV: router, lease ms, "renew" | "release"
-- renew: the lease ends at now + lease; release: it ends now, with the router's bookings. Either
-- way the bookings past their bounded time, or of a router whose lease ended (one killed), are
-- deleted, and the leases that ended. Returns {server ms, 1 if the router's lease had ended or
-- was unknown before a renew (the store lost it: book the open bookings again) else 0}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local router, lease, op = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local held = tonumber(redis.call('ZSCORE', KEYS[2], router))
if op == 'release' then
  redis.call('ZREM', KEYS[2], router)
else
  redis.call('ZADD', KEYS[2], now + lease, router)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local flat = redis.call('HGETALL', KEYS[1])
local gone = {}
for i = 1, #flat, 2 do
  local engine, ends, owner = string.match(flat[i + 1], '^(%d+)|([^|]+)|(.+)$')
  local live = owner and tonumber(ends) and tonumber(ends) > now
  if live then
    local until_ms = tonumber(redis.call('ZSCORE', KEYS[2], owner))
    live = until_ms ~= nil and until_ms > now
  end
  if not live then gone[#gone + 1] = flat[i] end
end
for i = 1, #gone, 1000 do
  redis.call('HDEL', KEYS[1], unpack(gone, i, math.min(i + 999, #gone)))
end
local lost = 0
if op ~= 'release' and (held == nil or held <= now) then lost = 1 end
return {now, lost}
