"""A redis-py client from a redis_stats URL, with explicit timeouts and no automatic retries.

Schemes (the storage is chosen by the URL, as in alisaifee/limits):

- ``redis://[user:pass@]host:port/db`` and ``unix:///path/to/sock?db=0``: one server.
- ``rediss://...``: one server over TLS; ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile`` and
  ``ssl_cert_reqs`` (``required``/``optional``/``none``) are read from the query string.
- ``redis+sentinel://[user:pass@]host:port[,host:port...]/service_name[/db]``: the current master
  of *service_name*, followed across failovers (a sentinel without a port: 26379).
- ``redis+cluster://[user:pass@]host:port[,host:port...]``: a Redis Cluster (a node without a
  port: 6379).
- ``rediss+sentinel://``, ``rediss+cluster://``: the same over TLS (the TLS query parameters above).

A password may also be given as ``?password=`` (and ``?username=``) for every scheme. Characters
``/ ? # @ &`` in a password or query value must be percent-encoded (``%2F %3F %23 %40 %26``):
such a URL is refused with an error that names the problem and quotes no part of the secret
(see :func:`redis_stats.config.url_problem`). Every message here shows the URL masked.

redis-py 8 retries a command that timed out, behind its caller's back: a call that is not
idempotent then runs twice (``lease.lua``'s ``INCR`` would hand out two fencing tokens). Every
client built here has ``Retry(NoBackoff(), 0)``: each caller retries itself where that is safe
(the writer's flush: same sequence number, same contents) and counts what failed.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_stats.config import SCHEMES, ConfigError, StatsConfig, mask_url, redact

if TYPE_CHECKING:
    import redis.asyncio
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

#: What the threaded classes take as ``client=``: ``redis.Redis`` (a Sentinel master is one too)
#: or ``RedisCluster``, made with no retries (see above) when redis_stats makes it (a Cluster
#: client then comes as a :class:`LazyCluster`, built at first use).
Client: TypeAlias = "redis.Redis | RedisCluster | LazyCluster"
#: What the asyncio classes take as ``client=``: the ``redis.asyncio`` twins.
AsyncClient: TypeAlias = "redis.asyncio.Redis | AsyncRedisCluster"

__all__ = [
    "SCHEMES",
    "AsyncClient",
    "Client",
    "LazyCluster",
    "check_url",
    "is_cluster",
    "make_async_client",
    "make_client",
    "tls_mismatch",
]


_TLS_QUERY = {"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname"}


def _common_kwargs(config: StatsConfig) -> dict[str, Any]:
    return {
        "socket_timeout": config.socket_timeout_ms / 1000.0,
        "socket_connect_timeout": config.connect_timeout_ms / 1000.0,
        "retry": Retry(NoBackoff(), 0),
        "decode_responses": True,
        # Bytes that are not UTF-8 (written into our hashes by hand) must not fail a whole read.
        "encoding_errors": "replace",
        "health_check_interval": 0,
        # RESP2: flat replies, the same shape from scripts and from native reads (redis-py 8
        # defaults to RESP3, where HGETALL is a map and ZRANGE WITHSCORES a list of pairs).
        "protocol": 2,
    }


def _split_hosts(netloc: str, default_port: int) -> tuple[str | None, str | None, list[tuple[str, int]]]:
    user = password = None
    if "@" in netloc:
        userinfo, netloc = netloc.rsplit("@", 1)
        if ":" in userinfo:
            user, password = (unquote(p) for p in userinfo.split(":", 1))
        else:
            password = unquote(userinfo)
        user = user or None
    hosts = []
    for part in netloc.split(","):
        host, _, port = part.rpartition(":")
        if not host or part.endswith("]"):  # no port (an IPv6 host in brackets has colons)
            host, port = part, str(default_port)
        try:
            hosts.append((host.strip("[]"), int(port)))
        except ValueError:
            # Not quoted: a misplaced password lands in the port (StatsConfig refuses that first).
            raise ConfigError(
                f"host {len(hosts) + 1} of the Redis URL has a port that is not a number"
            ) from None
    return user, password, hosts


def _tls_kwargs(query: dict[str, str]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"ssl": True}
    for key in _TLS_QUERY:
        if key in query:
            value: Any = query[key]
            if key == "ssl_check_hostname":
                value = value.lower() in ("1", "true", "yes")
            kwargs[key] = value
    return kwargs


def _parse(config: StatsConfig) -> tuple[str, Any]:
    url = config.url
    try:
        parts = urlsplit(url)
    except ValueError:
        # urlsplit's own messages quote the netloc, password included: name the problem only.
        raise ConfigError(
            f"cannot parse Redis URL {mask_url(url)}: check the brackets of an IPv6 host and "
            "percent-encode non-ASCII characters"
        ) from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigError(
            f"URL scheme {scheme!r} of {mask_url(url)} is not supported; use one of {', '.join(SCHEMES)}"
        )
    return scheme, parts


def _client_plan(config: StatsConfig, retry: Any) -> tuple[str, dict[str, Any]]:
    """Decide, without I/O, which client type to build and with which arguments.

    Shared by the sync and asyncio factories so both trees read a URL the same way.
    """
    scheme, parts = _parse(config)
    kwargs = _common_kwargs(config)
    kwargs["retry"] = retry
    if scheme in ("redis", "rediss", "unix"):
        return "url", {"url": config.url, **kwargs}
    query = dict(parse_qsl(parts.query))
    # A host without a port: Redis' 6379 on a Cluster, Sentinel's 26379 for the sentinels.
    user, password, hosts = _split_hosts(parts.netloc, 6379 if scheme.endswith("+cluster") else 26379)
    # ?password= / ?username= work here as they do for redis:// (where redis-py reads them).
    kwargs.update(username=user or query.get("username"), password=password or query.get("password"))
    if scheme.startswith("rediss"):
        kwargs.update(_tls_kwargs(query))
    if scheme.endswith("+cluster"):
        kwargs.pop("health_check_interval")
        return "cluster", {"hosts": hosts, **kwargs}
    service, db = _sentinel_path(parts.path, config.url)
    sentinel_kwargs = {
        k: v for k, v in kwargs.items() if k not in ("decode_responses", "username", "password")
    }
    if query.get("sentinel_password"):
        sentinel_kwargs["password"] = query["sentinel_password"]
        sentinel_kwargs["username"] = query.get("sentinel_username")
    return "sentinel", {
        "hosts": hosts,
        "service": service,
        "db": db,
        "sentinel_kwargs": sentinel_kwargs,
        **kwargs,
    }


class LazyCluster:
    """A ``RedisCluster`` built at its first use, not when this is made.

    redis-py's sync ``RedisCluster`` connects in its constructor (to learn the slots): with the
    Cluster down, building a reader or writer would raise, and a host (an exporter, a view
    inside vLLM) would fail to start instead of showing ``redis_stats_up 0``. This builds it on
    the first command instead, once (under a lock: threads share it); a build that fails raises
    that command's error and is tried again on the next call. Every attribute is the built
    client's; ``connection_pool`` is None (a Cluster client has one pool per node).
    """

    connection_pool = None

    def __init__(self, build: Callable[[], RedisCluster]) -> None:
        self._build = build
        self._client: RedisCluster | None = None
        self._lock = threading.Lock()

    def client(self) -> RedisCluster:
        """The ``RedisCluster``, built now if it is not yet (raises if no node answers)."""
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._build()
                client = self._client
        return client

    def get_node_from_key(self, key: str, replica: bool = False) -> Any:
        """The node of *key*'s slot (present before the build: callers test for it to tell a
        Cluster client from a single server's)."""
        return self.client().get_node_from_key(key, replica)

    def close(self) -> None:
        """Close the client if it was built (nothing was opened otherwise)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # private, dunder (copy, pickle): never a reason to connect
            raise AttributeError(name)
        return getattr(self.client(), name)


def flat_reply(reply: Any) -> Any:
    """A RESP3 map or list of pairs as the flat list RESP2 gives (our clients speak RESP2; a
    client of the caller's may speak RESP3)."""
    if isinstance(reply, dict):
        return [x for kv in reply.items() for x in kv]
    if isinstance(reply, list) and reply and isinstance(reply[0], list):
        return [x for pair in reply for x in pair]
    return reply


def is_cluster(client: Any) -> bool:
    """Whether *client* talks to a Redis Cluster (a ``RedisCluster``, lazy or not, sync or async)."""
    return hasattr(client, "get_node_from_key")


def key_target(client: Any, key: str) -> dict[str, Any]:
    """Keyword arguments of ``execute_command`` that send a keyless command (``WAIT``) to the node
    holding *key*: ``target_nodes`` on a Cluster, none elsewhere."""
    return {"target_nodes": client.get_node_from_key(key)} if is_cluster(client) else {}


def make_client(config: StatsConfig) -> Client:
    """Return a synchronous client (``redis.Redis``, a Sentinel master, or a ``RedisCluster``
    as a :class:`LazyCluster`: no I/O here for any scheme)."""
    kind, kw = _client_plan(config, Retry(NoBackoff(), 0))
    if kind == "url":
        made: Client = _from_url(redis.Redis, config, kw)
        return made
    if kind == "cluster":
        from redis.cluster import ClusterNode, RedisCluster

        nodes = [ClusterNode(h, p) for h, p in kw.pop("hosts")]
        return LazyCluster(lambda: RedisCluster(startup_nodes=nodes, **kw))
    from redis.sentinel import Sentinel

    hosts, service = kw.pop("hosts"), kw.pop("service")
    master: Client = Sentinel(hosts, **kw).master_for(service)
    return master


def make_async_client(config: StatsConfig) -> AsyncClient:
    """Return the ``redis.asyncio`` twin of :func:`make_client` (same schemes, timeouts, no retries)."""
    import redis.asyncio as aredis
    from redis.asyncio.retry import Retry as AsyncRetry

    kind, kw = _client_plan(config, AsyncRetry(NoBackoff(), 0))
    if kind == "url":
        made: AsyncClient = _from_url(aredis.Redis, config, kw)
        return made
    if kind == "cluster":
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in kw.pop("hosts")], **kw)
    from redis.asyncio.sentinel import Sentinel

    hosts, service = kw.pop("hosts"), kw.pop("service")
    master: AsyncClient = Sentinel(hosts, **kw).master_for(service)
    return master


def _from_url(cls: Any, config: StatsConfig, kw: dict[str, Any]) -> Any:
    url = kw.pop("url")
    try:
        client = cls.from_url(url, **kw)
        # redis-py passes every query parameter it does not know (a typo: "socket_timout") on to
        # the connection class, which refuses it only when the first connection is made: every
        # flush and read would then fail for the life of the process. Make one connection object
        # now (no I/O: connecting is lazy) so the URL is refused here, where it enters.
        pool = client.connection_pool
        pool.connection_class(**pool.connection_kwargs)
    except (ValueError, TypeError) as exc:
        # redis-py's parse errors may quote the URL's netloc (urllib's do): redact them.
        why = redact(str(exc), url)
        if "keyword" in why:
            why += " (a query parameter redis-py does not know: check its spelling)"
        raise ConfigError(f"redis-py cannot use Redis URL {mask_url(url)}: {why}") from None
    return client


def check_url(config: StatsConfig) -> None:
    """Raise :class:`ConfigError` if no client can be built from ``config.url`` (no I/O).

    For a command line to refuse a bad URL as a usage error before it starts. For
    ``redis+cluster://`` only the URL's form is checked (redis-py's Cluster client connects when
    it is built, so :func:`make_client` builds it at first use).
    """
    kind, kw = _client_plan(config, Retry(NoBackoff(), 0))
    if kind == "url":
        _from_url(redis.Redis, config, kw).close()


def _sentinel_path(path: str, url: str) -> tuple[str, int]:
    pieces = [p for p in path.split("/") if p]
    if not pieces:
        raise ConfigError(
            f"{mask_url(url)} names no Sentinel service: use redis+sentinel://host:26379/mymaster"
        )
    try:
        db = int(pieces[1]) if len(pieces) > 1 else 0
    except ValueError:
        raise ConfigError(f"database {pieces[1]!r} in {mask_url(url)} is not an integer") from None
    return pieces[0], db


def tls_mismatch(config: StatsConfig, timeout: float = 1.0) -> str | None:
    """Why a ``redis://`` or ``rediss://`` URL cannot reach its server, when the server speaks
    the other protocol; None when it does not (or cannot be asked, or the URL has another scheme).

    A ``rediss://`` client's TLS hello to a plain server waits for an answer that never comes
    (redis-py says "Timeout connecting to server"), and a plain client's command to a TLS server
    is dropped ("Connection closed by server"): neither says TLS. So, after such a failure, ask
    the server itself, each way at most *timeout* seconds: a plain ``PING`` answered by a Redis
    reply (``+PONG``, ``-NOAUTH``...) is a plain server; a TLS handshake that completes, or ends in
    a TLS alert, is a TLS server. Nothing is sent but ``PING`` and a hello; no certificate is
    trusted or sent."""
    scheme, parts = _parse(config)
    if scheme not in ("redis", "rediss") or not parts.hostname:
        return None
    host, port = parts.hostname, parts.port or 6379
    where = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    try:
        if scheme == "rediss" and _speaks_plain(host, port, timeout):
            return (
                f"the server at {where} speaks plain Redis, not TLS: use redis:// (or turn TLS on "
                "in the server: tls-port)"
            )
        if scheme == "redis" and _speaks_tls(host, port, timeout):
            return f"the server at {where} speaks TLS: use rediss:// (with ssl_ca_certs=... to verify it)"
    except OSError:
        return None  # unreachable, refused: not a mismatch (the failure says what it is)
    return None


def _speaks_plain(host: str, port: int, timeout: float) -> bool:
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(b"PING\r\n")
        reply = sock.recv(64)
    return reply[:1] in (b"+", b"-")


def _speaks_tls(host: str, port: int, timeout: float) -> bool:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # asking which protocol it speaks, not trusting it
    with socket.create_connection((host, port), timeout=timeout) as sock:
        try:
            with context.wrap_socket(sock, server_hostname=host):
                return True
        except ssl.SSLError as exc:
            # A TLS server that refuses us (a client certificate required) still speaks TLS; a
            # plain one answers the hello with bytes that are no TLS record at all.
            return "ALERT" in (exc.reason or "").upper()
