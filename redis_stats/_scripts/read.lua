-- redis_stats read: one consistent snapshot of a namespace in one round trip.
--
-- KEYS[1] engines zset, KEYS[2] writers zset, KEYS[3] meta hash, KEYS[4] conflicts hash
-- ARGV: prefix, known catalogue version ('' for none), then optional engine indexes to read
--       (none: every engine in the engines zset), or '%', N, i: the engines e listed with
--       e % N == i (a slice of the fleet, chosen here, in the same call; a name that is not a
--       decimal integer of at most 15 digits goes to slice 0, whose reader skips or shows it)
--
-- Returns {now ms, engines {engine, score, ...}, writers {id, score, ...}, catalogue version,
--          meta {field, value, ...} (empty when the caller's version is current),
--          conflicts {engine, "<a>|<b>|<ms>", ...},
--          then per engine read: its hash {field, value, ...} (rs:{NS}:e:<engine>:c: the writers'
--          chunks and the base fields, see docs/key-schema.md),
--          then per writer: its self-metrics {field, value, ...}};
--          a key of the wrong type gives its error reply in its place.

-- Key names: the engine and writer hashes (<prefix>e:<engine>:c, <prefix>w:<writer>) are built
-- here, not passed as KEYS, because which engines and writers exist is what this read discovers
-- (from KEYS[1] and KEYS[2]) in the same atomic call; every name carries the namespace's hash tag
-- {NS}, so on a Cluster they are all on the slot of KEYS[1].

-- Every key is read with pcall: a key of the wrong type (garbage left by hand) comes back as
-- its error in its place, for the reader to skip and count, and costs that key only.

local prefix = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function failed(reply)
  return type(reply) == 'table' and reply.err ~= nil
end

local engines
if ARGV[3] == '%' then
  local n, i = tonumber(ARGV[4]), tonumber(ARGV[5])
  engines = redis.pcall('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  if not failed(engines) then
    local kept = {}
    for j = 1, #engines, 2 do
      local name = engines[j]
      -- at most 15 digits: exact in a Lua number (a longer name goes to slice 0, in Python too)
      local e = #name <= 15 and string.match(name, '^%d+$') and tonumber(name)
      if (e and e % n == i) or (not e and i == 0) then
        kept[#kept + 1] = name
        kept[#kept + 1] = engines[j + 1]
      end
    end
    engines = kept
  end
elseif #ARGV > 2 then
  engines = {}
  for j = 3, #ARGV do
    local score = redis.pcall('ZSCORE', KEYS[1], ARGV[j])
    if failed(score) then
      engines = score
      break
    end
    if score then
      engines[#engines + 1] = ARGV[j]
      engines[#engines + 1] = score
    end
  end
else
  engines = redis.pcall('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
end
local writers = redis.pcall('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
local version = redis.pcall('HGET', KEYS[3], '_v') or ''
local meta = {}
if failed(version) then
  meta = version
elseif version ~= ARGV[2] then
  meta = redis.pcall('HGETALL', KEYS[3])
end

local out = {now, engines, writers, version, meta, redis.pcall('HGETALL', KEYS[4])}
if not failed(engines) then
  for j = 1, #engines, 2 do
    out[#out + 1] = redis.pcall('HGETALL', prefix .. 'e:' .. engines[j] .. ':c')
  end
end
if not failed(writers) then
  for j = 1, #writers, 2 do
    out[#out + 1] = redis.pcall('HGETALL', prefix .. 'w:' .. writers[j])
  end
end
return out
