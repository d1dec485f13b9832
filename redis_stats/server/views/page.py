"""``GET /``: the live page (``redis_stats/server/web/index.html``, one self-contained file).

It reads ``/namespaces`` and polls ``/snapshot`` of the namespace it shows (docs/cli.md, "The live
page"); served as it is, whatever the request's namespace (a page opened on a namespace not served
loads, and says so).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import TYPE_CHECKING

from redis_stats.server.http import Request, Response

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["answer", "live_page"]


@functools.cache
def live_page() -> bytes:
    """The page (package data; read once, never changes)."""
    return (resources.files("redis_stats.server") / "web" / "index.html").read_bytes()


def answer(app: App, request: Request) -> Response:
    """The page."""
    return Response(200, live_page(), "text/html; charset=utf-8")
