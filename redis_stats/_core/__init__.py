"""The I/O-free core: ``write/`` is the writer's half (series, accumulator, chunks, the flush
protocol), ``read/`` the reader's (decoding a read, its arithmetic, liveness, slices); the
threads' survival (background), the step runner (steps) and the lease decisions (lease) serve
both. Every stored text is :mod:`redis_stats.codec`'s.

Private: the public names are re-exported by :mod:`redis_stats`.
"""
