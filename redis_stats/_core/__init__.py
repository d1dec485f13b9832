"""The I/O-free core: ``write/`` is the writer's half (series, accumulator, chunks, the flush
protocol), ``read/`` the reader's (decoding a read, its arithmetic, liveness, slices); the step
runner (steps) and the lease decisions (lease) serve both. Every stored text is
:mod:`redis_stats.codec`'s; what every loop of the package shares (a background thread's survival,
its outages in the log) is :mod:`redis_stats.background`'s and :mod:`redis_stats.outage`'s.

Private: the public names are re-exported by :mod:`redis_stats`.
"""
