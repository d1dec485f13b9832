-- redis_stats load: store one writer's load entries (the router feed's fields) alone, at the
-- faster load_interval. Beside each flush the entries travel in the flush itself (flush.lua);
-- a closing writer's entries are deleted there, and gc.lua deletes those of the writers it
-- removes.
--
-- KEYS[1] load hash      "<engine>|<writer>" -> "<server ms>,<entry>" (docs/key-schema.md)
--
-- ARGV: writer, then per engine: engine, entry (the writer's fields, absolute values:
--       redis_stats/load.py encode_entry)
--
-- Returns {1, now ms}. Absolute values: applying a call twice stores the same thing (a retry
-- or a duplicate is harmless, no sequence number needed). Readers skip the entries of any
-- writer they do not judge live, so a writer that died without closing is never counted.
-- One command writes: it is the only one that can fail (a key of the wrong type, a user without
-- the right: refused, nothing written).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local writer = ARGV[1]
local stamp = now .. ','
local fields = {}
for j = 2, #ARGV, 2 do
  fields[#fields + 1] = ARGV[j] .. '|' .. writer
  fields[#fields + 1] = stamp .. ARGV[j + 1]
end
-- In parts of 1,000 (whole pairs): unpack() of a very long list overflows Lua's C stack; the
-- first part is the call's first write, the only one an OOM can refuse.
for j = 1, #fields, 1000 do
  redis.call('HSET', KEYS[1], unpack(fields, j, math.min(j + 999, #fields)))
end
return {1, now}
