-- redis_stats load read: what the router feed needs of one shard, in one call, and nothing else
-- (not the engines' series: an engine hash holds ~28 KB of text at vLLM's catalogue).
--
-- KEYS[1] engines zset, KEYS[2] writers zset, KEYS[3] load hash, KEYS[4] meta hash
-- ARGV[1] prefix (the writers' stats hashes and the engines' hashes are <prefix>w:<writer> and
--         <prefix>e:<engine>:c: which exist is what this read discovers, on KEYS[1]'s slot)
--
-- Returns {now ms, engines {engine, score, ...}, writers {id, score, ...}, load {field, value, ...},
--          meta's `shards` field (the K writers listed, see shards.lua; false when none),
--          {each writer's stale_ms (its stats hash's, false when none), in the writers' order},
--          {per engine: its chunks' values fields ("@|<writer>|<k>", escaped as in the hash)}};
-- a key of the wrong type gives its error reply in its place (the reader skips and counts it).
-- The last two are what the reader's liveness rule needs (redis_stats/_core/liveness.py): a
-- writer's own stale_after, and an engine's chunk writers (an engine whose writers all closed
-- is down at once). Of an engine's hash only the field names are read (HKEYS), never a value.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = ARGV[1]

local function failed(reply)
  return type(reply) == 'table' and reply.err ~= nil
end

local engines = redis.pcall('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local writers = redis.pcall('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
local stale = {}
if not failed(writers) then
  for j = 1, #writers, 2 do
    local ms = redis.pcall('HGET', prefix .. 'w:' .. writers[j], 'stale_ms')
    stale[#stale + 1] = (ms and not failed(ms)) and ms or false
  end
end
local owners = {}
if not failed(engines) then
  for j = 1, #engines, 2 do
    local names = redis.pcall('HKEYS', prefix .. 'e:' .. engines[j] .. ':c')
    local held = {}
    if not failed(names) then
      for _, name in ipairs(names) do
        -- a chunk's values field "@|<writer>|<k>" (not its names "...|n"): the reader takes
        -- its writer out as the snapshot decoder does (fields.chunk_writer)
        if string.sub(name, 1, 2) == '@|' and string.sub(name, -2) ~= '|n' then
          held[#held + 1] = name
        end
      end
    end
    owners[#owners + 1] = held
  end
end
return {
  now,
  engines,
  writers,
  redis.pcall('HGETALL', KEYS[3]),
  redis.pcall('HGET', KEYS[4], 'shards'),
  stale,
  owners,
}
