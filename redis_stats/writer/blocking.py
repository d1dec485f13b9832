"""The blocking writer: :class:`StatsWriter`, a :class:`~redis_stats.writer.core.WriterCore`
with a flusher thread and a redis-py client (see the package's docstring for its use and what a
fork does to it).
"""

from __future__ import annotations

import atexit

# The first connect imports the "idna" codec (socket.getaddrinfo encodes the host name). A fork
# while the parent's flusher is inside that import leaves the module's import lock held for
# ever in the child, whose first connect then hangs: import it here, before any flusher runs.
import encodings.idna  # noqa: F401
import math
import sys
import threading
import time
from typing import Any

import redis
from redis.utils import HIREDIS_AVAILABLE

from redis_stats._core.steps import run
from redis_stats._scripts import Script, load_script
from redis_stats.background import survive
from redis_stats.capability import CHECK_STEPS, check_step
from redis_stats.catalog import Catalog
from redis_stats.config import StatsConfig
from redis_stats.connection import Client, is_cluster, make_client
from redis_stats.load import LoadMap
from redis_stats.writer.core import WriterCore, log
from redis_stats.writer.lane import lane_sleep
from redis_stats.writer.packing import SlicedPacker

__all__ = ["StatsWriter"]


def _close_in_multiprocessing_child(writer: StatsWriter) -> None:
    import multiprocessing.util

    multiprocessing.util.Finalize(writer, writer.close, exitpriority=100)


class StatsWriter(WriterCore):
    """Records stats of one process incarnation and flushes them to Redis from a thread.

    *engines* are heartbeated on every flush (so an idle engine stays up); engines that get data
    are heartbeated too. *owner* names the instance that runs those engines (all API servers of
    one vLLM instance share it): when two live owners claim the same engine, both are warned and
    ``redis_stats_engine_conflict`` shows it. *client* overrides the client built from
    ``config.url`` (tests pass a fakeredis client). With ``start=False`` no thread runs and
    :meth:`flush` is called by hand.

    Fork-safe: after ``os.fork()`` the child is a new writer (see the module docstring).
    """

    def __init__(
        self,
        config: StatsConfig | None = None,
        catalog: Catalog | None = None,
        *,
        engines: tuple[int, ...] | list[int] = (),
        writer_id: str | None = None,
        role: str = "",
        owner: str = "",
        client: Client | None = None,
        start: bool = True,
        load: LoadMap | None = None,
    ) -> None:
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._closing = threading.Event()  # close() asks the flusher thread for the last flush
        self._closed_done = threading.Event()  # ... which sets this when it has finished
        self._close_ok = False
        self._close_deadline = 0.0
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._mp_hooked = False
        super().__init__(
            config, catalog, engines=engines, writer_id=writer_id, role=role, owner=owner, load=load
        )
        self._own_client = client is None
        self._client: Any = None
        self._script: Any = None
        if client is not None:
            self._use_client(client)
        else:
            self._use_client(make_client(self.config))  # no I/O (a Cluster client is built at first use)
        if start:
            self.start()

    def _use_client(self, client: Any) -> None:
        self._client = client
        self._script = Script(client, load_script("flush"))
        self._shards_script = Script(client, load_script("shards"))
        self._named: dict[str, Script] = {}  # scripts of the attached parts, by name
        kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
        if self._own_client and HIREDIS_AVAILABLE and isinstance(kwargs, dict):
            kwargs.setdefault("command_packer", SlicedPacker())

    def start(self) -> None:
        """Start the flusher thread (idempotent). Needs no Redis connection."""
        with self._start_lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(
                target=self._run, name=f"redis_stats-flusher-{self.writer_id}", daemon=True
            )
            self._thread.start()
        atexit.register(self.close)

    def _run(self) -> None:
        interval = self.config.flush_interval
        lane = self.config.lane_interval if self.load is not None else 0.0
        due = time.monotonic() + interval
        last_lane = -math.inf
        # The load lane (load_interval): every LANE_POLL s a look at the router numbers; those
        # that changed go to Redis at once, or load_interval after the lane's last call.
        while not self._stop.wait(lane_sleep(due, lane, last_lane)):
            now = time.monotonic()
            # A flush never raises for Redis; anything else (a bug, a value nobody foresaw) is
            # counted and logged, and the thread goes on: a dead flusher would keep every later
            # record from Redis until close.
            with survive("flusher", log):
                if now >= due:
                    self.flush()
                    due = time.monotonic() + interval
                elif lane and now - last_lane >= lane and self.flush_load():
                    last_lane = now
        if self._closing.is_set():
            try:
                with survive("flusher", log):
                    self._close_ok = self._final_flush(self._close_deadline)
            finally:
                self._closed_done.set()  # close() waits for this (until its deadline only)

    def _before_fork(self) -> None:
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None and not self._mp_hooked and not self._closed:
            # A multiprocessing child ends with os._exit(), which skips atexit. Its bootstrap
            # clears the finalizers it inherited, then runs these after-fork callbacks: register
            # the close there (gunicorn workers exit normally, and atexit closes them).
            self._mp_hooked = True
            mp_util.register_after_fork(self, _close_in_multiprocessing_child)

    def _forked(self) -> None:
        super()._forked()
        # Locks and events may have been held or waited on by threads that do not exist here.
        self._flush_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._stop = threading.Event()
        self._closing = threading.Event()
        self._closed_done = threading.Event()
        had_thread, self._thread = self._thread is not None, None
        self.lane_group = None  # its thread is the parent's: the child's flusher runs its lane
        if self._own_client:
            # The parent's sockets are the parent's: build a new pool on the next flush. (A
            # client passed in is the caller's; redis-py resets its pool itself after fork.)
            self._client = None
        if had_thread and not self._closed:
            # No thread may start in an at-fork hook: the child's first record starts it.
            self._acc.wake = self._wake_after_fork

    def _wake_after_fork(self) -> None:
        """Called once by the first record in a forked child (under the record lock)."""
        self._acc.wake = None
        # Thread.start() waits only for the new thread to begin; it never needs the record lock.
        self.start()

    def flush(self, *, closing: bool = False) -> bool:
        """Send what is pending now, in one script call per shard written to (one in all when
        the namespace is not sharded; one after the other). True if Redis confirmed every one.

        Never raises for a Redis problem: a failure is counted in :attr:`stats` and the same
        batch is sent again next time (to that shard; the others carry on).
        """
        with self._flush_lock:
            if self._client is None:  # first flush in a forked child
                try:
                    self._use_client(make_client(self.config))
                except Exception as exc:  # never raise into the host; nothing was taken yet
                    self.flush_failed(exc)
                    return False
            return run(self.flush_steps(closing=closing), self._carry_out)

    def _carry_out(self, what: str, arg: Any) -> Any:
        """One step of :meth:`WriterCore.flush_steps`, blocking."""
        if what in CHECK_STEPS:
            return check_step(self._client, self.config, what, arg)
        if what == "shards":
            return self._shards_script(*arg)
        if what == "script":  # an attached part's (the usage ledger's)
            name, keys, args = arg
            if name not in self._named:
                self._named[name] = Script(self._client, load_script(name))
            return self._named[name](keys, args)
        return self._call(*arg)

    def _call(self, keys: list[str], args: list[str]) -> Any:
        """One flush: the script, and with ``wait_replicas`` its replication acknowledgement
        (pipelined: the same round trip; on a Cluster right after it)."""
        wanted, timeout = self.config.wait_replicas, self.config.wait_timeout_ms
        if not wanted:
            return self._script(keys=keys, args=args)
        if is_cluster(self._client):  # redis-py pipelines no script on a Cluster
            reply = self._script(keys, args)
            node = self._client.get_node_from_key(keys[0])
            acked = self._client.execute_command("WAIT", wanted, timeout, target_nodes=node)
            return self.script_and_wait(reply, acked)
        for attempt in (1, 2):
            pipe = self._client.pipeline(transaction=False)
            pipe.evalsha(self._script.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", wanted, timeout)
            results = pipe.execute(raise_on_error=False)
            if isinstance(results[0], redis.exceptions.NoScriptError) and attempt == 1:
                self._client.script_load(self._script.source)  # the flush did not run: again
                continue
            break
        return self.script_and_wait(results[0], results[1])

    def flush_load(self) -> bool:
        """The load lane: store the entries of the engines whose router numbers changed since
        their last entry (:meth:`redis_stats.writer.lane.LoadLane.calls`), once the writer's first
        flush was confirmed (it is in the writers zset then). True if a call was made; never
        raises. A writer added to a :class:`~redis_stats.writer.lane_group.LaneGroup` makes no
        call of its own: the group sends its entries with its other writers'."""
        if self.lane_group is not None:
            return False
        with self._flush_lock:
            calls = self.lane_calls()
            stored = True
            for key, args in calls:
                try:
                    result = self._client.execute_command("HSET", key, *args)
                except Exception as exc:  # counted; every entry goes again with the next call
                    result = exc
                stored = stored and not isinstance(result, Exception)
                self.lane_done(result)
            for key, ids in self.lane_confirms(stored):  # the routers' bookings these count
                try:
                    self._client.execute_command("HDEL", key, *ids)
                except Exception as exc:  # the bookings end by their bounded time instead
                    self.lane_done(exc)
            return bool(calls)

    lane_group: Any = None
    """The :class:`~redis_stats.writer.lane_group.LaneGroup` that sends this writer's load lane
    (set by its ``add``), or None: the flusher does."""

    @property
    def lane_lock(self) -> threading.Lock:
        """The lock a flush and a load lane call hold: entries are taken and sent under it, so a
        flush never runs between the two (a lane group holds it while its call is answered)."""
        return self._flush_lock

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def lane_calls(self) -> list[tuple[str, list[str]]]:
        """The load lane's calls now (``HSET`` key and its fields and values: the entries that
        changed; none before the first confirmed flush), each counted as an attempt; call with
        :attr:`lane_lock` held, and give each call's outcome to :meth:`lane_done`."""
        if self._client is None or not self.stats.flushes or self.lane is None or self._closed:
            return []
        calls = self.lane.calls()
        self.stats.lane_calls += len(calls)  # the lane's attempts, what its errors are a share of
        return calls

    def lane_confirms(self, stored: bool) -> list[tuple[str, list[str]]]:
        """After :meth:`lane_calls`' calls (*stored*: all of them succeeded): the ``HDEL`` calls
        that end the routers' bookings of the requests those entries count
        (:meth:`redis_stats.writer.lane.LoadLane.confirm_calls`); call with :attr:`lane_lock`
        still held, each failure given to :meth:`lane_done`."""
        return self.lane.confirm_calls(stored) if self.lane is not None else []

    def lane_done(self, result: Any) -> None:
        """What one of :meth:`lane_calls`' calls came to (its reply, or the exception): a failure
        is counted and every entry sent again (:meth:`redis_stats.writer.lane.LoadLane.done`)."""
        if self.lane is not None:
            self.lane.done(result, self.stats)

    def close(self, timeout: float | None = None) -> bool:
        """Stop the thread and flush what is left, for at most *timeout* seconds (default
        ``config.close_timeout``); runs at interpreter exit too.

        Returns True when everything recorded was confirmed by Redis. The writer is marked
        closed in Redis, so its gauges stop counting as current at once. When Redis does not
        confirm in time, one warning says what was lost, and close returns anyway: a shutdown
        is never held by Redis for much longer than *timeout*. (Without a flusher thread,
        ``start=False``, close makes the attempt itself: one attempt may then last up to
        ``connect_timeout_ms + socket_timeout_ms`` past the deadline.)
        """
        if self._closed:
            return not self.pending()
        budget, deadline = self.close_budget(timeout)
        self._closed = True
        self._close_deadline = deadline
        atexit.unregister(self.close)
        thread = self._thread
        done = self._last_flush(thread, deadline)
        if not done:
            self.warn_lost(budget)
        if done or thread is None or not thread.is_alive():
            self._close_client()
        return done

    def _last_flush(self, thread: threading.Thread | None, deadline: float) -> bool:
        """Stop the flusher *thread* and have the last flush made, by the thread if it runs;
        True if everything was confirmed by *deadline*."""
        if thread is None or not thread.is_alive():
            self._stop.set()
            return self._final_flush(deadline)
        # The flusher thread makes the last flush, and close waits for it only until the
        # deadline: an attempt stuck on a hung socket (up to connect + socket timeout) is
        # left to the daemon thread instead of holding the caller (no new thread is started:
        # Python 3.12 refuses that at interpreter exit).
        self._closing.set()
        self._stop.set()
        return self._closed_done.wait(max(0.0, deadline - time.monotonic())) and self._close_ok

    def _close_client(self) -> None:
        """Close the connection pool (no thread uses it any more); never raises."""
        try:
            if self._client is not None:
                self._client.close()
        except Exception:
            pass

    def _final_flush(self, deadline: float) -> bool:
        """Flush (marking the writer closed) until confirmed or *deadline*; True if confirmed."""
        if self._client is None and not self.pending():
            return True  # a forked child that recorded nothing: nothing of its own to send
        while True:
            done, pause = self.final_flush_step(self.flush(closing=True), deadline)
            if done is not None:
                return done
            time.sleep(pause)

    def __enter__(self) -> StatsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
