"""UsageMiddleware: the tenant of every chat and completion request, for the usage ledger.

    REDIS_STATS_URL=redis://... REDIS_STATS_TENANT_HEADER=x-tenant-id \\
    vllm serve M --middleware redis_stats.integrations.vllm.usage_middleware.UsageMiddleware

A pure-ASGI middleware; vLLM adds ``--middleware`` classes last, so it runs outermost. For a
``POST`` to ``/v1/chat/completions`` or ``/v1/completions`` it reads the body (kept and handed on
unchanged), makes sure the request carries an ``X-Request-Id`` (vLLM names the engine request
``chatcmpl-<id>`` after it; a fresh one when the client sent none, a suffixed one when a request of
that id is in flight here), opens the request's entry in the plugin's :class:`UsageJoin`, and
closes it when the response ends, knowing whether the client left first. Every other request
passes untouched, as does every request while the plugin records no usage
(``REDIS_STATS_TENANT_HEADER`` unset).

At its first request it also watches vLLM's aborts (:func:`watch_aborts`): a request aborted
because its client left never reaches the stat loggers, so its tokens are taken from the output
processor's state of it as vLLM aborts it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from redis_stats.integrations.vllm.usage_join import DECODE, PREFILL, WHOLE, UsageJoin

__all__ = ["PATHS", "UsageMiddleware", "legs", "register_join", "watch_aborts"]

log = logging.getLogger("vllm.redis_stats")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PATHS = ("/v1/chat/completions", "/v1/completions")
"""The endpoints whose engine ids carry the ``X-Request-Id`` (``chatcmpl-``, ``cmpl-``)."""

_REQUEST_ID = b"x-request-id"
_MAX_N = 1024  # a body's n beyond this is not believed (vLLM refuses it anyway)

_registered: UsageJoin | None = None


def register_join(join: UsageJoin | None) -> None:
    """Make *join* the one :class:`UsageMiddleware` feeds (the vLLM plugin's, when it records
    usage; None: the middleware passes everything through)."""
    global _registered
    _registered = join


def legs(body: Any) -> str:
    """The leg of a request from its body's ``kv_transfer_params``: :data:`PREFILL`
    (``do_remote_decode``: a prefill pod's leg), :data:`DECODE` (``do_remote_prefill``) or
    :data:`WHOLE`."""
    params = body.get("kv_transfer_params") if isinstance(body, dict) else None
    if not isinstance(params, dict):
        return WHOLE
    if params.get("do_remote_decode"):
        return PREFILL
    if params.get("do_remote_prefill"):
        return DECODE
    return WHOLE


def _expected(body: Any, path: str) -> int | None:
    """Engine records the request will give: n per prompt (None when the body says no clear n)."""
    if not isinstance(body, dict):
        return None
    n = body.get("n", 1)
    if n is None:
        n = 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= _MAX_N:
        return None
    if path.endswith("/chat/completions"):
        return n
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not all(isinstance(t, int) for t in prompt):
        return n * len(prompt)  # a list of prompts (texts or token lists): one engine id each
    return n


def watch_aborts(app: Any, join: UsageJoin) -> bool:
    """Hand every engine request vLLM's output processor aborts to ``join.aborted``, with the
    tokens it had then (``prompt_len``, ``num_cached_tokens``, ``stats.num_generation_tokens``).

    Reads vLLM's ``app.state.engine_client.output_processor`` (0.20-0.34: ``request_states``
    and ``abort_requests(request_ids, internal)``) and wraps that instance's ``abort_requests``;
    False (and nothing changed) when they are not there."""
    try:
        processor = app.state.engine_client.output_processor
        original = processor.abort_requests
        processor.request_states.items  # noqa: B018 - the table it pops from
    except AttributeError:
        return False
    if getattr(original, "_redis_stats_join", None) is join:
        return True
    depth = [0]

    def abort_requests(request_ids: Any, *args: Any, **kwargs: Any) -> Any:
        if depth[0]:  # a parent's abort aborting its children: the outer call counts them
            return original(request_ids, *args, **kwargs)
        before = dict(processor.request_states)
        depth[0] += 1
        try:
            return original(request_ids, *args, **kwargs)
        finally:
            depth[0] -= 1
            after = processor.request_states
            for rid, state in before.items():
                if rid not in after:
                    _report_abort(join, state)

    abort_requests._redis_stats_join = join  # type: ignore[attr-defined]
    processor.abort_requests = abort_requests
    return True


def _report_abort(join: UsageJoin, state: Any) -> None:
    try:
        stats = getattr(state, "stats", None)
        join.aborted(
            getattr(state, "external_req_id", None),
            int(getattr(state, "prompt_len", 0) or 0),
            int(getattr(state, "num_cached_tokens", 0) or 0),
            int(getattr(stats, "num_generation_tokens", 0) or 0),
        )
    except Exception as exc:  # never an exception into vLLM's abort
        log.warning(
            "redis_stats: an aborted request's usage was not recorded: %s: %s", type(exc).__name__, exc
        )


class UsageMiddleware:
    """The module docstring's middleware. *join*: whose entries (default: the vLLM plugin's of
    this process, :func:`register_join`)."""

    def __init__(self, app: ASGIApp, join: UsageJoin | None = None) -> None:
        self.app = app
        self.join = join
        self._watching: UsageJoin | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI: chat and completion requests joined, everything else passed on."""
        join = self.join if self.join is not None else _registered
        if (
            join is None
            or scope.get("type") != "http"
            or scope.get("method") != "POST"
            or not _joined_path(scope)
        ):
            await self.app(scope, receive, send)
            return
        if self._watching is not join:
            self._watching = join
            if not watch_aborts(scope.get("app"), join):
                log.warning(
                    "redis_stats: vLLM's output processor is not where this version looks for it: a "
                    "request whose client leaves is counted as aborted without its tokens"
                )
        await self._joined(join, scope, receive, send)

    async def _joined(self, join: UsageJoin, scope: Scope, receive: Receive, send: Send) -> None:
        messages, body = await _read_body(receive)
        try:
            key, scope = _open(join, scope, body)
        except Exception as exc:  # never a failed request for the ledger's sake
            key = None
            log.warning("redis_stats: a request is not joined to its tenant: %s: %s", type(exc).__name__, exc)
        if key is None:  # the table is full (or the entry failed): not joined
            await self.app(scope, _replay(messages, receive), send)
            return
        # a disconnect seen while the body was read counts as one
        state: dict[str, Any] = {
            "status": None,
            "done": False,
            "gone": any(m.get("type") == "http.disconnect" for m in messages),
        }

        async def watched_receive() -> Message:
            message = messages.pop(0) if messages else await receive()
            if message.get("type") == "http.disconnect" and not state["done"]:
                state["gone"] = True
            return message

        async def watched_send(message: Message) -> None:
            if message.get("type") == "http.response.start":
                state["status"] = int(message.get("status", 0))
            try:
                await send(message)
            except OSError:  # the client is gone (starlette's ClientDisconnect is one)
                state["gone"] = True
                raise
            if message.get("type") == "http.response.body" and not message.get("more_body"):
                state["done"] = True

        try:
            await self.app(scope, watched_receive, watched_send)
        except BaseException:
            state["gone"] = state["gone"] or state["status"] is not None
            raise
        finally:
            _close(join, key, state["status"], bool(state["gone"] and not state["done"]))


def _joined_path(scope: Scope) -> str | None:
    """The one of :data:`PATHS` *scope* asks for (under vLLM's ``--root-path`` too), or None."""
    path = scope.get("path", "")
    if path in PATHS:
        return str(path)
    root = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) :] in PATHS:
        return str(path[len(root) :])
    return None


def _open(join: UsageJoin, scope: Scope, body: bytes) -> tuple[str | None, Scope]:
    """Open *scope*'s entry in *join*: (its key, the scope to hand on, with the key as its
    ``X-Request-Id``), or (None, *scope*) when the table is full."""
    try:
        parsed: Any = json.loads(body) if body else None
    except ValueError:
        parsed = None  # vLLM answers 400; the request is counted as an error
    headers = list(scope.get("headers") or ())
    sent_id, tenant = _headers(headers, join.tenant_header.encode("latin-1"))
    key = join.open(
        sent_id or os.urandom(16).hex(),
        tenant,
        _adapter(scope, parsed, join.model),
        leg=legs(parsed),
        expected=_expected(parsed, _joined_path(scope) or ""),
    )
    if key is None or key == sent_id:
        return key, scope
    headers = [(k, v) for k, v in headers if k.lower() != _REQUEST_ID]
    headers.append((_REQUEST_ID, key.encode("latin-1")))
    return key, dict(scope, headers=headers)


def _close(join: UsageJoin, key: str, status: int | None, disconnected: bool) -> None:
    """Close *key*'s entry and have the join swept once its grace has passed (never raises)."""
    try:
        if join.close(key, status, disconnected=disconnected):
            asyncio.get_running_loop().call_later(join.grace + 0.1, join.sweep)
    except Exception as exc:
        log.warning("redis_stats: a request's entry did not close: %s: %s", type(exc).__name__, exc)


async def _read_body(receive: Receive) -> tuple[list[Message], bytes]:
    """The request's messages up to the end of its body (or a disconnect), and the body."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message.get("type") != "http.request":
            break
        chunks.append(bytes(message.get("body", b"")))
        if not message.get("more_body"):
            break
    return messages, b"".join(chunks)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that gives *messages* again, then the real ones."""

    async def replayed() -> Message:
        if messages:
            return messages.pop(0)
        return await receive()

    return replayed


def _headers(headers: list[tuple[bytes, bytes]], tenant: bytes) -> tuple[str | None, str | None]:
    """The first ``X-Request-Id`` and the first *tenant* header (lower case) of *headers*, each
    None when absent or empty, in one pass."""
    found: dict[bytes, str | None] = {}
    for key, value in headers:
        name = key.lower()
        if (name == _REQUEST_ID or name == tenant) and name not in found:
            found[name] = value.decode("latin-1").strip() or None
    return found.get(_REQUEST_ID), found.get(tenant) if tenant else None


def _adapter(scope: Scope, body: Any, base: str) -> str | None:
    """The LoRA adapter a body names: its ``model`` when that is not a base model of the server
    (vLLM's ``openai_serving_models.is_base_model``, else the plugin's served name)."""
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, str) or not model or model == base:
        return None
    try:
        if scope["app"].state.openai_serving_models.is_base_model(model):
            return None
    except Exception:
        pass
    return model
