-- redis_stats lease: take, renew or release the log lease of a namespace.
--
-- KEYS[1] leader string "<holder>|<token>" with a TTL, KEYS[2] epoch counter (fencing tokens)
-- ARGV: holder, ttl ms, "acquire" | "release"
-- Returns the holder's fencing token (> 0) while it holds the lease, else 0.

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
redis.call('SET', KEYS[1], holder .. '|' .. token, 'PX', ttl)
return token
