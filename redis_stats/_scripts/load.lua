-- redis_stats load: store one writer's load entries (the router feed's fields) in its shard's
-- load hash. One job: the flush (flush.lua) stays as it is; a writer sends this script in the
-- same pipelined round trip as its flush, and alone at the faster load_interval when set.
--
-- KEYS[1] load hash      "<engine>|<writer>" -> "<server ms>,<entry>" (docs/key-schema.md)
-- KEYS[2] writers zset   writer id -> last heartbeat (ms; negative: closed), read only here
--
-- ARGV: writer, mode, then per engine: engine, entry (the writer's fields, absolute values:
--       redis_stats/load.py encode_entry)
--       mode 0: store the entries; 2: store them and collect garbage (beside a flush);
--       1: the writer closes: delete its entries of these engines (the entries are ignored)
--
-- Returns {1, now ms}. Absolute values: applying a call twice stores the same thing (a retry
-- or a duplicate is harmless, no sequence number needed). Readers also skip the entries of any
-- writer they do not judge live, so a writer that died without closing is never counted.
--
-- Bounded garbage: with mode 2 (once per flush, not at the faster cadence) two random entries of
-- the hash are looked at, and those whose writer gc removed from the writers zset or that closed
-- are deleted: the hash holds about one entry per live writer and engine, whatever the churn,
-- without gc.lua.
--
-- All or nothing: the first write (HSET or HDEL) is the only command that can fail the call (a
-- key of the wrong type, a user without the command: refused, nothing written); the garbage
-- collection after it runs every command with pcall.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local writer, mode = ARGV[1], ARGV[2]
local fields = {}
if mode == '1' then
  for j = 3, #ARGV, 2 do
    fields[#fields + 1] = ARGV[j] .. '|' .. writer
  end
  if #fields > 0 then
    redis.call('HDEL', KEYS[1], unpack(fields))
  end
  return {1, now}
end
local stamp = now .. ','
for j = 3, #ARGV, 2 do
  fields[#fields + 1] = ARGV[j] .. '|' .. writer
  fields[#fields + 1] = stamp .. ARGV[j + 1]
end
if #fields > 0 then
  redis.call('HSET', KEYS[1], unpack(fields))
end
if mode == '2' then
  -- Every command here with pcall: after the first write nothing may fail the call (a user
  -- with an earlier version's ACL rules, without HRANDFIELD or ZSCORE, only collects nothing).
  local picked = redis.pcall('HRANDFIELD', KEYS[1], 2)
  if type(picked) == 'table' and picked.err == nil then
    for _, field in ipairs(picked) do
      local owner = string.match(field, '^[^|]*|(.*)$')
      local score = owner and redis.pcall('ZSCORE', KEYS[2], owner)
      if type(score) ~= 'table' and (not score or tonumber(score) < 0) then
        redis.pcall('HDEL', KEYS[1], field)
      end
    end
  end
end
return {1, now}
