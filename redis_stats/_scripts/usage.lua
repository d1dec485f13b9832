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

-- Every key's type first: a script is not rolled back when a command fails, so a key of the wrong
-- type met half-way would leave the batch half applied (and its retry would add that half again).
local want = {'hash', 'zset', 'hash', 'hash', 'hash', 'zset', 'string'}
for j = 1, #KEYS do
  local kind = redis.call('TYPE', KEYS[j])['ok']
  if kind ~= 'none' and kind ~= (want[j] or 'hash') then
    return redis.error_reply('usage: key ' .. KEYS[j] .. ' is a ' .. kind .. ', not a ' .. (want[j] or 'hash') ..
      '; nothing was applied: delete it (DEL) and the batch goes again')
  end
end

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

-- A value line as numbers (the batch's are parsed once, then added to each hash's line).
local function numbers(text)
  local out = {}
  for v in string.gmatch(text, '%d+') do out[#out + 1] = tonumber(v) end
  return out
end

-- A stored value line plus numbers, field by field (a field one of them lacks counts 0).
local function plus(text, add)
  local out, j = {}, 0
  for v in string.gmatch(text, '%d+') do
    j = j + 1
    local x = tonumber(v) + (add[j] or 0)
    out[j] = x == 0 and '0' or string.format('%.0f', x)
  end
  for k = j + 1, #add do out[k] = add[k] == 0 and '0' or string.format('%.0f', add[k]) end
  return table.concat(out, ' ')
end

local function add(key, field, values, nums)
  local old_text = redis.call('HGET', key, field)
  if old_text then values = plus(old_text, nums) end
  redis.call('HSET', key, field, values)
  return values
end

redis.call('HSET', KEYS[3], 'hours', ARGV[6], 'days', ARGV[7])
local total_n = {}
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
    local nums = numbers(values)
    i = i + 3
    add(KEYS[4], entity, values, nums)
    local sums = add(KEYS[5], tenant, values, nums)
    add(eh, entity, values, nums)
    add(th, tenant, values, nums)
    add(ed, entity, values, nums)
    add(td, tenant, values, nums)
    local _, p, _, g = string.match(sums, '^(%d+) (%d+) (%d+) (%d+)')
    redis.call('ZADD', KEYS[6], tonumber(p) + tonumber(g), tenant)
    for k = 1, #nums do total_n[k] = (total_n[k] or 0) + nums[k] end
  end
end
redis.call('SET', KEYS[7], plus(redis.call('GET', KEYS[7]) or '0', total_n))
redis.call('HSET', KEYS[1], writer, seq)
redis.call('ZADD', KEYS[2], now, writer)
return {status, now}
