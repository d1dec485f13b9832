-- redis_stats gc: remove engines and writers silent for longer than the retention.
--
-- KEYS[1] engines zset, KEYS[2] writers zset, KEYS[3] seq hash, KEYS[4] meta hash,
-- KEYS[5] claims hash, KEYS[6] conflicts hash, KEYS[7] load hash, then the keys of the engines
-- and writers ARGV names, in that order: each engine's hash (e:<engine>:c), each engine's base
-- hash (e:<engine>:b), each stale engine's schema 1 gauges hash (e:<engine>:g), each writer's
-- stats hash (w:<writer>)
-- ARGV: retention ms, dry run (0/1), drop the catalogue once empty (0/1), retention factor (a
--       writer that did not close is removed only once silent for longer than this many times
--       its stale_after, as well: config.RETENTION_FACTOR), then how many engines (ne), stale
--       engines (ns) and writers (nw) the keys name, then their names (ne engines, ns stale
--       engines, nw writers), then {writer, stale ms} * n: the stale_after every reader judges
--       each listed writer by (what it declared in its home shard's stats hash, or the one
--       default when that is unusable: _core/read/liveness.py judged_ms; ops/retention.py gathers
--       them over the shards, since a writer stores its self-metrics in one shard only)
-- Returns {removed engines, removed writers, tombstones dropped, lines folded, lines not folded,
--          emptied (1: nothing was left, and the shard's remaining keys were deleted),
--          deferred (engines or writers due that this call was not given the keys of)}.
--
-- Every key is declared. ops/retention.py reads the lists first and names the keys of every
-- listed engine, the engines past the retention and the writers that may be; this call decides
-- again, from the lists as they are now, in one atomic step. What it would need a key it was not
-- given for (an engine or writer past the retention since the caller read the lists; a writer
-- to remove while an engine it may hold chunks in is new) is left for the next call: "deferred",
-- and ops/retention.py calls again with the lists read anew. Nothing is removed half.
--
-- The load entries ("<engine>|<writer>") of every writer not in the writers zset after this call
-- are deleted: those of the writers it removes, and any left by a writer removed before.
--
-- A shard left with no engine and no writer is deleted whole, its tombstones with it (seq with its
-- watermark, claims, conflicts, load entries, and the catalogue when ARGV[3] says so: shard 0's
-- lists the namespace's K, so the caller asks for it only once every other shard is empty), so a
-- namespace nobody writes to any more is no longer listed after one gc. Nothing of a writer's can
-- be double counted after that: a tombstone only keeps a writer from adding again what gc folded
-- into an engine's base fields, and with no engine hash left there are none; a writer that comes
-- back (paused, or retrying a batch whose answer it lost) finds no sequence entry and no
-- catalogue, and stores its whole state again, once (flush.lua: "behind").
--
-- A removed writer's chunks (schema 2, docs/key-schema.md) are folded into the base fields of
-- each engine: its counter totals added to "<series>", its histograms to "<series>|h:<layout>"
-- (cumulative counts and sum, added bucket by bucket); its gauges are dropped. Its sequence entry
-- becomes a tombstone "x<last seq>:<removed at ms>": a late flush from it is not applied (the
-- writer continues under a new id and sends what was not folded), and a retry of a flush applied
-- before still deduplicates. Tombstones of writers that closed, older than one more retention,
-- are dropped; those of writers that did not close are kept ("x<seq>:<ms>:k": one small field per
-- writer process that died or was paused, not per restart), so a writer paused mid-flush for any
-- length still finds out its last batch was applied and folded. The fold
-- watermark "!folded" (the largest cutoff gc ever applied, never dropped) still tells a writer
-- resumed after any pause that it was folded (flush.lua), without a tombstone.
--
-- An engine silent for longer than the retention is removed only if no writer that stays (one
-- not removed by this call) holds chunks in it: a live writer's data, declared engine or not,
-- is never deleted under it (its next flush would send values without their names).
-- lines(), escape() and unpack come from common.lua (put in front by the loader).

local retention, dry = tonumber(ARGV[1]), ARGV[2] == '1'
local factor = tonumber(ARGV[4]) or 0
local ne, ns, nw = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local hash_of, base_of, gauges_of, stats_of = {}, {}, {}, {}  -- engine or writer -> its key
for i = 1, ne do
  hash_of[ARGV[7 + i]] = KEYS[7 + i]
  base_of[ARGV[7 + i]] = KEYS[7 + ne + i]
end
for i = 1, ns do gauges_of[ARGV[7 + ne + i]] = KEYS[7 + 2 * ne + i] end
for i = 1, nw do stats_of[ARGV[7 + ne + ns + i]] = KEYS[7 + 2 * ne + ns + i] end
local deferred = 0
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = now - retention

local writers = {}
local closed = {}  -- the removed writers that had closed cleanly (a negative heartbeat)
local staying = {}  -- escaped ids of the writers this call keeps, as their chunk fields name them
local kept = {}  -- the same writers' ids as they are
local given = {}
for j = 8 + ne + ns + nw, #ARGV - 1, 2 do given[ARGV[j]] = ARGV[j + 1] end

local function declared_ms(w)
  -- The stale_after (ms) readers judge writer w by. Every writer listed when ops/retention.py
  -- read the lists is given; one that is not was added since, by a flush: it is not silent.
  return tonumber(given[w] or '0') or 0
end

local function gone(w, score)
  -- Silent (or closed) for longer than the retention; a writer that did not close also for
  -- longer than factor x its own stale_after: a gc run with a retention too short for a writer
  -- (configured apart from it) never removes it while readers may still call it live.
  local at = math.abs(score)
  if at >= cutoff then return false end
  return score < 0 or at < now - factor * declared_ms(w)
end

local all = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
local listed = redis.call('ZRANGE', KEYS[1], 0, -1)
local hashes_given = true  -- every listed engine's hash declared: writers may be folded
for _, e in ipairs(listed) do
  if not hash_of[e] then hashes_given = false end
end
for j = 1, #all, 2 do
  local w = all[j]
  if gone(w, tonumber(all[j + 1])) and stats_of[w] and hashes_given then
    writers[#writers + 1] = w
    closed[w] = tonumber(all[j + 1]) < 0
  else
    if gone(w, tonumber(all[j + 1])) then deferred = deferred + 1 end
    staying[escape(w)] = true
    kept[w] = true
  end
end
local engines = {}
for _, e in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. cutoff)) do
  local key = hash_of[e]
  local owned = false
  if not (key and gauges_of[e]) then
    owned, deferred = true, deferred + 1
  elseif redis.call('TYPE', key)['ok'] == 'hash' then
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
  if string.sub(v, 1, 1) == 'x' and string.sub(v, -2) ~= ':k' then
    local at = tonumber(string.match(v, ':(%d+)$') or '0')
    if at < cutoff then tombstones[#tombstones + 1] = seqs[j] end
  end
end
if dry then return {engines, writers, tombstones, 0, 0, 0, deferred} end

local mark = tonumber(redis.call('HGET', KEYS[3], '!folded') or '0') or 0
if cutoff > mark then redis.call('HSET', KEYS[3], '!folded', string.format('%d', cutoff)) end

for _, e in ipairs(engines) do
  redis.call('DEL', hash_of[e], base_of[e], gauges_of[e])
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
      local key, base = hash_of[e], base_of[e]  -- every listed engine's (hashes_given)
      local base_type = redis.call('TYPE', base)['ok']
      if redis.call('TYPE', key)['ok'] == 'hash' and (base_type == 'hash' or base_type == 'none') then
        local mine = {}
        for _, f in ipairs(redis.call('HKEYS', key)) do
          if string.sub(f, 1, #head) == head then
            mine[#mine + 1] = f
          elseif string.sub(f, 1, 2) ~= '@|' then
            -- A base field an older gc folded into the engine's hash itself: moved to the base
            -- hash (added: the sum is the same), so the hash holds the writers' chunks only;
            -- one that does not add up (garbage) stays where it is, and is not counted here.
            local done, missed = folded, unfolded
            fold(base, f, redis.call('HGET', key, f))
            if folded > done then mine[#mine + 1] = f end
            folded, unfolded = done, missed
          end
        end
        for _, f in ipairs(mine) do
          if string.sub(f, 1, #head) == head and string.sub(f, -2) ~= '|n' then
            local names = lines(redis.call('HGET', key, f .. '|n') or '')
            local values = lines(redis.call('HGET', key, f) or '')
            if #names == #values then
              for x = 1, #names do fold(base, names[x], values[x]) end
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
      -- A writer that did not close may still be paused with a batch whose answer it never
      -- heard (applied, and folded now): only its tombstone's <seq> tells its retry "already
      -- applied", so that one is kept (":k"); a closed writer's goes after one more retention.
      redis.call('HSET', KEYS[3], w, 'x' .. last .. ':' .. now .. (closed[w] and '' or ':k'))
    end
    redis.call('ZREM', KEYS[2], w)
    redis.call('DEL', stats_of[w])
  end
end
for _, w in ipairs(tombstones) do redis.call('HDEL', KEYS[3], w) end
if redis.call('TYPE', KEYS[7])['ok'] == 'hash' then
  local stray = {}  -- entries of writers not kept: removed now, or before
  for _, f in ipairs(redis.call('HKEYS', KEYS[7])) do
    local w = string.match(f, '^[^|]*|(.*)$')
    if not (w and kept[w]) then stray[#stray + 1] = f end
  end
  for j = 1, #stray, 500 do redis.call('HDEL', KEYS[7], unpack(stray, j, math.min(j + 499, #stray))) end
end
local emptied = 0
-- (ZRANGE: a command the documented stats-admin ACL already grants)
if #redis.call('ZRANGE', KEYS[1], 0, 0) == 0 and #redis.call('ZRANGE', KEYS[2], 0, 0) == 0 then
  -- Tombstones (kept ":k" or not) protect folded base fields: with no engine, none is left.
  emptied = 1
  redis.call('DEL', KEYS[3], KEYS[5], KEYS[6], KEYS[7])
  if ARGV[3] == '1' then redis.call('DEL', KEYS[4]) end
end
return {engines, writers, tombstones, folded, unfolded, emptied, deferred}
