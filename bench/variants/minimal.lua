-- The least a flush could do with the flush's arguments: read and store the sequence number, set the
-- chunks, heartbeat the engines and the writer (no checks, no claims, no self-metrics, no load
-- entries). Not a candidate: a yardstick of what each command and key of the real script costs
-- cold (bench/flush_cost.py --variant bench/variants/minimal.lua; docs/benchmarks.md).
local writer = ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_text = tostring(now)
local raw = redis.call('HGET', KEYS[1], writer)
local i = 10
local nclaims = tonumber(ARGV[i]); i = i + 1 + nclaims
local nstats = tonumber(ARGV[i]); i = i + 1 + 2 * nstats
local nspecs = tonumber(ARGV[i]); i = i + 1 + 2 * nspecs
local nload = tonumber(ARGV[i]); i = i + 1 + 2 * nload
local k = 0
redis.call('HSET', KEYS[1], writer, ARGV[3])
while i <= #ARGV do
  local engine, nset = ARGV[i], tonumber(ARGV[i + 1])
  k = k + 1
  if nset > 0 then redis.call('HSET', KEYS[8 + k], unpack(ARGV, i + 2, i + 1 + 2 * nset)) end
  redis.call('ZADD', KEYS[2], now_text, engine)
  i = i + 2 + 2 * nset
end
redis.call('ZADD', KEYS[3], now_text, writer)
return {1, now, 0, {}, 0, ''}
