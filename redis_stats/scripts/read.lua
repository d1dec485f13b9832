-- redis_stats read: one consistent snapshot of a namespace in one round trip.
--
-- KEYS[1] engines zset, KEYS[2] writers zset, KEYS[3] meta hash, KEYS[4] conflicts hash
-- ARGV: prefix, known catalogue version ('' for none), then optional engine indexes to read
--       (none: every engine in the engines zset)
--
-- Returns {now ms, engines {engine, score, ...}, writers {id, score, ...}, catalogue version,
--          meta {field, value, ...} (empty when the caller's version is current),
--          conflicts {engine, "<a>|<b>|<ms>", ...},
--          then per engine read: counters {field, value, ...}, gauges {field, value, ...},
--          then per writer: its self-metrics {field, value, ...}}.

local prefix = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local engines
if #ARGV > 2 then
  engines = {}
  for j = 3, #ARGV do
    local score = redis.call('ZSCORE', KEYS[1], ARGV[j])
    if score then
      engines[#engines + 1] = ARGV[j]
      engines[#engines + 1] = score
    end
  end
else
  engines = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
end
local writers = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
local version = redis.call('HGET', KEYS[3], '_v') or ''
local meta = {}
if version ~= ARGV[2] then
  meta = redis.call('HGETALL', KEYS[3])
end

local out = {now, engines, writers, version, meta, redis.call('HGETALL', KEYS[4])}
for j = 1, #engines, 2 do
  local base = prefix .. 'e:' .. engines[j]
  out[#out + 1] = redis.call('HGETALL', base .. ':c')
  out[#out + 1] = redis.call('HGETALL', base .. ':g')
end
for j = 1, #writers, 2 do
  out[#out + 1] = redis.call('HGETALL', prefix .. 'w:' .. writers[j])
end
return out
