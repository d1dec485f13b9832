"""The I/O-free core: field codec, series, accumulator and flush protocol, snapshot decoding.

Private: the public names are re-exported by :mod:`redis_stats`.
"""
