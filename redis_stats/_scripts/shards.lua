-- redis_stats shards: note in shard 0's catalogue that a writer splits the namespace into K shards.
--
-- KEYS[1] shard 0's meta hash
-- ARGV[1] K (> 1)
--
-- meta["shards"] lists every K > 1 writers of the namespace have used ("3" or "2,3"), so that a
-- reader configured with another K still reads every shard (docs/key-schema.md, "Shards"). A new
-- K bumps the catalogue version `_v` too: readers re-read the catalogue only when `_v` changes,
-- and so learn the new shards at their next read. Returns 1 when K was new, else 0.
local stored = redis.call('HGET', KEYS[1], 'shards')
if stored and string.find(',' .. stored .. ',', ',' .. ARGV[1] .. ',', 1, true) then
  return 0
end
redis.call('HSET', KEYS[1], 'shards', stored and (stored .. ',' .. ARGV[1]) or ARGV[1])
redis.call('HINCRBY', KEYS[1], '_v', 1)
return 1
