"""One request to an ASGI app (the load middleware, in front of a stand-in for vLLM's app), made as
uvicorn makes it, and its answer: what the middleware tests ask without a server."""

from __future__ import annotations

import asyncio
from typing import Any


async def asgi_request(
    app: Any, path: str, query: str = "", method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of *method* *path*?*query* asked of *app*."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": "",
        "query_string": query.encode(),
        "headers": [],
    }
    await app(scope, receive, send)
    start = sent[0]
    headers = {k.decode(): v.decode() for k, v in start.get("headers", [])}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


def asgi_get(app: Any, path: str, query: str = "", method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """:func:`asgi_request`, run to its end."""
    return asyncio.run(asgi_request(app, path, query, method))
