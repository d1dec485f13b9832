-- redis_stats load: store one writer's load entries (the router feed's fields) in its shard's
-- load hash. One job: the flush (flush.lua) stays as it is; a writer sends this script in the
-- same pipelined round trip as its flush, and alone at the faster load_interval when set.
--
-- KEYS[1] load hash      "<engine>|<writer>" -> "<server ms>,<entry>" (docs/key-schema.md)
-- KEYS[2] writers zset   writer id -> last heartbeat (ms; negative: closed), read only here
--
-- ARGV: writer, closing (0/1), then per engine: engine, entry (the writer's fields, absolute
--       values: redis_stats/load.py encode_entry)
--
-- Returns {1, now ms}. Absolute values: applying a call twice stores the same thing (a retry
-- or a duplicate is harmless, no sequence number needed). A closing call deletes the writer's
-- entries instead (a cleanly closed writer's load is gone at once; readers also skip the entries
-- of any writer they do not judge live).
--
-- Bounded garbage: each call looks at two random entries of the hash and deletes those whose
-- writer gc removed from the writers zset or that closed (a writer that died without closing
-- leaves its entries until gc removes it; readers never count them meanwhile). So the hash holds
-- about one entry per live writer and engine, whatever the fleet's churn, without gc.lua.
--
-- All or nothing: the only check (the load hash is a hash) comes before the first write; the
-- writes are HSET/HDEL of a hash, which cannot fail.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'hash' then
  return redis.error_reply('ERR redis_stats load refused, nothing written: key ' .. KEYS[1] ..
    ' (load entries) is a ' .. kind .. ', not a hash; it was not written by redis_stats: delete or rename it')
end
local writer = ARGV[1]
if ARGV[2] == '1' then
  for j = 3, #ARGV, 2 do
    redis.call('HDEL', KEYS[1], ARGV[j] .. '|' .. writer)
  end
elseif #ARGV > 2 then
  local args = {}
  local stamp = now .. ','
  for j = 3, #ARGV, 2 do
    args[#args + 1] = ARGV[j] .. '|' .. writer
    args[#args + 1] = stamp .. ARGV[j + 1]
  end
  redis.call('HSET', KEYS[1], unpack(args))
end
if redis.call('TYPE', KEYS[2])['ok'] == 'zset' then
  local picked = redis.call('HRANDFIELD', KEYS[1], 2)
  for _, field in ipairs(picked) do
    local owner = string.match(field, '^[^|]*|(.*)$')
    local score = owner and redis.call('ZSCORE', KEYS[2], owner)
    if not score or tonumber(score) < 0 then
      redis.call('HDEL', KEYS[1], field)
    end
  end
end
return {1, now}
