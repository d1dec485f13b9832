-- redis_stats gc: remove engines and writers silent for longer than the retention.
--
-- KEYS[1] engines zset, KEYS[2] writers zset, KEYS[3] seq hash
-- ARGV: prefix, retention ms, dry run (0/1)
-- Returns {removed engines, removed writers, tombstones dropped}.
--
-- A removed writer's sequence entry becomes a tombstone "x<last seq>:<removed at ms>": a late
-- flush from it (a delayed retry) still deduplicates and adds its counters, but cannot bring its
-- gauges back. Tombstones older than one more retention are dropped.

local prefix, retention, dry = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = now - retention

local engines = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. cutoff)
local writers = {}
local all = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for j = 1, #all, 2 do
  if math.abs(tonumber(all[j + 1])) < cutoff then writers[#writers + 1] = all[j] end
end
local tombstones = {}
local seqs = redis.call('HGETALL', KEYS[3])
for j = 1, #seqs, 2 do
  local v = seqs[j + 1]
  if string.sub(v, 1, 1) == 'x' then
    local at = tonumber(string.match(v, ':(%d+)$') or '0')
    if at < cutoff then tombstones[#tombstones + 1] = seqs[j] end
  end
end
if dry then return {engines, writers, tombstones} end

for _, e in ipairs(engines) do
  redis.call('DEL', prefix .. 'e:' .. e .. ':c', prefix .. 'e:' .. e .. ':g')
  redis.call('ZREM', KEYS[1], e)
end
if #writers > 0 then
  local live = redis.call('ZRANGE', KEYS[1], 0, -1)
  for _, w in ipairs(writers) do
    -- The writer's gauge fields end with "|<writer id>" (escaped as in fields.py).
    local suffix = '|' .. string.gsub(string.gsub(w, '\\', '\\\\'), '|', '\\/')
    for _, e in ipairs(live) do
      local gkey = prefix .. 'e:' .. e .. ':g'
      for _, f in ipairs(redis.call('HKEYS', gkey)) do
        if string.sub(f, -#suffix) == suffix then redis.call('HDEL', gkey, f) end
      end
    end
    local last = redis.call('HGET', KEYS[3], w) or '0'
    if string.sub(last, 1, 1) ~= 'x' then
      redis.call('HSET', KEYS[3], w, 'x' .. last .. ':' .. now)
    end
    redis.call('ZREM', KEYS[2], w)
  end
end
for _, w in ipairs(tombstones) do redis.call('HDEL', KEYS[3], w) end
return {engines, writers, tombstones}
