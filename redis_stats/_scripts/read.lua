-- redis_stats read: the keys a reader planned to read, read in one atomic call.
--
-- KEYS     every key this call reads (a shard's keys: one hash tag, so one Cluster slot); a
--          key may be named twice (two fields of one hash)
-- ARGV[1]  how to read each key, one character per key, in the order of KEYS:
--            z   ZRANGE key 0 -1 WITHSCORES    (the engines and writers sorted sets)
--            h   HGETALL key                   (an engine's series, a writer's stats, conflicts,
--                                               the load hash)
--            k   HKEYS key                     (an engine's field names: who holds chunks in it)
--            1-9 HGET key ARGV[1 + digit]      (one field: the catalogue version, the listed
--                                               shard counts, a writer's stale_ms)
--            f   HGET key <its own field>      (a field read of one key only: a writer's
--                                               entry of the seq hash), the fields of the f keys
--                                               following the digits' in ARGV, in KEYS' order
-- ARGV[2..] the fields the digits name, then those of the f keys
--
-- Returns {TIME, then each key's reply, in the order of KEYS}; a key of the wrong type gives its
-- error reply in its place (each read is a pcall), for the reader to skip and count: it costs
-- that key only.
--
-- This script discovers nothing: which engines and writers to read is the reader's plan, made
-- from the lists its last read returned (redis_stats/reader.py). The lists are read again here,
-- in the same atomic call as the hashes, and the reader compares them with its plan: when an
-- engine or a writer came or went, it plans again and reads again. Every key is declared, as
-- Redis documents scripts ("all names of keys that a script accesses must be explicitly provided
-- as input key arguments"), and as Dragonfly, kvrocks' strict mode and managed stores enforce.

local how = ARGV[1]
local out = {redis.call('TIME')}
local own = 2  -- the next f key's field: after the digits' (each digit's field is ARGV[1 + digit])
for d in string.gmatch(how, '%d') do own = math.max(own, 2 + tonumber(d)) end
for i = 1, #KEYS do
  local c = string.sub(how, i, i)
  local reply
  if c == 'z' then
    reply = redis.pcall('ZRANGE', KEYS[i], 0, -1, 'WITHSCORES')
  elseif c == 'h' then
    reply = redis.pcall('HGETALL', KEYS[i])
  elseif c == 'k' then
    reply = redis.pcall('HKEYS', KEYS[i])
  elseif c == 'f' then
    reply = redis.pcall('HGET', KEYS[i], ARGV[own])
    own = own + 1
  else
    reply = redis.pcall('HGET', KEYS[i], ARGV[1 + tonumber(c)])
  end
  out[i + 1] = reply
end
return out
