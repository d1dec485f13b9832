"""``GET /``: the live page (``redis_stats/server/web/index.html``, one self-contained file).

It reads ``/namespaces``, ``/history`` and polls ``/snapshot`` of the namespace it shows
(docs/cli.md, "The live page"); served as it is, whatever the request's namespace (a page opened on
a namespace not served loads, and says so), with the exporter's settings the page needs (its
warning thresholds, ``--page-threshold``) in a JSON block of its own.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING

from redis_stats.server.http import Request, Response
from redis_stats.server.thresholds import Threshold, page_thresholds

if TYPE_CHECKING:
    from redis_stats.server.app import App

__all__ = ["answer", "live_page"]

SETTINGS = b"<!--settings-->"
"""Where the page's settings go, in the file: replaced by a ``<script type="application/json">``."""


@functools.cache
def _template() -> bytes:
    return (resources.files("redis_stats.server") / "web" / "index.html").read_bytes()


@functools.lru_cache(maxsize=8)
def _page(thresholds: tuple[tuple[str, Threshold], ...]) -> bytes:
    settings = json.dumps({"thresholds": page_thresholds(dict(thresholds))}, allow_nan=False)
    # Inside <script>: no "<" may end it early (the values are ours, but a script block is no place
    # to rely on that).
    settings = settings.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    block = f'<script id="settings" type="application/json">{settings}</script>'.encode()
    return _template().replace(SETTINGS, block, 1)


def live_page(thresholds: Mapping[str, Threshold] | None = None) -> bytes:
    """The page, with *thresholds* (``--page-threshold``; none: the defaults) in its settings."""
    return _page(tuple(sorted((thresholds or {}).items())))


def answer(app: App, request: Request) -> Response:
    """The page."""
    return Response(200, live_page(app.options.page_thresholds), "text/html; charset=utf-8")
