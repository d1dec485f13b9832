-- redis_stats gc: remove engines and writers silent for longer than the retention.
--
-- KEYS[1] engines zset, KEYS[2] writers zset, KEYS[3] seq hash
-- ARGV: prefix, retention ms, dry run (0/1)
-- Returns {removed engines, removed writers, tombstones dropped, lines folded, lines not folded}.
--
-- A removed writer's chunks (schema 2, docs/key-schema.md) are folded into the base fields of
-- each engine: its counter totals added to "<series>", its histograms to "<series>|h:<layout>"
-- (cumulative counts and sum, added bucket by bucket); its gauges are dropped. Its sequence entry
-- becomes a tombstone "x<last seq>:<removed at ms>": a late flush from it is not applied (the
-- writer continues under a new id and sends what was not folded), and a retry of a flush applied
-- before still deduplicates. Tombstones older than one more retention are dropped; the fold
-- watermark "!folded" (the largest cutoff gc ever applied, never dropped) still tells a writer
-- resumed after any pause that it was folded (flush.lua), without a tombstone.
--
-- An engine silent for longer than the retention is removed only if no writer that stays (one
-- not removed by this call) holds chunks in it: a live writer's data, declared engine or not,
-- is never deleted under it (its next flush would send values without their names).
--
-- Key names: the script builds those of the engines and writers it removes or folds
-- (<prefix>e:<engine>:c and :g, <prefix>w:<writer>) instead of receiving them as KEYS, because
-- which ones are stale is decided here, from the zsets, in the same atomic call that removes them.
-- Declaring them would need a read first and a second call that checks again (a writer may flush
-- in between); every name carries the namespace's hash tag {NS}, so on a Cluster they are all on
-- the slot of KEYS[1]. lines() and escape() come from common.lua (put in front by the loader).

local prefix, retention, dry = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = now - retention

local writers = {}
local staying = {}  -- escaped ids of the writers this call keeps, as their chunk fields name them
local all = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for j = 1, #all, 2 do
  if math.abs(tonumber(all[j + 1])) < cutoff then
    writers[#writers + 1] = all[j]
  else
    staying[escape(all[j])] = true
  end
end
local engines = {}
for _, e in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. cutoff)) do
  local key = prefix .. 'e:' .. e .. ':c'
  local owned = false
  if redis.call('TYPE', key)['ok'] == 'hash' then
    for _, f in ipairs(redis.call('HKEYS', key)) do
      local w = string.match(f, '^@|([^|]*)|%d+$')
      if w and staying[w] then owned = true; break end
    end
  end
  if not owned then engines[#engines + 1] = e end
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
if dry then return {engines, writers, tombstones, 0, 0} end

local mark = tonumber(redis.call('HGET', KEYS[3], '!folded') or '0') or 0
if cutoff > mark then redis.call('HSET', KEYS[3], '!folded', string.format('%d', cutoff)) end

for _, e in ipairs(engines) do
  redis.call('DEL', prefix .. 'e:' .. e .. ':c', prefix .. 'e:' .. e .. ':g')
  redis.call('ZREM', KEYS[1], e)
end

local function numbers(text)
  -- The finite numbers of "<a> <b> ...", or nil if one is not (tonumber also reads nan and inf).
  local out = {}
  for x in string.gmatch(text, '%S+') do
    local v = tonumber(x)
    if not v or v - v ~= 0 then return nil end
    out[#out + 1] = v
  end
  return out
end

local folded, unfolded = 0, 0
local function fold(key, series, value)
  if string.find(value, '|', 1, true) then return end  -- a gauge: a departed writer's is dropped
  if not string.find(value, ' ', 1, true) then
    -- A counter total: added exactly while both are integers, else as floats.
    local r = redis.pcall('HINCRBY', key, series, value)
    if type(r) == 'table' and r.err then r = redis.pcall('HINCRBYFLOAT', key, series, value) end
    if type(r) == 'table' and r.err then unfolded = unfolded + 1 else folded = folded + 1 end
    return
  end
  -- A histogram "<sum> <c0> ... <cN>" (cumulative): added bucket by bucket.
  local add = numbers(value)
  local cur = redis.call('HGET', key, series)
  if not add then unfolded = unfolded + 1; return end
  if cur then
    local base = numbers(cur)
    if not base or #base ~= #add then unfolded = unfolded + 1; return end
    local out = {string.format('%.17g', base[1] + add[1])}
    for j = 2, #add do out[j] = string.format('%d', base[j] + add[j]) end
    value = table.concat(out, ' ')
  end
  redis.call('HSET', key, series, value)
  folded = folded + 1
end

if #writers > 0 then
  local live = redis.call('ZRANGE', KEYS[1], 0, -1)
  for _, w in ipairs(writers) do
    -- The writer's chunk fields start "@|<writer id>|" (the id escaped as in fields.py).
    local head = '@|' .. escape(w) .. '|'
    for _, e in ipairs(live) do
      local key = prefix .. 'e:' .. e .. ':c'
      if redis.call('TYPE', key)['ok'] == 'hash' then
        local mine = {}
        for _, f in ipairs(redis.call('HKEYS', key)) do
          if string.sub(f, 1, #head) == head then mine[#mine + 1] = f end
        end
        for _, f in ipairs(mine) do
          if string.sub(f, -2) ~= '|n' then
            local names = lines(redis.call('HGET', key, f .. '|n') or '')
            local values = lines(redis.call('HGET', key, f) or '')
            if #names == #values then
              for x = 1, #names do fold(key, names[x], values[x]) end
            else
              unfolded = unfolded + #values
            end
          end
        end
        for j = 1, #mine, 500 do  -- in parts: unpack() of a very long list overflows Lua's C stack
          redis.call('HDEL', key, unpack(mine, j, math.min(j + 499, #mine)))
        end
      end
    end
    local last = redis.call('HGET', KEYS[3], w) or '0'
    if string.sub(last, 1, 1) ~= 'x' then
      redis.call('HSET', KEYS[3], w, 'x' .. last .. ':' .. now)
    end
    redis.call('ZREM', KEYS[2], w)
    redis.call('DEL', prefix .. 'w:' .. w)
  end
end
for _, w in ipairs(tombstones) do redis.call('HDEL', KEYS[3], w) end
return {engines, writers, tombstones, folded, unfolded}
