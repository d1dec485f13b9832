-- BASELINE (bench only): the schema-1 flush script as it was before issue 15, kept so that
-- bench/flush_cost.py measures before and after in one run. Not used by the package.
-- redis_stats flush: apply one writer's batch atomically and exactly once.
--
-- KEYS[1] seq hash        writer id -> last applied sequence number ("x<seq>:<ms>": removed by gc)
-- KEYS[2] engines zset    engine -> last heartbeat (ms, server time)
-- KEYS[3] writers zset    writer id -> last heartbeat (ms; negative: closed at -score)
-- KEYS[4] meta hash       schema, _v (catalogue version), m:<metric> -> spec JSON
-- KEYS[5] claims hash     engine -> "<owner>|<ms>": which instance last claimed the engine
-- KEYS[6] conflicts hash  engine -> "<owner a>|<owner b>|<ms>": two live owners seen
--
-- ARGV: prefix, writer, seq, closing (0/1), schema, owner, stale ms,
--       nclaims, {engine} * nclaims,
--       nstats, {field, value} * nstats           (the writer's self-metrics, absolute values)
--       nspecs, {name, json} * nspecs,
--       then per engine: engine, nint, nfloat, ngauge, nhist,
--                        {field, int delta} * nint, {field, float delta} * nfloat,
--                        {field, "<wall ms>|<value>"} * ngauge,
--                        {field, sum delta, "<d0> <d1> ... <dN>"} * nhist
--
-- A histogram series is one field: "<sum> <c0> <c1> ... <cN>", cumulative bucket counts (+Inf
-- last, so it is also the count).
--
-- Returns {status, meta existed before (1/0), failed fields, now ms, owner conflicts,
--          {metrics whose spec conflicts with the stored one}, series refused for them};
-- status 1 applied, 0 already applied (a duplicate), 2 applied without gauges because gc removed
-- this writer. Only the keys of one namespace are touched; they share one hash tag, so one
-- Cluster slot.
--
-- All or nothing: Redis does not roll a script back, so the script first reads and checks every
-- key it will write and every argument (phase 1, no writes), and refuses the whole batch with an
-- error reply naming the problem. Phase 2 writes, and nothing in it can raise: every key has the
-- right type, every number was checked, and the increments that depend on a field's content run
-- under pcall with a fallback. A retry therefore never meets a half-applied batch.
--
-- The catalogue: the first stored definition of a metric wins. A spec that differs from the
-- stored one in kind, labels, buckets or gauge mode is not stored; it is named in the reply and
-- this batch's series of that metric are not written (they would be read under the stored
-- definition's labels). A spec that differs only in its help text is ignored.

local prefix, writer = ARGV[1], ARGV[2]
local closing = ARGV[4] == '1'
local n = #ARGV

local function refuse(what)
  return redis.error_reply('ERR redis_stats flush refused, nothing written: ' .. what)
end

local function count_at(j)
  -- A count argument: a small non-negative integer (anything else is a writer bug).
  local v = ARGV[j]
  if v == nil or not string.match(v, '^%d+$') then return nil end
  return tonumber(v)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- ---- phase 1: read and check; no writes ------------------------------------------------------

local function want_type(key, expected, what)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' or kind == expected then return nil end
  return 'key ' .. key .. ' (' .. what .. ') is a ' .. kind .. ', not a ' .. expected ..
    '; it was not written by redis_stats: delete or rename it'
end

local seq_text = ARGV[3]
if seq_text == nil or not string.match(seq_text, '^%d+$') or #seq_text > 15 then
  return refuse('bad sequence number argument')
end
local seq = tonumber(seq_text)
local stale = tonumber(ARGV[7])
if stale == nil then return refuse('bad stale_after argument') end

local bad = want_type(KEYS[1], 'hash', 'sequence numbers')
if bad then return refuse(bad) end
local meta_existed = redis.call('EXISTS', KEYS[4])

local raw = redis.call('HGET', KEYS[1], writer) or '0'
-- "x<seq>:<ms>": gc removed this writer. Its late flushes still count (deduplicated), but its
-- gauges stay gone and it is not heartbeated back to life.
local removed = string.sub(raw, 1, 1) == 'x'
local last = tonumber(removed and string.match(raw, '^x(%d+)') or raw) or 0
if seq <= last then
  -- Already applied: the reply of an earlier attempt was lost. Apply nothing twice.
  return {0, meta_existed, 0, now, 0, {}, 0}
end

-- Walk the arguments once (by counts, not by field) and check each block's keys.
local i = 8
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
local blocks = {}
while i <= n do
  local b = {engine = ARGV[i], nint = count_at(i + 1), nfloat = count_at(i + 2),
             ngauge = count_at(i + 3), nhist = count_at(i + 4)}
  if not (b.nint and b.nfloat and b.ngauge and b.nhist) or not string.match(b.engine, '^%d+$') then
    return refuse('bad engine block at argument ' .. i)
  end
  b.at = i + 5
  i = b.at + 2 * (b.nint + b.nfloat + b.ngauge) + 3 * b.nhist
  blocks[#blocks + 1] = b
end
if i ~= n + 1 then return refuse('arguments end mid-block (' .. n .. ' given)') end
for j = claims_at, claims_at + nclaims - 1 do
  if not string.match(ARGV[j], '^%d+$') then return refuse('bad claimed engine ' .. ARGV[j]) end
end

local claiming = nclaims > 0 and not removed and ARGV[6] ~= ''
local checks = {}
if #blocks > 0 then checks[#checks + 1] = {KEYS[2], 'zset', 'engines'} end
if not removed then checks[#checks + 1] = {KEYS[3], 'zset', 'writers'} end
if nspecs > 0 then checks[#checks + 1] = {KEYS[4], 'hash', 'catalogue'} end
if claiming then
  checks[#checks + 1] = {KEYS[5], 'hash', 'engine claims'}
  checks[#checks + 1] = {KEYS[6], 'hash', 'engine conflicts'}
end
if nstats > 0 then checks[#checks + 1] = {prefix .. 'w:' .. writer, 'hash', 'writer stats'} end
for _, b in ipairs(blocks) do
  if b.nint + b.nfloat + b.nhist > 0 then
    checks[#checks + 1] = {prefix .. 'e:' .. b.engine .. ':c', 'hash', 'counters of engine ' .. b.engine}
  end
  if b.ngauge > 0 and not removed then
    checks[#checks + 1] = {prefix .. 'e:' .. b.engine .. ':g', 'hash', 'gauges of engine ' .. b.engine}
  end
end
for _, c in ipairs(checks) do
  bad = want_type(c[1], c[2], c[3])
  if bad then return refuse(bad) end
end

-- The catalogue: decide now what to store, what conflicts, and whether _v moves.
local function shape(doc)
  -- kind, labels, buckets, mode of a stored or sent spec; nil if it is not a spec document.
  local ok, t = pcall(cjson.decode, doc)
  if not ok or type(t) ~= 'table' or type(t.kind) ~= 'string' then return nil end
  local parts = {t.kind, tostring(t.mode)}
  for _, key in ipairs({'labels', 'buckets'}) do
    local list = t[key]
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
      -- Nothing stored (or garbage that no reader can use): this definition is the first.
      to_store[#to_store + 1] = 'm:' .. name
      to_store[#to_store + 1] = doc
    elseif cur_shape ~= shape(doc) then
      conflicting[name] = true
      conflict_names[#conflict_names + 1] = name
    end
    -- else: only the help text differs; the first stored definition stays.
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
if removed then
  redis.call('HSET', KEYS[1], writer, 'x' .. seq .. (string.match(raw, '(:%d+)$') or ':0'))
else
  redis.call('HSET', KEYS[1], writer, seq)
end

local owner_conflicts = 0
if claiming then
  local owner = ARGV[6]
  for j = claims_at, claims_at + nclaims - 1 do
    local engine = ARGV[j]
    local cur = redis.call('HGET', KEYS[5], engine)
    if cur then
      -- "<owner>|<ms>": the time follows the last '|' (older writers allowed '|' in owners).
      local other, at = string.match(cur, '^(.*)|(%d+)$')
      at = tonumber(at)
      if other and at and other ~= owner and now - at < stale then
        -- Another live instance claims this engine: two sources of "the" scheduler gauges.
        redis.call('HSET', KEYS[6], engine, other .. '|' .. owner .. '|' .. now)
        owner_conflicts = owner_conflicts + 1
      end
    end
    redis.call('HSET', KEYS[5], engine, owner .. '|' .. now)
  end
end

if nstats > 0 then
  local args = {}
  for j = 1, 2 * nstats do args[j] = ARGV[stats_at + j - 1] end
  redis.call('HSET', prefix .. 'w:' .. writer, 'last_ok_ms', now, unpack(args))
end

if nspecs > 0 then
  redis.call('HSET', KEYS[4], 'schema', ARGV[5])
end
if #to_store > 0 then
  for j = 1, #to_store, 2 do redis.call('HSET', KEYS[4], to_store[j], to_store[j + 1]) end
  redis.call('HINCRBY', KEYS[4], '_v', 1)
end

-- With a conflicting spec in this batch, its series are left out (only then is a field's metric
-- name looked at: the common path tests one local boolean per field).
local any_conflict = #conflict_names > 0
local refused = 0
local function keep(f)
  if conflicting[string.match(f, '^[^|]*')] then
    refused = refused + 1
    return false
  end
  return true
end

local failed = 0
for _, b in ipairs(blocks) do
  local engine = b.engine
  local ckey = prefix .. 'e:' .. engine .. ':c'
  i = b.at
  for _ = 1, b.nint do
    if not any_conflict or keep(ARGV[i]) then
      -- A field that already holds a float refuses HINCRBY; HINCRBYFLOAT adds integers exactly too.
      local r = redis.pcall('HINCRBY', ckey, ARGV[i], ARGV[i + 1])
      if type(r) == 'table' and r.err then
        r = redis.pcall('HINCRBYFLOAT', ckey, ARGV[i], ARGV[i + 1])
        if type(r) == 'table' and r.err then failed = failed + 1 end
      end
    end
    i = i + 2
  end
  for _ = 1, b.nfloat do
    if not any_conflict or keep(ARGV[i]) then
      local r = redis.pcall('HINCRBYFLOAT', ckey, ARGV[i], ARGV[i + 1])
      if type(r) == 'table' and r.err then failed = failed + 1 end
    end
    i = i + 2
  end
  if b.ngauge > 0 and not removed then
    local gkey = prefix .. 'e:' .. engine .. ':g'
    -- HSET in chunks: unpack() of a very long table overflows Lua's C stack.
    local stop = i + 2 * b.ngauge
    while i < stop do
      local args = {}
      local chunk_end = math.min(i + 1000, stop)
      for j = i, chunk_end - 1, 2 do
        if not any_conflict or keep(ARGV[j]) then
          args[#args + 1] = ARGV[j]
          args[#args + 1] = ARGV[j + 1]
        end
      end
      if #args > 0 then redis.call('HSET', gkey, unpack(args)) end
      i = chunk_end
    end
  else
    i = i + 2 * b.ngauge
  end
  for _ = 1, b.nhist do
    local f, dsum, deltas = ARGV[i], tonumber(ARGV[i + 1]) or 0, ARGV[i + 2]
    i = i + 3
    if not any_conflict or keep(f) then
      local d = {}
      for x in string.gmatch(deltas, '%S+') do d[#d + 1] = tonumber(x) or 0 end
      local cur = {}
      local raw_cur = redis.call('HGET', ckey, f)
      if raw_cur then
        for x in string.gmatch(raw_cur, '%S+') do
          local v = tonumber(x)
          -- Only finite numbers count (tonumber also reads "nan" and "inf"; v - v is NaN for them).
          cur[#cur + 1] = (v and v - v == 0) and v or false
        end
        if #cur ~= #d + 1 then cur = {} end
        for j = 1, #cur do
          if not cur[j] then cur = {}; break end
        end
        if #cur == 0 then failed = failed + 1 end  -- garbage there: start the series again
      end
      -- Stored cumulative (bucket j counts every observation <= its bound), so that a reader can
      -- print the stored numbers as they are; the batch carries per-bucket increases.
      local out = {string.format('%.17g', (cur[1] or 0) + dsum)}
      local running = 0
      for j = 1, #d do
        running = running + d[j]
        -- '%d' (cheaper than '%.17g' here): counts are integers; Lua 5.1 casts, never raises.
        out[j + 1] = string.format('%d', (cur[j + 1] or 0) + running)
      end
      redis.call('HSET', ckey, f, table.concat(out, ' '))
    end
  end
  if removed then
    -- Keep the counters reachable, but do not make the engine look alive.
    redis.call('ZADD', KEYS[2], 'NX', 0, engine)
  else
    redis.call('ZADD', KEYS[2], now, engine)
  end
end

if removed then
  return {2, meta_existed, failed, now, owner_conflicts, conflict_names, refused}
end
if closing then
  redis.call('ZADD', KEYS[3], -now, writer)
else
  redis.call('ZADD', KEYS[3], now, writer)
end
return {1, meta_existed, failed, now, owner_conflicts, conflict_names, refused}
