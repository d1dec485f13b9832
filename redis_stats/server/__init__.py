"""The server of views: the exporter's HTTP server over the store, one view module per path.

``Exporter(reader, **settings)`` serves them (:mod:`redis_stats.server.exporter`); each path's
view is a module of :mod:`redis_stats.server.views`.
"""

from __future__ import annotations

from redis_stats.server.exporter import Exporter
from redis_stats.server.options import ServeOptions

__all__ = ["Exporter", "ServeOptions"]
