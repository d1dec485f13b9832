"""The documented least-privilege ACL rules (docs/acl.md), as the tests apply them."""

# Commands the flush script runs (HDEL: a closing writer's load entries; HEXISTS: its chunk
# fields still there), plus what redis-py needs to load a script.
WRITER = "+evalsha +script|load +time +exists +type +hget +hset +hincrby +hincrbyfloat +zadd +hdel +hexists"
# A read: MULTI + native reads + EXEC on one server, read.lua with EVALSHA_RO on a Cluster. With
# %R~ the user can read its namespace and write nothing.
# The load feed's read also lists each engine hash's field names (HKEYS, never its values); INFO
# gives the store's memory figures (redis_stats_store_*: the alerts on maxmemory).
READER = "+multi +exec +evalsha_ro +script|load +time +zrange +zscore +hget +hgetall +hkeys +info"
# gc and inspect (an operator, or the exporter with --gc-interval): gc.lua folds a departed
# writer into a live engine's base fields (TYPE, HINCRBY, HINCRBYFLOAT), and gc of a sharded
# namespace shares the engines' heartbeats between shards (ZADD).
ADMIN = (
    "+multi +exec +evalsha +evalsha_ro +script|load +time +zrange +zrangebyscore +zscore +zrem "
    "+hget +hgetall +hkeys +hdel +hset +hlen +del +set +get +pttl +type +hincrby +hincrbyfloat +zadd"
)
# The log lease (a writer that also reports with leader=lease).
LEASE = "+get +set +pexpire +incr +del"
# The usage ledger's additions (docs/acl.md): usage.lua's commands for a writer, its reads for a reader.
USAGE_WRITER = "+zrangebyscore +zrem +expireat +get +set"
USAGE_READER = "+hmget +hlen +zrevrange +get"


def rules(namespace: str, password: str, commands: str, *, read_only: bool = False) -> list[str]:
    """ACL SETUSER arguments for a user limited to one namespace."""
    # The namespace's keys, and those of its shards >= 1 (tags "<namespace>#<shard>.<salt>").
    perm = "%R~" if read_only else "~"
    patterns = [f"{perm}rs:{{{namespace}}}:*", f"{perm}rs:{{{namespace}#*}}:*"]
    return ["on", f">{password}", "resetkeys", *patterns, "resetchannels", "-@all", *commands.split()]


def every_namespace_rules(password: str) -> list[str]:
    """ACL SETUSER arguments for a reader of every namespace (``redis-stats exporter
    --all-namespaces``, docs/acl.md): the reader's commands and ``SCAN`` (to find the
    namespaces), read-only on every key of redis_stats."""
    return ["on", f">{password}", "resetkeys", "%R~rs:{*", "resetchannels", "-@all", *READER.split(), "+scan"]
