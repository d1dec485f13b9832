"""The documented least-privilege ACL rules (docs/operations.md), as the tests apply them."""

# Commands the flush script runs, plus what redis-py needs to load a script.
WRITER = "+evalsha +script|load +time +exists +hget +hset +hincrby +hincrbyfloat +zadd"
# What the read script runs (called with EVALSHA_RO). With %R~ the user can read its namespace and
# write nothing.
READER = "+evalsha_ro +evalsha +script|load +time +zrange +zscore +hget +hgetall"
# gc and inspect (an operator, or the exporter with --gc-interval).
ADMIN = (
    "+evalsha +evalsha_ro +script|load +time +zrange +zrangebyscore +zscore +zrem +hget +hgetall +hkeys "
    "+hdel +hset +hlen +del +set +get +pttl"
)
# The log lease (a writer that also reports with leader=lease).
LEASE = "+get +set +pexpire +incr +del"


def rules(namespace: str, password: str, commands: str, *, read_only: bool = False) -> list[str]:
    """ACL SETUSER arguments for a user limited to one namespace."""
    pattern = f"{'%R' if read_only else ''}~rs:{{{namespace}}}:*"
    return ["on", f">{password}", "resetkeys", pattern, "resetchannels", "-@all", *commands.split()]
