-- redis_stats usage: add one writer's batch of usage to the ledger of one shard, exactly once.
--
-- KEYS[1] seq hash      writer -> last applied usage sequence number;
--                       "" -> the prune watermark (ms: the last heartbeat of every writer whose
--                       entry was pruned is at or before it)
-- KEYS[2] seen zset     writer -> last batch applied (ms, server time)
-- KEYS[3] conf hash     hours, days: the retention the last batch was written with
-- KEYS[4] totals hash   entity -> its all-time totals
-- KEYS[5] tenants hash  tenant -> its all-time totals (over every adapter and model)
-- KEYS[6] rank zset     tenant -> all-time prompt + generation tokens (the top tenants)
-- KEYS[7] sum string    the all-time totals of every tenant
-- KEYS[8..] the bucket hashes of the batch (entity by hour, tenant by hour, entity by day,
--           tenant by day), each once; ARGV names them by index
--
-- ARGV: writer, seq, confirmed seq (this writer's last batch here Redis confirmed applied; 0:
--       none), confirmed ms (the server time that batch was applied at), prune ms (an entry of a
--       writer silent for longer is pruned), hours, days,
--       nexpire, {key index, unix seconds} * nexpire   (EXPIREAT of each bucket hash)
--       then groups until the end: n, eh, th, ed, td (key indexes), {tenant, entity, values} * n
-- values: "<requests> <prompt> <cached prompt> <generation> <stop> <length> <abort> <error>",
-- decimal integers >= 0, added field by field to what each hash holds (absent: zeros).
--
-- Returns {status, now ms}: 1 applied, 0 already applied (a retry of a batch whose answer was
-- lost: nothing added), 2 not applied (the writer's entry was pruned while it was silent, so this
-- batch may have been applied before: the writer drops it and counts it lost, never twice),
-- 3 applied, but the store had lost this writer's entry or held an older one (Redis restarted
-- empty or from an older snapshot: what it lacks of the batches before is lost, not repaired).

local writer, seq, confirmed = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local confirmed_ms, prune_ms = tonumber(ARGV[4]), tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local stored = tonumber(redis.call('HGET', KEYS[1], writer) or '')
if stored and stored >= seq then return {0, now} end
local status = 1
if not stored and confirmed > 0 then
  local watermark = tonumber(redis.call('HGET', KEYS[1], '') or '0') or 0
  if confirmed_ms <= watermark then return {2, now} end
  status = 3
elseif stored and stored < confirmed then
  status = 3
end

-- Prune a few writers silent for longer than prune ms (one call's worth: every call prunes some).
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - prune_ms, 'WITHSCORES', 'LIMIT', 0, 16)
for j = 1, #old, 2 do
  redis.call('HDEL', KEYS[1], old[j])
  redis.call('ZREM', KEYS[2], old[j])
  local mark = tonumber(redis.call('HGET', KEYS[1], '') or '0') or 0
  if tonumber(old[j + 1]) > mark then redis.call('HSET', KEYS[1], '', old[j + 1]) end
end

-- Two value lines added field by field (a field one of them lacks counts 0).
local function plus(a, b)
  local x, y, out = {}, {}, {}
  for v in string.gmatch(a, '%d+') do x[#x + 1] = tonumber(v) end
  for v in string.gmatch(b, '%d+') do y[#y + 1] = tonumber(v) end
  for j = 1, math.max(#x, #y) do out[j] = string.format('%.0f', (x[j] or 0) + (y[j] or 0)) end
  return table.concat(out, ' ')
end

local function add(key, field, values)
  local old_text = redis.call('HGET', key, field)
  if old_text then values = plus(old_text, values) end
  redis.call('HSET', key, field, values)
  return values
end

redis.call('HSET', KEYS[3], 'hours', ARGV[6], 'days', ARGV[7])
local total = redis.call('GET', KEYS[7]) or '0'
local i = 8 + 2 * tonumber(ARGV[8])
for j = 9, i, 2 do redis.call('EXPIREAT', KEYS[tonumber(ARGV[j])], ARGV[j + 1]) end
i = i + 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local eh, th = KEYS[tonumber(ARGV[i + 1])], KEYS[tonumber(ARGV[i + 2])]
  local ed, td = KEYS[tonumber(ARGV[i + 3])], KEYS[tonumber(ARGV[i + 4])]
  i = i + 5
  for _ = 1, n do
    local tenant, entity, values = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    i = i + 3
    add(KEYS[4], entity, values)
    local sums = add(KEYS[5], tenant, values)
    add(eh, entity, values)
    add(th, tenant, values)
    add(ed, entity, values)
    add(td, tenant, values)
    local _, p, _, g = string.match(sums, '^(%d+) (%d+) (%d+) (%d+)')
    redis.call('ZADD', KEYS[6], tonumber(p) + tonumber(g), tenant)
    total = plus(total, values)
  end
end
redis.call('SET', KEYS[7], total)
redis.call('HSET', KEYS[1], writer, seq)
redis.call('ZADD', KEYS[2], now, writer)
return {status, now}
