"""The proxy in front of vLLM's Rust front end (issue 46): the shipped nginx and HAProxy
configurations (deploy/nginx/vllm-rs.conf, deploy/haproxy/vllm-rs.cfg), run by the real binaries.

vllm-rs runs no Python middleware, and routers read a worker's load only from the address they
route to. The proxy takes that address: ``GET /get_load`` and ``GET /v1/loads`` go to the
exporter's view of the pod's endpoint, everything else to the front end as it came.

(a) Routing and passing, against the stand-in front end (tests/helpers/vllm_rs.py), the bridge of
its ``/metrics`` and an exporter: the answers exact, keep-alive, a streamed completion token by
token, a WebSocket echo, request bodies byte for byte, upstream connections reused, either side
down. (b) Every framing attack that broke ``redis-stats load-proxy`` (issue 46, item 7), as the
exact bytes on a raw socket, with what the client and the front end each received. (c) The real
``vllm-router`` wheel routing two such pods through nginx by their exact load.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from redis_stats import StatsConfig
from redis_stats.integrations.bridge import BridgedSource
from redis_stats.integrations.vllm import vllm_catalog
from redis_stats.integrations.vllm.load import VLLM_LOAD
from redis_stats.reader import StatsReader
from redis_stats.server.exporter import Exporter
from redis_stats.tools.embedded import free_port
from tests import smg_decode
from tests.helpers.front_proxy import PROXIES, FrontProxy, Nginx
from tests.helpers.vllm_rs import Engine, VllmRs, ws_accept, ws_frame, ws_read
from tests.routers.procs import Router, router_binary, sent_to

pytestmark = pytest.mark.redis_server


@dataclass
class Reply:
    """One HTTP response as a client read it."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str:
        return ", ".join(v for k, v in self.headers if k == name.lower())


def responses(data: bytes) -> list[Reply]:
    """What a client read off one connection, split into responses by their own framing (a 101's
    rest is its tunnel's)."""
    out = []
    while data:
        head, sep, data = data.partition(b"\r\n\r\n")
        assert sep, f"a truncated response head: {head[:300]!r}"
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = [(k.strip().lower(), v.strip()) for k, _, v in (ln.partition(":") for ln in lines[1:])]
        reply = Reply(status, headers, b"")
        if status == 101:
            reply.body, data = data, b""
        elif "chunked" in reply.header("transfer-encoding").lower():
            body = bytearray()
            while True:
                size_line, _, data = data.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    data = data.partition(b"\r\n")[2]
                    break
                body += data[:size]
                data = data[size + 2 :]
            reply.body = bytes(body)
        elif reply.header("content-length"):
            n = int(reply.header("content-length"))
            reply.body, data = data[:n], data[n:]
        elif not (100 <= status < 200 or status in (204, 304)):
            reply.body, data = data, b""
        out.append(reply)
    return out


def exchange(port: int, data: bytes, idle: float = 1.0, limit: float = 10.0) -> tuple[list[Reply], bool]:
    """Send *data* on a new connection and read until the proxy closes it or *idle* s pass with
    nothing: (the responses, whether the proxy closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=idle) as s:
        s.sendall(data)
        return read_replies(s, limit)


def read_replies(s: socket.socket, limit: float = 10.0) -> tuple[list[Reply], bool]:
    got, closed, deadline = bytearray(), False, time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            closed = True
            break
        if not chunk:
            closed = True
            break
        got += chunk
    return responses(bytes(got)), closed


SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"


class Pod:
    """A vllm-rs pod: the stand-in front end (2 engines), the bridge of its /metrics under the
    proxy's address, and the proxy of *kind* in front, its load routes to *exporter*."""

    def __init__(
        self, kind: str, cfg: StatsConfig, exporter: Exporter, workdir: Path, first: int = 0
    ) -> None:
        self.front = VllmRs(workdir.name, {0: Engine(), 1: Engine()}).start()
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.bridge = BridgedSource(
            f"http://{self.front.address}/metrics",
            cfg.replace(endpoint=self.endpoint, engine_offset=first),
            engine_label="engine",
            known=vllm_catalog(),
            load=VLLM_LOAD,
        )
        self.proxy: FrontProxy = PROXIES[kind](
            workdir, self.port, self.front.address, f"127.0.0.1:{exporter.port}"
        )
        self.proxy.start()

    def load(self, running: int, waiting: int) -> None:
        """Set the front end's numbers (split over its engines) and bridge them."""
        self.front.engines[0].running, self.front.engines[1].running = running // 2, running - running // 2
        self.front.engines[0].waiting, self.front.engines[1].waiting = waiting, 0
        assert self.bridge.scrape(), self.bridge.stats

    def requests_seen(self) -> int:
        """Requests the front end received, the bridge's scrapes left out."""
        return len([r for r in self.front.received if r.target != "/metrics"])

    def close(self) -> None:
        self.proxy.close()
        self.bridge.close()
        self.front.close()


@pytest.fixture
def cfg(redis_server, namespace) -> StatsConfig:
    return StatsConfig(url=redis_server.url, namespace=namespace)


@pytest.fixture
def exporter(cfg) -> Iterator[Exporter]:
    made = Exporter(StatsReader(cfg, vllm_catalog()), port=0, host="127.0.0.1", load_refresh=0.05).start()
    yield made
    made.close()


@pytest.fixture(params=sorted(PROXIES))
def pod(request, cfg, exporter, tmp_path) -> Iterator[Pod]:
    made = Pod(request.param, cfg, exporter, tmp_path / request.param)
    made.load(running=6, waiting=3)
    fresh_views(made)
    yield made
    made.close()


def fresh_views(pod: Pod, load: int = 9, timeout: float = 5.0) -> None:
    """Wait until the exporter's feed serves *load* for the pod (its refresh follows the bridge)."""
    deadline = time.monotonic() + timeout
    while True:
        status, body, _ = get(pod.port, "/get_load")
        if status == 200 and json.loads(body)["load"] == load:
            return
        assert time.monotonic() < deadline, (status, body)
        time.sleep(0.05)


def get(port: int, path: str, method: str = "GET", body: bytes | None = None) -> tuple[int, bytes, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return resp.status, resp.read(), dict(resp.getheaders())
    finally:
        conn.close()


def completion(prompt: str = "x", **extra: object) -> bytes:
    return json.dumps({"model": "m", "prompt": prompt, **extra}).encode()


def post_head(target: str, length: int, *extra: str) -> bytes:
    lines = [
        f"POST {target} HTTP/1.1",
        "Host: pod",
        "Content-Type: application/json",
        f"Content-Length: {length}",
    ]
    return ("\r\n".join([*lines, *extra]) + "\r\n\r\n").encode()


# (a) What the proxy routes, and how it passes the rest.


def test_the_load_routes_answer_from_the_views_and_the_rest_reaches_the_front_end(pod):
    conn = http.client.HTTPConnection("127.0.0.1", pod.port, timeout=10)
    for _ in range(3):  # one connection, kept open, answered each time (a router's pool)
        conn.request("GET", "/get_load")
        resp = conn.getresponse()
        doc = json.loads(resp.read())
        assert resp.status == 200 and doc["load"] == 9 and doc["endpoint"] == pod.endpoint
    conn.request("GET", "/v1/loads?include=core,disagg,queues,memory")
    resp = conn.getresponse()
    verdict, loads = smg_decode.probe(resp.status, resp.read())
    assert verdict == "available" and [s["num_running_reqs"] for s in loads["loads"]] == [3, 3]
    conn.request("POST", "/v1/completions", body=completion("x" * 100_000))
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read())["echo"] == "x" * 100_000
    conn.request("GET", "/get_load")  # the same connection, after a passed request: answered again
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read())["load"] == 9
    conn.request("HEAD", "/get_load")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read() == b""
    conn.close()
    # /metrics passes as the front end serves it, byte for byte
    assert get(pod.port, "/metrics")[1] == get(pod.front.port, "/metrics")[1]
    # any other method on the load routes is the front end's (a 404 there, as vllm-rs answers)
    assert get(pod.port, "/get_load", "POST", b"{}")[0] == 404
    assert pod.front.paths == {"/metrics": 3, "/v1/completions": 1, "/get_load": 1}


def test_the_views_answer_for_the_pods_endpoint_only(pod):
    """The endpoint is the proxy's, never the client's: on /get_load a query is dropped; on
    /v1/loads an endpoint= is the exporter's 400 (given twice), and the gateway's own query passes."""
    assert json.loads(get(pod.port, "/get_load?endpoint=10.9.9.9:1")[1])["endpoint"] == pod.endpoint
    status, body, _ = get(pod.port, "/v1/loads?endpoint=10.9.9.9:1")
    assert status == 400 and b"given 2 times" in body
    status, body, _ = get(pod.port, "/v1/loads?include=core&dp_rank=1")
    assert status == 200 and [s["dp_rank"] for s in json.loads(body)["loads"]] == [1]
    assert get(pod.port, "/v1/loads?include=bogus")[0] == 400  # the exporter's own check


@pytest.mark.parametrize(
    "query",
    [
        "endpoint%3D10.9.9.9:1",
        "%26endpoint=10.9.9.9:1",
        ";endpoint=10.9.9.9:1",
        "include=core&include=memory",
        "dp_rank=99999999999999999999",
        "dp_rank=-1",
        "include=%00",
        "namespace=other",
        "include=" + "core," * 1500,
    ],
)
def test_a_hostile_query_on_v1_loads_never_reaches_another_endpoint(pod, query):
    """Whatever a client puts in the query the gateway's ``/v1/loads`` passes on: an answer for
    the pod's endpoint, or a 4xx saying why (the exporter's; another namespace: its 404, for that
    request only; or nginx's 414), never a 500."""
    status, body, _ = get(pod.port, "/v1/loads?" + query)
    assert status in (200, 400, 404, 414, 503), (status, body[:300])
    if status == 200:
        assert json.loads(body)["endpoint"] == pod.endpoint


def test_a_streamed_completion_arrives_token_by_token(pod):
    """Server-Sent Events pass as they are written: each token reaches the client within a few
    milliseconds of the front end's write, never held for the next one (or for the stream's end)."""
    pod.front.token_interval = 0.1
    with socket.create_connection(("127.0.0.1", pod.port), timeout=5) as s:
        body = completion(stream=True, max_tokens=10)
        s.sendall(post_head("/v1/completions", len(body)) + body)
        arrivals, got = [], b""
        while b"[DONE]" not in got or not got.endswith(b"\r\n0\r\n\r\n"):
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
            arrivals += [time.monotonic()] * chunk.count(b"data: {")
    (reply,) = responses(got)
    events = [e for e in reply.body.split(b"\n\n") if e]
    assert len(events) == 11 and events[-1] == b"data: [DONE]"
    assert json.loads(events[0][6:])["choices"][0]["text"] == "t0"
    delays = [a - s for a, s in zip(arrivals, pod.front.sent_at)]
    assert len(delays) == 10 and max(delays) < 0.05, [round(d, 3) for d in delays]


def test_a_websocket_upgrade_is_tunneled(pod):
    key = "dGhlIHNhbXBsZSBub25jZQ=="
    head = (
        "GET /ws HTTP/1.1\r\nHost: pod\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", pod.port), timeout=5) as s:
        s.sendall(head)
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = s.recv(4096)
            assert chunk, got
            got += chunk
        status_line, _, rest = got.partition(b"\r\n")
        assert status_line.split()[1] == b"101", got
        assert f"Sec-WebSocket-Accept: {ws_accept(key)}".lower().encode() in got.lower()
        buffered = bytearray(rest.partition(b"\r\n\r\n")[2])

        def read(n: int) -> bytes:
            while len(buffered) < n:
                buffered.extend(s.recv(65536))
            out = bytes(buffered[:n])
            del buffered[:n]
            return out

        for payload in (b"hello", b"y" * 70_000):
            s.sendall(ws_frame(payload, mask=True))
            assert ws_read(read) == (1, payload)
        s.sendall(ws_frame(b"", opcode=8, mask=True))
        assert ws_read(read)[0] == 8
    (seen,) = [r for r in pod.front.received if r.target == "/ws"]
    assert seen.header("Upgrade") == ["websocket"] and "upgrade" in seen.header("Connection")[0].lower()


def test_request_bodies_pass_byte_for_byte_whatever_their_framing(pod):
    big = completion("é" * 600_000)  # 1.2 MB, as long prompts are
    replies, _ = exchange(pod.port, post_head("/v1/completions", len(big)) + big)
    assert [r.status for r in replies] == [200]
    chunked = completion("chunked")
    framed = (
        b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (chunked[:7], chunked[7:])) + b"0\r\n\r\n"
    )
    head = b"POST /v1/completions HTTP/1.1\r\nHost: pod\r\nTransfer-Encoding: chunked\r\n\r\n"
    replies, _ = exchange(pod.port, head + framed)
    assert [r.status for r in replies] == [200] and json.loads(replies[0].body)["echo"] == "chunked"
    bodies = [r.body for r in pod.front.received if r.target == "/v1/completions"]
    assert bodies == [big, chunked]


def test_upstream_connections_are_reused(pod):
    """20 requests on one client connection, then 20 clients one after the other: the front end
    accepts a few connections (one per proxy worker thread at most), not one per request."""
    before = pod.front.connections
    conn = http.client.HTTPConnection("127.0.0.1", pod.port, timeout=10)
    for _ in range(20):
        conn.request("POST", "/v1/completions", body=completion())
        assert conn.getresponse().read()
    conn.close()
    for _ in range(20):
        assert get(pod.port, "/v1/models")[0] == 200
    assert pod.front.connections - before <= 4, pod.front.connections - before
    assert pod.requests_seen() == 40


def test_the_front_end_down_is_a_502_and_the_load_still_known(pod):
    pod.front.close()
    assert get(pod.port, "/v1/models")[0] in (502, 503)
    status, body, _ = get(pod.port, "/get_load")
    assert status == 200 and json.loads(body)["load"] == 9  # from the store


def test_the_views_down_is_a_503_that_says_so(pod, exporter):
    exporter.close()
    status, body, _ = get(pod.port, "/get_load")
    assert status == 503 and json.loads(body)["error"] == "views_unreachable", body
    status, body, _ = get(pod.port, "/v1/loads")
    assert status == 503 and json.loads(body)["error"] == "views_unreachable"  # smg: "ask again"
    assert get(pod.port, "/v1/models")[0] == 200  # inference unharmed


def test_each_side_restarted_twice_is_served_again_at_once(pod, exporter):
    """vllm-rs restarted twice (the proxy's kept connections to it die with it): the first
    completion after each restart is answered, never a 502 from a dead kept connection; the
    exporter restarted twice on its port: the load routes answer 503 while it is gone, the load
    at once when it is back."""
    conn = http.client.HTTPConnection("127.0.0.1", pod.port, timeout=10)
    for _ in range(2):
        for _ in range(3):  # kept connections to the front end, pooled by the proxy
            conn.request("POST", "/v1/completions", body=completion())
            assert conn.getresponse().read()
        port, engines = pod.front.port, pod.front.engines
        pod.front.close()
        pod.front = VllmRs(pod.front.name, engines, port=port).start()
        for _ in range(3):
            conn.request("POST", "/v1/completions", body=completion("after"))
            resp = conn.getresponse()
            assert resp.status == 200 and json.loads(resp.read())["echo"] == "after"
    conn.close()
    current, port = exporter, exporter.port
    try:
        for _ in range(2):
            current.close()
            assert get(pod.port, "/get_load")[0] == 503
            reader = StatsReader(pod.bridge.config, vllm_catalog())
            current = Exporter(reader, port=port, host="127.0.0.1", load_refresh=0.05).start()
            pod.load(running=6, waiting=3)
            fresh_views(pod)
    finally:
        current.close()


@pytest.mark.parametrize("kind", sorted(PROXIES))
def test_a_store_outage_is_a_503_through_the_proxy_and_inference_goes_on(kind, own_redis_server, tmp_path):
    """Redis stopped, twice (the second time restarted empty): the load routes answer the
    exporter's 503 with its reason (never nginx's page, never a number), completions pass all the
    while, and the load is back once the bridge has stored it again."""
    cfg = StatsConfig(url=own_redis_server.url, namespace="outage")
    exporter = Exporter(StatsReader(cfg, vllm_catalog()), port=0, host="127.0.0.1", load_refresh=0.05).start()
    pod = Pod(kind, cfg, exporter, tmp_path / kind)
    try:
        for keep_data in (True, False):
            pod.load(running=6, waiting=3)
            pod.load(running=6, waiting=3)
            fresh_views(pod)
            own_redis_server.stop(keep_data=keep_data)
            deadline = time.monotonic() + 10
            while (answer := get(pod.port, "/get_load"))[0] == 200:
                assert time.monotonic() < deadline, answer
                time.sleep(0.1)
            status, body, _ = answer
            assert status == 503 and json.loads(body)["error"] not in ("views_unreachable", None), body
            assert get(pod.port, "/v1/loads")[0] == 503
            assert get(pod.port, "/v1/completions", "POST", completion())[0] == 200
            own_redis_server.start()
        # The bridge's first scrape after the empty restart finds its keys gone and stores its
        # whole state with the next (docs/operations.md), as it would a second later.
        pod.load(running=6, waiting=3)
        pod.load(running=6, waiting=3)
        fresh_views(pod)
    finally:
        pod.close()
        exporter.close()


@pytest.mark.parametrize("kind", sorted(PROXIES))
def test_an_exporter_behind_access_control_opens_the_two_routes_to_the_proxy(kind, cfg, tmp_path):
    """An exporter with bearer tokens (docs/configuration.md, "Access control") and
    ``--web-open /get_load --web-open /v1/loads`` (docs/vllm-rs.md): the proxy's polls are
    answered while every other path still needs the token."""
    tokens = tmp_path / "tokens"
    tokens.write_text("0123456789abcdef0123456789abcdef\n")
    reader = StatsReader(cfg, vllm_catalog())
    exporter = Exporter(
        reader,
        port=0,
        host="127.0.0.1",
        load_refresh=0.05,
        web_token_file=str(tokens),
        web_open=["/get_load", "/v1/loads"],
    ).start()
    pod = Pod(kind, cfg, exporter, tmp_path / kind)
    try:
        pod.load(running=6, waiting=3)
        fresh_views(pod)
        assert get(pod.port, "/v1/loads?include=core")[0] == 200
        assert get(exporter.port, "/load")[0] == 401  # the rest stays closed
    finally:
        pod.close()
        exporter.close()


# (b) Framing: every case that broke `redis-stats load-proxy`, as the exact bytes.


def test_a_chunked_body_on_get_load_is_never_a_second_request(pod):
    """The body of ``GET /get_load`` framed by Transfer-Encoding: chunked is a body: one answer,
    and nothing reaches the front end (the hand-written parser read it as the next request)."""
    body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED)
    head = b"GET /get_load HTTP/1.1\r\nHost: pod\r\nTransfer-Encoding: chunked\r\n\r\n"
    replies, _ = exchange(pod.port, head + body)
    assert len(replies) == 1 and replies[0].status in (200, 413), replies
    assert pod.requests_seen() == 0 and not any(b"/smuggled" in raw for raw in pod.front.raw)


@pytest.mark.parametrize("length", ["+%d", " +%d", "0, %d", "0x%x", "-1", "%d.0", "1e3"])
def test_a_content_length_that_is_not_a_plain_number_is_a_400(pod, length):
    """``Content-Length: +N`` (and other forms a lax parser reads as N or as nothing): refused,
    never its body read as the next request."""
    value = length.replace("%d", str(len(SMUGGLED))).replace("%x", format(len(SMUGGLED), "x"))
    head = f"GET /get_load HTTP/1.1\r\nHost: pod\r\nContent-Length: {value}\r\n\r\n".encode()
    replies, _ = exchange(pod.port, head + SMUGGLED)
    assert [r.status for r in replies] == [400], (value, replies)
    assert pod.requests_seen() == 0 and not any(b"/smuggled" in raw for raw in pod.front.raw)


@pytest.mark.parametrize("route", ["/get_load", "/v1/completions"])
@pytest.mark.parametrize(
    "encoding",
    [
        "Transfer-Encoding: xchunked",
        "Transfer-Encoding : chunked",
        "Transfer-Encoding:\tchunked",
        "Transfer-Encoding: chunked, identity",
        "Transfer-Encoding: identity\r\nTransfer-Encoding: chunked",
        "Transfer-Encoding:\r\n chunked",
        "X-Pad: 1\r\n Transfer-Encoding: chunked",
        "Transfer-Encoding: CHUNKED",
    ],
)
def test_an_obfuscated_transfer_encoding_never_smuggles_a_request(pod, route, encoding):
    """The classic desync (one side frames by Content-Length, the other by a Transfer-Encoding it
    alone recognises): ``0\\r\\n\\r\\n`` then a request, as the body. Whatever the proxy answers,
    the front end never receives that request: the proxy frames the body itself and sends its own
    framing on, never the client's."""
    body = b"0\r\n\r\n" + SMUGGLED
    method = "GET" if route == "/get_load" else "POST"
    head = f"{method} {route} HTTP/1.1\r\nHost: pod\r\nContent-Length: {len(body)}\r\n{encoding}\r\n\r\n"
    replies, _ = exchange(pod.port, head.encode() + body)
    assert len(replies) <= 1, replies
    assert not any(b"/smuggled" in r.target.encode() for r in pod.front.received)
    assert pod.requests_seen() <= 1


def test_a_repeated_equal_content_length_is_one_length_or_a_400(pod):
    """``Content-Length: N, N``: RFC 9110 (8.6) lets a recipient refuse it or read it as N; either
    way the body is a body, never a request."""
    n = len(SMUGGLED)
    head = f"GET /get_load HTTP/1.1\r\nHost: pod\r\nContent-Length: {n}, {n}\r\n\r\n".encode()
    replies, _ = exchange(pod.port, head + SMUGGLED)
    assert len(replies) == 1 and replies[0].status in (400, 413), replies
    assert pod.requests_seen() == 0 and not any(b"/smuggled" in raw for raw in pod.front.raw)


@pytest.mark.parametrize("route", ["/get_load", "/v1/completions"])
@pytest.mark.parametrize("lengths", [(0, 35), (35, 0), (35, 36)])
def test_two_content_lengths_are_a_400(pod, route, lengths):
    """Two different lengths (the hand-written parser added them up): refused, the connection
    closed, nothing reaches the front end."""
    method = "GET" if route == "/get_load" else "POST"
    framing = "".join(f"Content-Length: {n}\r\n" for n in lengths)
    head = f"{method} {route} HTTP/1.1\r\nHost: pod\r\n{framing}\r\n".encode()
    replies, closed = exchange(pod.port, head + SMUGGLED + b"x")
    assert [r.status for r in replies] == [400] and closed, replies
    assert pod.requests_seen() == 0


@pytest.mark.parametrize("route", ["/get_load", "/v1/completions"])
@pytest.mark.parametrize("order", ["length first", "chunked first"])
def test_a_length_beside_chunked_is_refused_or_read_as_chunked_then_closed(pod, route, order):
    """``Content-Length`` and ``Transfer-Encoding: chunked`` together, the body a last chunk then a
    request (the classic desync: framed by the length, it is one body; by the chunks, a body and a
    request). nginx refuses it (400); HAProxy frames it by the chunks, drops the length and closes
    the connection after its answer (RFC 9112, 6.3). Either way one answer, the connection closed
    and that request never read; the hand-written parser framed it by the length."""
    body = b"0\r\n\r\n" + SMUGGLED
    framing = [f"Content-Length: {len(body)}", "Transfer-Encoding: chunked"]
    if order == "chunked first":
        framing.reverse()
    method = "GET" if route == "/get_load" else "POST"
    head = f"{method} {route} HTTP/1.1\r\nHost: pod\r\n" + "\r\n".join(framing) + "\r\n\r\n"
    replies, closed = exchange(pod.port, head.encode() + body)
    assert len(replies) == 1 and closed, replies
    assert not any(r.target == "/smuggled" for r in pod.front.received)
    if replies[0].status != 400:  # read as chunked: an empty body
        assert all(r.body == b"" for r in pod.front.received if r.target == route)
    assert pod.requests_seen() <= (route != "/get_load")


def test_a_huge_body_on_an_answered_route_is_refused_before_it_is_read(pod):
    """A 256 MiB body declared on ``GET /get_load``: refused at once (nothing like 256 MiB read,
    the proxy's memory unmoved), where the hand-written parser read it whole into memory."""
    size = 256 << 20
    rss = pod.proxy.rss()
    with socket.create_connection(("127.0.0.1", pod.port), timeout=5) as s:
        s.sendall(f"GET /get_load HTTP/1.1\r\nHost: pod\r\nContent-Length: {size}\r\n\r\n".encode())
        sent, block = 0, b"z" * (1 << 20)
        s.settimeout(0.05)
        got = b""
        while sent < size and b"\r\n\r\n" not in got:
            try:
                s.sendall(block)
                sent += len(block)
                got += s.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break  # the proxy closed: its answer was written first
        s.settimeout(5)
        try:
            while b"\r\n\r\n" not in got and (chunk := s.recv(65536)):
                got += chunk
        except OSError:
            pass
    assert got.split(b" ", 2)[1] == b"413", got[:200]
    assert sent < 32 << 20, f"{sent >> 20} MiB were sent before the proxy answered"
    assert pod.proxy.rss() - rss < 16 << 20
    assert pod.requests_seen() == 0


def test_a_chunked_body_past_the_cap_on_an_answered_route_is_refused(pod):
    chunk = b"z" * 4096
    head = b"GET /v1/loads HTTP/1.1\r\nHost: pod\r\nTransfer-Encoding: chunked\r\n\r\n"
    replies, closed = exchange(pod.port, head + b"%x\r\n%s\r\n" % (len(chunk), chunk) * 64)
    assert [r.status for r in replies] == [413] and closed, replies


def test_a_body_that_stops_coming_is_cut_by_a_deadline(pod):
    """A body announced and never finished (a slow client, or one holding the connection) on an
    answered route: the connection is closed within the proxy's body timeout (5 s), where the
    hand-written parser waited for ever."""
    head = b"GET /get_load HTTP/1.1\r\nHost: pod\r\nContent-Length: 100\r\n\r\n0123456789"
    start = time.monotonic()
    replies, closed = exchange(pod.port, head, idle=9.0, limit=9.0)
    assert closed and time.monotonic() - start < 8.0, (replies, time.monotonic() - start)
    assert all(r.status != 200 for r in replies)


def test_hop_by_hop_headers_stop_at_the_proxy(pod):
    """``Connection`` (and the headers that only ever mean something for one hop: Keep-Alive, TE,
    Proxy-Connection, an Upgrade not taken) never reach the front end as the client sent them,
    and a header the client names in ``Connection`` cannot remove one the proxy adds."""
    head = (
        b"GET /v1/models HTTP/1.1\r\nHost: pod\r\nConnection: keep-alive, TE, X-Forwarded-For\r\n"
        b"Keep-Alive: timeout=600\r\nTE: trailers\r\nProxy-Connection: keep-alive\r\n"
        b"X-Api-Key_Id: 7\r\n\r\n"
    )
    replies, _ = exchange(pod.port, head)
    assert [r.status for r in replies] == [200]
    (seen,) = [r for r in pod.front.received if r.target == "/v1/models"]
    names = {k.lower() for k, _ in seen.headers}
    assert not names & {"keep-alive", "te", "proxy-connection", "upgrade"}, seen.headers
    assert all("x-forwarded-for" not in v.lower() for v in seen.header("Connection")), seen.headers
    assert seen.header("X-Forwarded-For") == ["127.0.0.1"]  # the proxy's, still there
    assert seen.header("X-Api-Key_Id") == ["7"]  # an underscore is no reason to drop a header
    assert seen.header("Host") == ["pod"]


@pytest.mark.parametrize("route", ["/get_load", "/v1/models"])
def test_an_http_1_0_client_gets_its_answer_and_the_close(pod, route):
    """HTTP/1.0 without keep-alive: the answer, then the connection closed at once (the
    hand-written parser held it open 30 s)."""
    start = time.monotonic()
    replies, closed = exchange(pod.port, f"GET {route} HTTP/1.0\r\n\r\n".encode(), idle=5.0)
    assert [r.status for r in replies] == [200] and closed
    assert time.monotonic() - start < 2.0


def test_pipelined_requests_are_answered_in_order(pod):
    body = completion("pipelined")
    data = (
        b"GET /get_load HTTP/1.1\r\nHost: pod\r\n\r\n"
        + post_head("/v1/completions", len(body))
        + body
        + b"GET /get_load HTTP/1.1\r\nHost: pod\r\nConnection: close\r\n\r\n"
    )
    replies, closed = exchange(pod.port, data)
    assert [r.status for r in replies] == [200, 200, 200] and closed
    assert json.loads(replies[0].body)["load"] == json.loads(replies[2].body)["load"] == 9
    assert json.loads(replies[1].body)["echo"] == "pipelined"
    assert pod.requests_seen() == 1


# (c) The real router, through the proxy.


@pytest.mark.slow
def test_vllm_router_routes_vllm_rs_pods_through_nginx_by_their_exact_load(cfg, exporter, tmp_path):
    binary = router_binary()
    if binary is None:
        pytest.skip("vllm-router is not installed (the test extra installs it on Linux x86_64/aarch64)")
    pods = {
        name: Pod("nginx", cfg, exporter, tmp_path / name, first)
        for name, first in (("light", 0), ("heavy", 2))
    }
    pods["light"].load(running=4, waiting=1)
    pods["heavy"].load(running=40, waiting=10)
    for pod, load in ((pods["light"], 5), (pods["heavy"], 50)):
        fresh_views(pod, load)

    def polls() -> list[int]:  # every /get_load nginx answered (these tests' own included)
        proxies = [pod.proxy for pod in pods.values()]
        return [p.polls() for p in proxies if isinstance(p, Nginx)]

    before = polls()
    router = Router(
        [binary], [pods["light"].proxy.url, pods["heavy"].proxy.url], tmp_path / "router.log", "warning"
    )
    try:
        router.wait_polled(polls, before, timeout=20, settle=0.3)
        assert sent_to(router.url, 40) == {"light": 40}
        pods["light"].load(running=40, waiting=10)
        pods["heavy"].load(running=4, waiting=1)
        for pod, load in ((pods["light"], 50), (pods["heavy"], 5)):
            fresh_views(pod, load)
        router.wait_polled(polls, polls(), timeout=20, settle=0.3)
        assert sent_to(router.url, 40) == {"heavy": 40}
        for pod in pods.values():
            assert "/get_load" not in pod.front.paths  # never asked of vllm-rs
            used = {r.connection for r in pod.front.received if r.target == "/v1/completions"}
            assert len(used) <= 4, used  # the router's 40 requests on kept connections
    finally:
        router.close()
        for pod in pods.values():
            pod.close()


def test_the_load_proxy_command_is_retired_with_directions(python_env):
    """``redis-stats load-proxy`` (any arguments, as a sidecar written for it runs it) exits 2
    and says what runs instead."""
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "redis_stats",
            "load-proxy",
            "--upstream",
            "127.0.0.1:8000",
            "--listen",
            ":8001",
        ],
        env=python_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done
    for words in (
        "retired",
        "deploy/nginx/vllm-rs.conf",
        "deploy/haproxy/vllm-rs.cfg",
        "redis-stats bridge",
        "docs/vllm-rs.md",
    ):
        assert words in done.stderr, done.stderr
    assert os.path.exists(Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "vllm-rs.conf")


def test_a_missing_proxy_binary_skips_here_and_fails_under_ci(monkeypatch):
    from tests.helpers import front_proxy

    monkeypatch.setattr(front_proxy.shutil, "which", lambda name: None)
    monkeypatch.setattr(front_proxy.os, "access", lambda path, mode: False)
    monkeypatch.delenv("CI_REQUIRE_PROXIES", raising=False)
    with pytest.raises(pytest.skip.Exception, match="install-proxies"):
        front_proxy.need("nginx")
    monkeypatch.setenv("CI_REQUIRE_PROXIES", "1")
    with pytest.raises(RuntimeError, match="CI_REQUIRE_PROXIES=1 but nginx is not installed"):
        front_proxy.need("nginx")
