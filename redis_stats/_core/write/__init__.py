"""The writer's half of the core, no I/O: record (series), take (accumulator, chunks), send
exactly once (protocol, shardflow)."""
