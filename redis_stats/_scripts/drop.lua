-- redis_stats drop: remove keys of one shard of a namespace, unless a writer is live there.
--
-- KEYS[1] the shard's writers zset; KEYS[2..] the other keys of the shard to remove (every one
--   carries the shard's hash tag, so on a Cluster they are all on the slot of KEYS[1])
-- ARGV: stale_after ms, dry run (0/1), last call for this shard (0/1: then KEYS[1] goes too)
-- Returns {1, keys removed (dry run: keys that exist)}, or {0, {live writer ids}} and removes
-- nothing.
--
-- The check and the removal are one atomic call: a writer cannot flush between them. A writer
-- is live when its heartbeat (server time, ms; negative once closed) is within stale_after of
-- the server's clock now (a heartbeat ahead of it counts as live). KEYS[1] is removed by the
-- last call only, so every earlier call of a namespace with many keys checks the writers again.

local stale, dry, last = tonumber(ARGV[1]), ARGV[2] == '1', ARGV[3] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local live = {}
local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for j = 1, #all, 2 do
  local beat = tonumber(all[j + 1])
  if beat and beat >= 0 and now - beat <= stale then live[#live + 1] = all[j] end
end
if #live > 0 then return {0, live} end

local first = last and 1 or 2
local n = 0
for i = first, #KEYS do
  if dry then
    -- TYPE, not EXISTS: the stats-admin ACL user of docs/acl.md has +type.
    if redis.call('TYPE', KEYS[i]).ok ~= 'none' then n = n + 1 end
  else
    n = n + redis.call('DEL', KEYS[i])
  end
end
return {1, n}
