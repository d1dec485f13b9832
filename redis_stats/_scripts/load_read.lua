-- redis_stats load read: what the router feed needs of one shard, in one call, and nothing else
-- (not the engines' series: an engine hash holds ~28 KB of text at vLLM's catalogue).
--
-- KEYS[1] engines zset, KEYS[2] writers zset, KEYS[3] load hash, KEYS[4] meta hash
-- ARGV: none
--
-- Returns {now ms, engines {engine, score, ...}, writers {id, score, ...}, load {field, value, ...},
--          meta's `shards` field (the K writers listed, see shards.lua; false when none)};
-- a key of the wrong type gives its error reply in its place (the reader skips and counts it).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {
  now,
  redis.pcall('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES'),
  redis.pcall('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES'),
  redis.pcall('HGETALL', KEYS[3]),
  redis.pcall('HGET', KEYS[4], 'shards'),
}
