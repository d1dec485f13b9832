-- redis_stats lease: take, renew or release the log lease of a namespace.
--
-- KEYS[1] leader string "<holder>|<token>" with a TTL, KEYS[2] epoch counter (fencing tokens)
-- ARGV: holder, ttl ms, "acquire" | "release"
-- Returns the holder's fencing token (> 0) while it holds the lease, else 0.
--
-- A new holder's token is the next of the counter, and never below the server's time in ms: a
-- Redis restarted from an older snapshot (or a replica promoted behind) has an older counter,
-- and would hand a new holder a token already handed out (found by the nemesis run, issue 48).

local holder, ttl, op = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local current = redis.call('GET', KEYS[1])
local owner, token = nil, 0
if current then
  local sep = string.find(current, '|', 1, true)
  owner = string.sub(current, 1, sep - 1)
  token = tonumber(string.sub(current, sep + 1))
end

if op == 'release' then
  if owner == holder then redis.call('DEL', KEYS[1]) end
  return 0
end

if owner == holder then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return token
end
if current then
  return 0
end
token = redis.call('INCR', KEYS[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now > token then
  token = now
  redis.call('SET', KEYS[2], tostring(token))
end
redis.call('SET', KEYS[1], holder .. '|' .. tostring(token), 'PX', ttl)
return token
