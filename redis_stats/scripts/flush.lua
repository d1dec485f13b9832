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
-- Returns {status, meta existed before (1/0), failed fields, now ms, conflicts}; status 1 applied,
-- 0 already applied (a duplicate), 2 applied without gauges because gc removed this writer.
-- Only the keys of one namespace are touched; they share one hash tag, so one Cluster slot.

local prefix, writer = ARGV[1], ARGV[2]
local seq = tonumber(ARGV[3])
local closing = ARGV[4] == '1'
local owner, stale = ARGV[6], tonumber(ARGV[7])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local meta_existed = redis.call('EXISTS', KEYS[4])

local raw = redis.call('HGET', KEYS[1], writer) or '0'
-- "x<seq>:<ms>": gc removed this writer. Its late flushes still count (deduplicated), but its
-- gauges stay gone and it is not heartbeated back to life.
local removed = string.sub(raw, 1, 1) == 'x'
local last = tonumber(removed and string.match(raw, '^x(%d+)') or raw) or 0
if seq <= last then
  -- Already applied: the reply of an earlier attempt was lost. Apply nothing twice.
  return {0, meta_existed, 0, now, 0}
end
-- The first write: under maxmemory an OOM aborts the script here, before anything is applied.
if removed then
  redis.call('HSET', KEYS[1], writer, 'x' .. seq .. string.match(raw, '(:%d+)$'))
else
  redis.call('HSET', KEYS[1], writer, seq)
end

local i = 8
local conflicts = 0
local nclaims = tonumber(ARGV[i]); i = i + 1
for _ = 1, nclaims do
  local engine = ARGV[i]; i = i + 1
  if not removed and owner ~= '' then
    local cur = redis.call('HGET', KEYS[5], engine)
    if cur then
      local sep = string.find(cur, '|', 1, true)
      local other, at = string.sub(cur, 1, sep - 1), tonumber(string.sub(cur, sep + 1))
      if other ~= owner and now - at < stale then
        -- Another live instance claims this engine: two sources of "the" scheduler gauges.
        redis.call('HSET', KEYS[6], engine, other .. '|' .. owner .. '|' .. now)
        conflicts = conflicts + 1
      end
    end
    redis.call('HSET', KEYS[5], engine, owner .. '|' .. now)
  end
end

local nstats = tonumber(ARGV[i]); i = i + 1
if nstats > 0 then
  local wkey = prefix .. 'w:' .. writer
  local args = {}
  for j = 1, 2 * nstats do args[j] = ARGV[i + j - 1] end
  redis.call('HSET', wkey, 'last_ok_ms', now, unpack(args))
end
i = i + 2 * nstats

local nspecs = tonumber(ARGV[i]); i = i + 1
local changed = false
if nspecs > 0 then
  redis.call('HSET', KEYS[4], 'schema', ARGV[5])
end
for _ = 1, nspecs do
  local f, doc = 'm:' .. ARGV[i], ARGV[i + 1]
  if redis.call('HGET', KEYS[4], f) ~= doc then
    redis.call('HSET', KEYS[4], f, doc)
    changed = true
  end
  i = i + 2
end
if changed then
  redis.call('HINCRBY', KEYS[4], '_v', 1)
end

local failed = 0
local n = #ARGV
while i <= n do
  local engine = ARGV[i]
  local nint, nfloat, ngauge = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local nhist = tonumber(ARGV[i + 4])
  i = i + 5
  local ckey = prefix .. 'e:' .. engine .. ':c'
  for _ = 1, nint do
    -- A field that already holds a float refuses HINCRBY; HINCRBYFLOAT adds integers exactly too.
    local r = redis.pcall('HINCRBY', ckey, ARGV[i], ARGV[i + 1])
    if type(r) == 'table' and r.err then
      r = redis.pcall('HINCRBYFLOAT', ckey, ARGV[i], ARGV[i + 1])
      if type(r) == 'table' and r.err then failed = failed + 1 end
    end
    i = i + 2
  end
  for _ = 1, nfloat do
    local r = redis.pcall('HINCRBYFLOAT', ckey, ARGV[i], ARGV[i + 1])
    if type(r) == 'table' and r.err then failed = failed + 1 end
    i = i + 2
  end
  if ngauge > 0 and not removed then
    local gkey = prefix .. 'e:' .. engine .. ':g'
    -- HSET in chunks: unpack() of a very long table overflows Lua's C stack.
    local stop = i + 2 * ngauge
    while i < stop do
      local args = {}
      local chunk_end = math.min(i + 1000, stop)
      for j = i, chunk_end - 1 do args[#args + 1] = ARGV[j] end
      redis.call('HSET', gkey, unpack(args))
      i = chunk_end
    end
  else
    i = i + 2 * ngauge
  end
  for _ = 1, nhist do
    local f, dsum, deltas = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
    i = i + 3
    local d = {}
    for x in string.gmatch(deltas, '%S+') do d[#d + 1] = tonumber(x) end
    local cur = {}
    local raw_cur = redis.call('HGET', ckey, f)
    if raw_cur then
      for x in string.gmatch(raw_cur, '%S+') do cur[#cur + 1] = tonumber(x) or false end
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
      out[j + 1] = string.format('%d', (cur[j + 1] or 0) + running)
    end
    redis.call('HSET', ckey, f, table.concat(out, ' '))
  end
  if removed then
    -- Keep the counters reachable, but do not make the engine look alive.
    redis.call('ZADD', KEYS[2], 'NX', 0, engine)
  else
    redis.call('ZADD', KEYS[2], now, engine)
  end
end

if removed then
  return {2, meta_existed, failed, now, conflicts}
end
if closing then
  redis.call('ZADD', KEYS[3], -now, writer)
else
  redis.call('ZADD', KEYS[3], now, writer)
end
return {1, meta_existed, failed, now, conflicts}
