-- redis_stats flush (schema 2): apply one writer's batch atomically and exactly once.
--
-- KEYS[1] seq hash        writer id -> last applied sequence number ("x<seq>:<ms>": removed by gc);
--                         "!folded" -> gc's fold watermark (ms: every writer silent since before it
--                         was folded, see gc.lua)
-- KEYS[2] engines zset    engine -> last heartbeat (ms, server time)
-- KEYS[3] writers zset    writer id -> last heartbeat (ms; negative: closed at -score)
-- KEYS[4] meta hash       schema, _v (catalogue version), m:<metric> -> spec JSON
-- KEYS[5] claims hash     engine -> "<owner>|<ms>": which instance last claimed the engine
-- KEYS[6] conflicts hash  engine -> "<owner a>|<owner b>|<ms>": two live owners seen
-- KEYS[7] the writer's stats hash (<prefix>w:<writer>)
-- KEYS[8] load hash       "<engine>|<writer>" -> "<ms>,<entry>": the router feed's fields
-- KEYS[9..] the series hash (<prefix>e:<engine>:c) of each engine block of ARGV, in that order,
--         then that of each engine checked only (the "ncheck" section of ARGV), in that order
-- Every key the script touches is declared (Redis Cluster requires it): the writer knows them all.
--
-- ARGV: prefix (named in error replies only), writer, seq, closing (0/1), schema, owner, stale ms,
--       confirmed seq (of this writer's last batch here that Redis confirmed applied; 0: this
--       batch carries the writer's whole state here — catalogue, every chunk with its names —
--       as its first batch, or after the store lost it),
--       confirmed ms (the server time at which that batch was applied),
--       held (what else the store holds of this writer as far as it knows, one letter each:
--             's' its stats hash KEYS[7], 'c' its claims of the engines it claims now),
--       nclaims, {engine} * nclaims,
--       nstats, {field, value} * nstats           (the writer's self-metrics that changed, absolute)
--       nspecs, {name, json} * nspecs,
--       nload, {engine, entry} * nload         (the writer's load entries, absolute: load.py;
--                                               an empty entry deletes the engine's: a closing
--                                               writer's, in every part of its closing flush)
--       ncheck, {engine, held, beat ms} * ncheck (engines where the writer holds chunks but
--                                               sends nothing this time: checked, not heartbeated;
--                                               beat ms: its last heartbeat of the engine, put
--                                               back in the engines zset if the engine is gone
--                                               from it, 0: none known)
--       then per engine block: engine, held, nset, {field, value} * nset
--             (held: how many chunks, 0 .. held-1, the store holds of this writer in that engine
--             as far as it knows; each block's engine is heartbeated)
-- Every count is a decimal integer. A call has 10 header arguments, 5 counts, 1 per claimed
-- engine, 2 per stat, spec and load entry, 3 per checked engine, and per block 3 + 2 per field set.
--
-- Schema 2 (docs/key-schema.md): a writer keeps, per engine, its own absolute state in chunks of
-- the engine's hash: "@|<writer>|<k>" -> the values of up to 64 series, one per line (counter
-- totals, histograms "<sum> <c0> ... <cN>" with cumulative counts, gauges "<ms>|<value>", ms the
-- writer's estimate of this server's clock when the value was set), and
-- "@|<writer>|<k>|n" -> their series fields, one per line (sent only when they change). A flush
-- replaces the chunks that changed. The script never reads or parses one: it sets fields. Readers
-- add the writers' totals of a series up; gc folds a departed writer into base fields.
--
-- Returns {status, now ms, owner conflicts, {metrics whose spec conflicts with the stored one},
--          series refused for them, why the load entries were not stored ('' if they were),
--          {kinds of this writer's keys found gone}};
-- status 1 applied, 0 already applied (a duplicate), 2 not applied because gc removed this writer
-- (its fields were folded: the writer sends what the store lacks again under a new id), 3 not
-- applied because the shard lacks what this writer saw confirmed: a sequence entry older than
-- the confirmed one, or none at all, or no catalogue (Redis restarted empty or went back in time:
-- restarted from an older RDB/AOF, a lagging replica promoted, a backup restored). The writer
-- then sends its whole state (confirmed 0), applied as it is: exact again with that one flush.
-- Status 3 too when a key or field of this writer that the store should hold is gone alone
-- (evicted under maxmemory, or deleted): its seq entry, the catalogue, an engine hash holding its
-- chunks, one chunk's values or names field. The reply's last element names what was found gone
-- ('seq', 'catalogue', 'engine', 'chunk', 'names'; and, found while applying, 'stats', 'writers',
-- 'engines', 'claims': those are rewritten by this flush or the next), so the writer can say so.
--
-- lines() comes from common.lua, which the loader puts in front of this file.
--
-- All or nothing: Redis does not roll a script back, so the script first reads and checks every
-- key it will write and every argument (phase 1, no writes), and refuses the whole batch with an
-- error reply naming the problem. Phase 2 only sets fields and scores of keys of the right type:
-- nothing in it can raise. A retry therefore never meets a half-applied batch, and a retry of an
-- applied batch sets the same values again (absolute values: idempotent by construction; the
-- sequence number still answers "already applied" without writing).

local prefix, writer = ARGV[1], ARGV[2]
local closing = ARGV[4] == '1'
local n = #ARGV

local function refuse(what)
  return redis.error_reply('ERR redis_stats flush refused, nothing written: ' .. what)
end

local function count_at(j)
  local v = ARGV[j]
  if v == nil or not string.match(v, '^%d+$') then return nil end
  return tonumber(v)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_text = tostring(now)  -- converted once (a number argument is formatted at every call)

-- ---- phase 1: read and check; no writes ------------------------------------------------------

local function wrong_type(key, kind, expected, what)
  return 'key ' .. key .. ' (' .. what .. ') is a ' .. kind .. ', not a ' .. expected ..
    '; it was not written by redis_stats: delete or rename it'
end

local function want_type(key, expected, what)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' or kind == expected then return nil end
  return wrong_type(key, kind, expected, what)
end

local seq_text = ARGV[3]
if seq_text == nil or not string.match(seq_text, '^%d+$') or #seq_text > 15 then
  return refuse('bad sequence number argument')
end
local seq = tonumber(seq_text)
local stale = tonumber(ARGV[7])
if stale == nil then return refuse('bad stale_after argument') end
local confirmed = count_at(8)
local confirmed_ms = count_at(9)
if confirmed == nil or confirmed_ms == nil or (confirmed > 0 and confirmed >= seq) then
  return refuse('bad confirmed sequence number or time argument')
end

-- A read refuses a key of another type before anything is written: no TYPE call needed for it.
local raw = redis.pcall('HGET', KEYS[1], writer)
if type(raw) == 'table' and raw.err then
  return refuse(wrong_type(KEYS[1], redis.call('TYPE', KEYS[1])['ok'], 'hash', 'sequence numbers'))
end
-- The stored format: a namespace written in another schema is refused whole (mixing formats would
-- make the other version's readers and writers miscount).
local stored_schema = redis.pcall('HGET', KEYS[4], 'schema')
if type(stored_schema) == 'table' and stored_schema.err then
  return refuse(wrong_type(KEYS[4], redis.call('TYPE', KEYS[4])['ok'], 'hash', 'catalogue'))
end
if stored_schema and stored_schema ~= ARGV[5] then
  return refuse('namespace ' .. prefix .. ' holds schema ' .. stored_schema .. ' data and this writer writes schema ' ..
    ARGV[5] .. '; run every writer and reader of a namespace at one schema version, or use a new namespace')
end
local removed = false
local had_entry = raw ~= false
if not raw and confirmed > 0 then
  -- A writer Redis confirmed batches to that the sequence hash does not know: either gc folded it
  -- (silent for longer than the retention) and dropped its tombstone since, or Redis lost this
  -- shard's data (restarted empty, or from a copy older than this writer's first flush). gc's
  -- watermark tells them apart without a tombstone that expires: gc folds every writer silent
  -- since before the watermark, so one whose batch was applied before it was folded.
  local mark = redis.call('HGET', KEYS[1], '!folded')
  removed = mark ~= false and confirmed_ms < (tonumber(mark) or 0)
end
raw = raw or '0'
-- "x<seq>:<ms>": gc removed this writer and folded its fields into the base series.
removed = removed or string.sub(raw, 1, 1) == 'x'
local last = tonumber(removed and string.match(raw, '^x(%d+)') or raw) or 0
if seq <= last then
  -- Already applied: the reply of an earlier attempt was lost. Apply nothing twice.
  return {0, now, 0, {}, 0}
end
if removed then
  -- Its absolute values would count the folded part twice: apply nothing; the writer continues
  -- under a new id and sends what the store lacks (its totals minus what was last confirmed).
  return {2, now, 0, {}, 0}
end
local function behind(lost)
  -- The store lacks what this writer saw confirmed: apply nothing (a batch carries only the chunks
  -- that changed, and their names may be gone); the writer sends its whole state with the next.
  return {3, now, 0, {}, 0, '', lost}
end
if confirmed > 0 and (not stored_schema or not had_entry) then
  -- A key of ours is gone while the rest may be there (evicted, deleted), or Redis lost it all.
  local lost = {}
  if not had_entry then lost[#lost + 1] = 'seq' end
  if not stored_schema then lost[#lost + 1] = 'catalogue' end
  return behind(lost)
end
if last < confirmed then
  -- Redis went back in time (an older RDB/AOF, a lagging replica promoted): nothing is missing
  -- that this writer could name, its entry is older than what it saw confirmed.
  return behind({})
end

-- Walk the arguments once (by counts, not by field) and check each block's keys.
local held = ARGV[10] or ''
local i = 11
local nclaims = count_at(i)
if nclaims == nil then return refuse('bad claims count') end
local claims_at = i + 1
i = claims_at + nclaims
local nstats = count_at(i)
if nstats == nil then return refuse('bad stats count') end
local stats_at = i + 1
i = stats_at + 2 * nstats
local nspecs = count_at(i)
if nspecs == nil then return refuse('bad specs count') end
local specs_at = i + 1
i = specs_at + 2 * nspecs
local nload = count_at(i)
if nload == nil then return refuse('bad load count') end
local load_at = i + 1
i = load_at + 2 * nload
local ncheck = count_at(i)
if ncheck == nil then return refuse('bad check count') end
local checks = {}
for j = i + 1, i + 3 * ncheck, 3 do
  local c = {engine = ARGV[j], held = count_at(j + 1), beat = count_at(j + 2), nset = 0, at = 1}
  if not c.held or not c.beat or not c.engine or not string.match(c.engine, '^%d+$') then
    return refuse('bad checked engine at argument ' .. j)
  end
  checks[#checks + 1] = c
end
i = i + 1 + 3 * ncheck
local blocks = {}
while i <= n do
  local b = {engine = ARGV[i], held = count_at(i + 1), nset = count_at(i + 2)}
  if not b.held or not b.nset or not string.match(b.engine, '^%d+$') then
    return refuse('bad engine block at argument ' .. i)
  end
  b.at = i + 3
  i = b.at + 2 * b.nset
  blocks[#blocks + 1] = b
end
if i ~= n + 1 then return refuse('arguments end mid-block (' .. n .. ' given)') end
if #KEYS ~= 8 + #blocks + #checks then
  return refuse(#KEYS .. ' keys for ' .. #blocks .. ' engine blocks and ' .. #checks ..
    ' checked engines (8 + one per block and checked engine expected)')
end
for j = claims_at, claims_at + nclaims - 1 do
  if not string.match(ARGV[j], '^%d+$') then return refuse('bad claimed engine ' .. ARGV[j]) end
end

-- One TYPE per key this batch writes (none per field); the keys read above need none.
local bad = want_type(KEYS[3], 'zset', 'writers')
if bad then return refuse(bad) end
if #blocks > 0 or #checks > 0 then
  bad = want_type(KEYS[2], 'zset', 'engines')
  if bad then return refuse(bad) end
end
local stats_key = KEYS[7]
local stats_lost = false
if nstats > 0 then
  local kind = redis.call('TYPE', stats_key)['ok']
  if kind ~= 'none' and kind ~= 'hash' then return refuse(wrong_type(stats_key, kind, 'hash', 'writer stats')) end
  -- Gone while the writer stored it: not behind (self-metrics are absolute, each flush sends the
  -- changed ones): applied, and the writer sends all of them with its next flush. Checked only by
  -- a flush that stores self-metrics (at least every STATS_INTERVAL, 5 s): a TYPE in every flush
  -- cost the busy flush ~5 us more.
  stats_lost = kind == 'none' and string.find(held, 's', 1, true) ~= nil
end
local nblocks = #blocks
for k, c in ipairs(checks) do blocks[nblocks + k] = c end  -- checked like blocks, set nothing
-- This writer's chunk fields (fields.chunk_field); nearly every id needs no escaping.
local head = '@|' .. (string.find(writer, '[\\|\n]') and escape(writer) or writer) .. '|'
local lost = {}
local can_hexists = true
local function field_gone(key, f)
  -- HEXISTS copies no value. A writer user of the ACL rules before issue 32 lacks +hexists: then
  -- only a whole engine hash found gone is noticed (TYPE), not one field deleted alone.
  if not can_hexists then return false end
  local r = redis.pcall('HEXISTS', key, f)
  if type(r) == 'number' then return r == 0 end
  can_hexists = false
  return false
end
for k, b in ipairs(blocks) do
  if b.nset > 0 or b.held > 0 then
    b.key = KEYS[8 + k]
    local kind = redis.call('TYPE', b.key)['ok']
    if kind ~= 'none' and kind ~= 'hash' then
      return refuse(wrong_type(b.key, kind, 'hash', 'series of engine ' .. b.engine))
    end
    if b.held > 0 and kind == 'none' then
      lost[#lost + 1] = 'engine'
    elseif b.held > 0 and #lost == 0 then
      -- Every chunk field the store should hold and this batch does not set, checked one by one
      -- (HEXISTS copies no value): a field deleted alone would leave values without their names
      -- (bad_chunk, for good: names are sent only when they change) or a series missing.
      local setting = {}
      for j = b.at, b.at + 2 * b.nset - 1, 2 do setting[ARGV[j]] = true end
      for x = 0, b.held - 1 do
        local f = head .. x
        if not setting[f] and field_gone(b.key, f) then lost[#lost + 1] = 'chunk'; break end
        if not setting[f .. '|n'] and field_gone(b.key, f .. '|n') then lost[#lost + 1] = 'names'; break end
      end
    end
  end
end
if #lost > 0 then return behind(lost) end
for k = #blocks, nblocks + 1, -1 do blocks[k] = nil end  -- the blocks proper: heartbeated and set

-- Claims: read now (a wrong type is refused before any write); a conflict is written below.
local claiming = nclaims > 0 and ARGV[6] ~= ''
local owner = ARGV[6]
local owner_conflicts = {}
local claimed_before = string.find(held, 'c', 1, true) ~= nil
local claims_lost = false
if claiming then
  for j = claims_at, claims_at + nclaims - 1 do
    local cur = redis.pcall('HGET', KEYS[5], ARGV[j])
    if type(cur) == 'table' and cur.err then
      return refuse(wrong_type(KEYS[5], redis.call('TYPE', KEYS[5])['ok'], 'hash', 'engine claims'))
    end
    if not cur and claimed_before then claims_lost = true end
    if cur then
      -- "<owner>|<ms>": the time follows the last '|' (older writers allowed '|' in owners).
      local other, at = string.match(cur, '^(.*)|(%d+)$')
      at = tonumber(at)
      if other and at and other ~= owner and now - at < stale then
        -- Another live instance claims this engine: two sources of "the" scheduler gauges.
        owner_conflicts[#owner_conflicts + 1] = ARGV[j]
        owner_conflicts[#owner_conflicts + 1] = other .. '|' .. owner .. '|' .. now_text
      end
    end
  end
  if #owner_conflicts > 0 then
    bad = want_type(KEYS[6], 'hash', 'engine conflicts')
    if bad then return refuse(bad) end
  end
end

-- The catalogue: decide now what to store, what conflicts, and whether _v moves.
local function shape(doc)
  -- kind, labels, buckets, mode of a stored or sent spec; nil if it is not a spec document.
  local ok, s = pcall(cjson.decode, doc)
  if not ok or type(s) ~= 'table' or type(s.kind) ~= 'string' then return nil end
  local parts = {s.kind, tostring(s.mode)}
  for _, key in ipairs({'labels', 'buckets'}) do
    local list = s[key]
    if list ~= nil and type(list) ~= 'table' then return nil end
    local items = {}
    for k, v in ipairs(list or {}) do items[k] = type(v) == 'number' and string.format('%.17g', v) or tostring(v) end
    parts[#parts + 1] = table.concat(items, '\1')
  end
  return table.concat(parts, '\2')
end

local to_store = {}
local conflicting, conflict_names = {}, {}
for j = specs_at, specs_at + 2 * nspecs - 1, 2 do
  local name, doc = ARGV[j], ARGV[j + 1]
  local cur = redis.call('HGET', KEYS[4], 'm:' .. name)
  if cur ~= doc then
    local cur_shape = cur and shape(cur)
    if not cur_shape then
      to_store[#to_store + 1] = 'm:' .. name
      to_store[#to_store + 1] = doc
    elseif cur_shape ~= shape(doc) then
      conflicting[name] = true
      conflict_names[#conflict_names + 1] = name
    end
  end
end
if #to_store > 0 then
  local v = redis.call('HGET', KEYS[4], '_v')
  if v and (not string.match(v, '^%-?%d+$') or #v > 15) then
    return refuse('field _v of key ' .. KEYS[4] .. ' (catalogue version) holds ' .. string.format('%q', v) ..
      ', not a version number; HDEL it (readers then re-read the catalogue)')
  end
end

-- ---- phase 2: write; nothing below can raise ---------------------------------------------------
-- The first write: under maxmemory an OOM aborts the script here, before anything is applied
-- (Redis refuses only a script's first write for memory, never a later one).
redis.call('HSET', KEYS[1], writer, seq_text)

if claiming then
  local claim = owner .. '|' .. now_text
  for j = claims_at, claims_at + nclaims - 1 do redis.call('HSET', KEYS[5], ARGV[j], claim) end
  if #owner_conflicts > 0 then redis.call('HSET', KEYS[6], unpack(owner_conflicts)) end
end

if nstats > 0 then
  -- Only the self-metrics that changed since the writer's last confirmed flush are sent.
  redis.call('HSET', stats_key, unpack(ARGV, stats_at, stats_at + 2 * nstats - 1))
end

if nspecs > 0 or confirmed == 0 then
  -- A whole-state batch marks the catalogue too, specs or none: a writer of no metrics (one
  -- that records only usage) is otherwise found "behind" (no catalogue) by every other flush.
  redis.call('HSET', KEYS[4], 'schema', ARGV[5])
end
if #to_store > 0 then
  redis.call('HSET', KEYS[4], unpack(to_store))
  redis.call('HINCRBY', KEYS[4], '_v', 1)
end

-- With a conflicting spec in this batch, the lines of its series are taken out of the chunks: only
-- then is a chunk read (its names come with the batch, or are the stored ones). The common path
-- passes the arguments to one HSET as they are. Not dead code: a writer's first batch carries its
-- specs with their series (it cannot know of a conflict before this reply), and so does the first
-- part of a batch sent in parts (tests/writer/test_catalog_conflict.py fails without it).
local any_conflict = #conflict_names > 0
local refused = 0

local function without_conflicts(key, from, count)
  -- {field, value} pairs of ARGV[from..] with the conflicting metrics' lines taken out.
  local given = {}
  for k = from, from + 2 * count - 1, 2 do given[ARGV[k]] = ARGV[k + 1] end
  local out = {}
  for k = from, from + 2 * count - 1, 2 do
    local f = ARGV[k]
    if string.sub(f, -2) ~= '|n' then
      -- A batch with specs carries the names of every chunk it sends (the writer's rule); the
      -- stored names are the fallback.
      local names_text = given[f .. '|n'] or redis.call('HGET', key, f .. '|n')
      local values = lines(ARGV[k + 1])
      if not names_text or #lines(names_text) ~= #values then
        refused = refused + #values  -- cannot tell which line is whose: none of it is written
      else
        local names = lines(names_text)
        local kept_names, kept_values = {}, {}
        for x = 1, #names do
          if conflicting[string.match(names[x], '^[^|]*')] then
            refused = refused + 1
          else
            kept_names[#kept_names + 1] = names[x]
            kept_values[#kept_values + 1] = values[x]
          end
        end
        out[#out + 1] = f .. '|n'
        out[#out + 1] = table.concat(kept_names, '\n')
        out[#out + 1] = f
        out[#out + 1] = table.concat(kept_values, '\n')
      end
    end
  end
  return out
end

local function hset_pairs(key, from, count)
  -- HSET {field, value} * count from ARGV[from]; in chunks: unpack() of a very long list overflows
  -- Lua's C stack.
  local args
  if any_conflict then
    args = without_conflicts(key, from, count)
    from, count = 1, #args / 2
  end
  local stop = from + 2 * count
  local j = from
  while j < stop do
    local chunk_end = math.min(j + 1000, stop)
    if args then
      redis.call('HSET', key, unpack(args, j, chunk_end - 1))
    else
      redis.call('HSET', key, unpack(ARGV, j, chunk_end - 1))
    end
    j = chunk_end
  end
end

-- What this flush finds gone and rewrites (ZADD answers how many members it added: an engine
-- holding this writer's chunks, or this writer itself once confirmed, must have been there).
local rewritten = {}
if stats_lost then rewritten[#rewritten + 1] = 'stats' end
if claims_lost then rewritten[#rewritten + 1] = 'claims' end
local engines_lost = false
for _, b in ipairs(blocks) do
  if b.nset > 0 then hset_pairs(b.key, b.at, b.nset) end
  if redis.call('ZADD', KEYS[2], now_text, b.engine) == 1 and b.held > 0 then engines_lost = true end
end
for _, c in ipairs(checks) do
  -- Not heartbeated (idle), but listed: put back at its last heartbeat if the list lost it.
  if c.beat > 0 and redis.call('ZADD', KEYS[2], 'NX', c.beat, c.engine) == 1 then engines_lost = true end
end
if engines_lost then rewritten[#rewritten + 1] = 'engines' end

local added
if closing then
  added = redis.call('ZADD', KEYS[3], '-' .. now_text, writer)
else
  added = redis.call('ZADD', KEYS[3], now_text, writer)
end
if added == 1 and confirmed > 0 then rewritten[#rewritten + 1] = 'writers' end

-- The load entries last, each stamped with the server's time (a closing writer's are deleted),
-- with pcall: the batch is applied by now, and a load hash of the wrong type (or a user without
-- the right) costs the feed this writer's entries, never the flush. The reply says why.
local load_error = ''
if nload > 0 then
  local set, gone = {}, {}
  local stamp = now_text .. ','
  for j = load_at, load_at + 2 * nload - 1, 2 do
    local f = ARGV[j] .. '|' .. writer
    if ARGV[j + 1] == '' then
      gone[#gone + 1] = f  -- a closing writer's (in every part of its closing flush)
    else
      set[#set + 1] = f
      set[#set + 1] = stamp .. ARGV[j + 1]
    end
  end
  -- In parts of 1,000 (whole pairs): unpack() of a very long list overflows Lua's C stack.
  for _, step in ipairs({{'HSET', set}, {'HDEL', gone}}) do
    local command, list = step[1], step[2]
    for j = 1, #list, 1000 do
      local r = redis.pcall(command, KEYS[8], unpack(list, j, math.min(j + 999, #list)))
      if type(r) == 'table' and r.err then load_error = r.err; break end
    end
  end
end
return {1, now, #owner_conflicts / 2, conflict_names, refused, load_error, rewritten}
