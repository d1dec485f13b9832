"""A body in the shape of vLLM's Rust front end's ``/metrics`` (``vllm-rs`` 0.34, issue 40).

``vllm-rs`` has no CPU build and cannot run here. What its ``/metrics`` looks like, as read in
its sources and its binary (the ``vllm/vllm-rs`` of the vllm 0.34.0 wheel):

- served by the Rust ``prometheus-client`` crate's OpenMetrics encoder, whatever the request's
  Accept header says: ``Content-Type: application/openmetrics-text; version=1.0.0;
  charset=utf-8``, counters as ``<name>_total``, ``# EOF`` at the end;
- every per-engine family labelled ``model_name`` then ``engine`` (``EngineLabels`` in
  ``rust/src/metrics/src/scheduler.rs``), a family's own label after them (``reason``, ``stage``,
  ``sleep_state``, ``status``, ``position``, ``source``: the label structs named in the binary);
- the four families 0.34 adds to 0.33's (the family names in the two binaries' strings):
  ``vllm:cache_config_info`` (``Information of the LLMEngine CacheConfig``; its labels the engine
  core's ``cache_config_info`` map of the handshake, value 1), ``vllm:engine_sleep_state``
  (``sleep_state``), ``vllm:num_requests_kv_fetch_by_stage`` (``stage``), and the counter
  ``vllm:watermark_requests`` (``status``);
- help texts as the binary holds them (some end without the period Python's have).

:func:`body` renders engines' numbers in that shape; :class:`VllmRs` serves them over HTTP with
the OpenAI completion route (streamed too) and a WebSocket echo, a stand-in for the front end
behind a proxy, keeping what the proxy passed on.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@dataclass
class Engine:
    """One engine's numbers, as vllm-rs exports them."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    num_gpu_blocks: int = 2048
    block_size: int = 16
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    awake: int = 1
    kv_fetch: dict[str, int] = field(
        default_factory=lambda: {"waiting_to_start": 0, "in_progress": 0, "completed_waiting": 0}
    )
    watermarked: int = 0


def body(engines: dict[int, Engine], model: str = "m") -> str:
    """The OpenMetrics text vllm-rs 0.34 serves for *engines* (index -> numbers)."""
    out: list[str] = []

    def family(name: str, kind: str, help_text: str, rows: list[tuple[str, float]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        suffix = "_total" if kind == "counter" else ""
        out.extend(f"{name}{suffix}{{{labels}}} {value}" for labels, value in rows)

    def each(extra: str = "") -> list[str]:
        return [f'model_name="{model}",engine="{e}"{extra}' for e in sorted(engines)]

    es = [engines[e] for e in sorted(engines)]
    family(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches",
        list(zip(each(), [e.running for e in es])),
    )
    family(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed",
        list(zip(each(), [e.waiting for e in es])),
    )
    family(
        "vllm:num_requests_kv_fetch_by_stage",
        "gauge",
        "Number of waiting requests by async KV load stage. Stage labels: 'waiting_to_start' = needs an "
        "async KV load that has not started; 'in_progress' = load started and not yet reported finished; "
        "'completed_waiting' = load finished, request not running yet.",
        [
            (f'model_name="{model}",engine="{i}",stage="{stage}"', n)
            for i in sorted(engines)
            for stage, n in engines[i].kv_fetch.items()
        ],
    )
    family(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage",
        list(zip(each(), [e.kv_usage for e in es])),
    )
    family(
        "vllm:engine_sleep_state",
        "gauge",
        "Engine sleep state; awake = 0 means engine is sleeping; "
        "awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 "
        "means sleep level 2.",
        [
            (f'model_name="{model}",engine="{i}",sleep_state="{state}"', value)
            for i in sorted(engines)
            for state, value in (
                ("awake", engines[i].awake),
                ("weights_offloaded", 1 - engines[i].awake),
                ("discard_all", 0),
            )
        ],
    )
    family(
        "vllm:cache_config_info",
        "gauge",
        "Information of the LLMEngine CacheConfig",
        [
            (
                f'engine="{i}",block_size="{engines[i].block_size}",cache_dtype="auto",'
                f'enable_prefix_caching="True",num_gpu_blocks="{engines[i].num_gpu_blocks}"',
                1,
            )
            for i in sorted(engines)
        ],
    )
    family(
        "vllm:prefix_cache_queries",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens",
        list(zip(each(), [e.prefix_queries for e in es])),
    )
    family(
        "vllm:prefix_cache_hits",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        list(zip(each(), [e.prefix_hits for e in es])),
    )
    family(
        "vllm:prompt_tokens",
        "counter",
        "Number of prefill tokens processed.",
        list(zip(each(), [e.prompt_tokens for e in es])),
    )
    family(
        "vllm:generation_tokens",
        "counter",
        "Number of generation tokens processed.",
        list(zip(each(), [e.generation_tokens for e in es])),
    )
    family(
        "vllm:watermark_requests",
        "counter",
        "Finished requests by watermark status (only with watermark_config).",
        [
            (f'model_name="{model}",engine="{i}",status="{status}"', n)
            for i in sorted(engines)
            for status, n in (("watermarked", engines[i].watermarked), ("skipped", 0), ("not_watermarked", 0))
        ],
    )
    out.append("# EOF")
    return "\n".join(out) + "\n"


@dataclass
class Seen:
    """One request as the stand-in received it: what a proxy in front passed on."""

    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes
    connection: int = 0
    """The connection it came on (its index in :attr:`VllmRs.raw`)."""

    def header(self, name: str) -> list[str]:
        """Every value of header *name* (any case)."""
        return [v for k, v in self.headers if k.lower() == name.lower()]


WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC11B65"


def ws_accept(key: str) -> str:
    """The ``Sec-WebSocket-Accept`` answering *key* (RFC 6455, 4.2.2)."""
    return base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()


def ws_frame(payload: bytes, opcode: int = 1, mask: bool = False) -> bytes:
    """One final WebSocket frame (a client's is masked)."""
    head = bytes([0x80 | opcode])
    n = len(payload)
    bit = 0x80 if mask else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 1 << 16:
        head += bytes([bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def ws_read(read: Callable[[int], bytes]) -> tuple[int, bytes]:
    """(opcode, payload) of the next frame, *read* giving exactly n bytes."""
    first, second = read(2)
    n = second & 0x7F
    if n == 126:
        (n,) = struct.unpack("!H", read(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", read(8))
    key = read(4) if second & 0x80 else b""
    payload = read(n)
    if key:
        payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return first & 0x0F, payload


class VllmRs:
    """A stand-in for vllm-rs on 127.0.0.1: ``/metrics`` (:func:`body` of :attr:`engines`, as
    OpenMetrics whatever is asked), ``/v1/completions`` (answers its *name*; with ``"stream":
    true``, ``max_tokens`` Server-Sent Events *token_interval* s apart, as vLLM streams them),
    ``/health``, ``/v1/models``, a WebSocket echo on ``/ws``; no ``/get_load`` (404, as vllm-rs).

    What a proxy in front passed on is kept: :attr:`paths` (requests by path), :attr:`received`
    (each request whole, chunked bodies decoded), :attr:`connections` (connections accepted),
    :attr:`raw` (every byte read, per connection), :attr:`sent_at` (when each streamed token was
    written)."""

    def __init__(
        self, name: str, engines: dict[int, Engine], *, token_interval: float = 0.01, port: int = 0
    ) -> None:
        self.name = name
        self.engines = engines
        self.token_interval = token_interval
        self.paths: dict[str, int] = {}
        self.received: list[Seen] = []
        self.sent_at: list[float] = []  # time.monotonic() of each streamed event's write
        self.open: set[socket.socket] = set()  # connections accepted (closed ones too)
        self.connections = 0
        self.raw: list[bytearray] = []
        outer = self

        class Recorder(io.RawIOBase):
            """The connection's input, every byte kept in :attr:`VllmRs.raw`."""

            def __init__(self, sock: socket.socket, kept: bytearray) -> None:
                self.sock, self.kept = sock, kept

            def readable(self) -> bool:
                return True

            def readinto(self, buffer: Any) -> int:
                data = self.sock.recv(len(buffer))
                self.kept += data
                buffer[: len(data)] = data
                return len(data)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # Each write goes out at once (a streamed token is one small write), as a server
                # that streams does; without it Nagle holds a token behind the head's ACK.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                outer.connections += 1
                outer.open.add(self.connection)
                kept = bytearray()
                self.index = len(outer.raw)
                outer.raw.append(kept)
                self.rfile = io.BufferedReader(Recorder(self.connection, kept))

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, content_type: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _body(self) -> bytes:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    out = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline().strip():  # trailers, then the blank line
                                pass
                            return bytes(out)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _seen(self) -> tuple[str, bytes]:
                path = self.path.split("?", 1)[0]
                outer.paths[path] = outer.paths.get(path, 0) + 1
                data = self._body()
                outer.received.append(
                    Seen(
                        self.command,
                        self.path,
                        self.request_version,
                        list(self.headers.items()),
                        data,
                        self.index,
                    )
                )
                return path, data

            def do_GET(self) -> None:
                path, _ = self._seen()
                if path == "/metrics":
                    self._send(200, CONTENT_TYPE, body(outer.engines).encode())
                elif path == "/ws":
                    # A handshake needs both headers (RFC 6455, 4.2.1), as vllm-rs' server checks.
                    tokens = {t.strip().lower() for t in (self.headers.get("Connection") or "").split(",")}
                    if (self.headers.get("Upgrade") or "").lower() == "websocket" and "upgrade" in tokens:
                        self._echo()
                    else:
                        self._send(400, "text/plain", b"not a WebSocket handshake")
                elif path in ("/health", "/v1/models"):
                    doc = (
                        {}
                        if path == "/health"
                        else {"object": "list", "data": [{"id": "m", "object": "model"}]}
                    )
                    self._send(200, "application/json", json.dumps(doc).encode())
                else:
                    self._send(404, "application/json", b'{"error": "not found"}')

            do_HEAD = do_GET

            def do_POST(self) -> None:
                path, data = self._seen()
                if path != "/v1/completions":
                    self._send(404, "application/json", b'{"error": "not found"}')
                    return
                try:
                    request = json.loads(data or b"{}")
                except ValueError:
                    self._send(400, "application/json", b'{"error": "the body is not JSON"}')
                    return
                if request.get("stream"):
                    self._stream(int(request.get("max_tokens") or 16))
                    return
                doc = {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": "m",
                    "choices": [{"index": 0, "text": outer.name, "finish_reason": "stop", "logprobs": None}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    "echo": request.get("prompt"),
                }
                self._send(200, "application/json", json.dumps(doc).encode())

            def _stream(self, tokens: int) -> None:
                """vLLM's streamed completion: one event per token, then ``[DONE]``, chunked."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i in range(tokens):
                    choice = {"index": 0, "text": f"t{i}", "logprobs": None, "finish_reason": None}
                    doc = {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [choice]}
                    self._chunk(b"data: " + json.dumps(doc).encode() + b"\n\n")
                    outer.sent_at.append(time.monotonic())
                    time.sleep(outer.token_interval)
                self._chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def _echo(self) -> None:
                """A WebSocket echo: every text or binary frame back, until a close frame."""
                self.send_response(101, "Switching Protocols")
                self.send_header("Upgrade", "websocket")
                self.send_header("Connection", "Upgrade")
                self.send_header("Sec-WebSocket-Accept", ws_accept(self.headers["Sec-WebSocket-Key"]))
                self.end_headers()
                self.wfile.flush()
                try:
                    while True:
                        opcode, payload = ws_read(self.rfile.read)
                        if opcode == 8:
                            self.wfile.write(ws_frame(payload, opcode=8))
                            break
                        self.wfile.write(ws_frame(payload, opcode=opcode))
                        self.wfile.flush()
                except (OSError, ValueError):
                    pass
                self.close_connection = True

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # a benchmark's many connections at once

            def handle_error(self, request: Any, client_address: Any) -> None:
                # A proxy closing a kept connection it no longer needs is routine; anything else
                # is printed (socketserver's default).
                if not isinstance(sys.exc_info()[1], OSError):
                    super().handle_error(request, client_address)

        self.server = Server(("127.0.0.1", port), Handler)  # port 0: a free one
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> VllmRs:
        self.thread.start()
        return self

    def close(self) -> None:
        """Stop as a process that ends does: the port closed, and every connection with it."""
        self.server.shutdown()
        self.server.server_close()
        for conn in list(self.open):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
