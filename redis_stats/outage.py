"""Outages in the log: one line when a link to Redis starts failing, one when it works again.

Every process that talks to Redis in a loop (a writer's flusher, sync or asyncio; the lease keeper
and the reporter; the exporter's reads and its ``/load`` refresher) keeps one :class:`Outage` per
link and tells it each attempt's outcome. It logs:

- the **start** of each outage, at the first failed attempt: what failed, its kind and message,
  and what is retried meanwhile;
- its **end**, at the first attempt that works again, **at the level of the start** (wherever the
  warning shows, the recovery shows too): how long it lasted, how many attempts failed and of
  which kinds, and what the caller says was kept or lost.

Every outage, not only a process's first: after an incident the log tells each one. A link that
flaps cannot flood the log: the starts logged are rate-limited (:data:`BURST` at once, then one
per :data:`REFILL` seconds); an outage that starts past the limit is not logged one by one but
counted, and the next line logged (a start, or a summary once the link works and the limit
allows it) says how many there were, how long they lasted together and what failed. A start that
was logged always gets its end.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable

__all__ = ["BURST", "REFILL", "Outage", "shared"]

BURST = 3
"""Outage starts logged one after the other before the limit applies."""

REFILL = 60.0
"""Seconds after which one more start may be logged (the limit's rate)."""

Text = str | Callable[[], str]

_every: weakref.WeakSet[Outage] = weakref.WeakSet()


def _text(value: Text) -> str:
    return value() if callable(value) else value


def _clock(wall: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(wall))


def _kinds(tally: Counter[str]) -> str:
    return ", ".join(f"{k} {n}" if n > 1 else k for k, n in sorted(tally.items()))


class Outage:
    """The outages of one link (thread-safe): call :meth:`failed` for each failed attempt and
    :meth:`succeeded` for each that worked; the log lines follow (module docstring).

    *what* names the link (``"flushes of writer W to redis://..."``; a callable is asked at each
    line, for a name that may change), *retry* says what happens meanwhile (``"retried every 1 s
    with the same batch"``). *level* is the level of an outage's two lines unless
    :meth:`failed` gives another for the outage it starts.
    """

    def __init__(
        self,
        what: Text,
        logger: logging.Logger,
        *,
        retry: Text = "",
        level: int = logging.WARNING,
        burst: int = BURST,
        refill: float = REFILL,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.what = what
        self.logger = logger
        self.retry = retry
        self.level = level
        self.burst = burst
        self.refill = refill
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._refilled = clock()
        # The outage going on (None: the link works).
        self._since: float | None = None
        self._since_wall = 0.0
        self._kinds: Counter[str] = Counter()
        self._logged = False  # its start was logged (so its end will be)
        self._outage_level = level
        # Outages not logged one by one (the limit), until a line says them.
        self._quiet = 0
        self._quiet_seconds = 0.0
        self._quiet_kinds: Counter[str] = Counter()
        self._quiet_first = 0.0
        self._quiet_level = logging.NOTSET
        _every.add(self)

    @property
    def down(self) -> bool:
        """Whether an outage is going on (the last attempt failed)."""
        return self._since is not None

    def failed(self, kind: str, detail: str, *, level: int | None = None) -> None:
        """An attempt failed with an error of *kind* (``error_kind``) saying *detail*. The first
        of an outage starts it (*level*: its lines' level, default :attr:`level`)."""
        with self._lock:
            now = self._clock()
            if self._since is None:
                self._since, self._since_wall = now, self._wall()
                self._kinds = Counter()
                self._logged = False
                self._outage_level = self.level if level is None else level
            self._kinds[kind] += 1
            if self._logged or not self._take(now):
                return
            self._logged = True
            line, args = self._start_line(kind, detail, now)
            level_now = self._outage_level
        self.logger.log(level_now, line, *args)

    def succeeded(self, ended: Text = "") -> None:
        """An attempt worked: the end of the outage going on, if any, is logged (at its start's
        level), with *ended* (what was kept or lost; a callable is asked only then)."""
        if self._since is None and not self._quiet:
            return  # the common case, without the lock
        with self._lock:
            now = self._clock()
            if self._since is None:
                line = self._summary_now(now)
                if line is None:
                    return
                level_now, text, args = line
            else:
                seconds = now - self._since
                if not self._logged:  # past the limit at its start: counted, not logged alone
                    self._count_quiet(seconds)
                    self._since = None
                    return
                level_now = self._outage_level
                text, args = self._end_line(seconds, ended)
                self._since = None
        self.logger.log(level_now, text, *args)

    # -- the lines (called under the lock) --------------------------------------------------------

    def _take(self, now: float) -> bool:
        """One token of the limit, if there is one."""
        self._tokens = min(float(self.burst), self._tokens + (now - self._refilled) / self.refill)
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _start_line(self, kind: str, detail: str, now: float) -> tuple[str, tuple[object, ...]]:
        # Logged late (the limit held it back): say when it really started.
        late = self._since is not None and now - self._since >= 1.0
        when = f" at {_clock(self._since_wall)}" if late else ""
        retry = _text(self.retry)
        text = "%s failed (%s: %s): outage started%s%s%s"
        args = (_text(self.what), kind, detail, when, "; " + retry if retry else "", self._quiet_said())
        return text, args

    def _end_line(self, seconds: float, ended: Text) -> tuple[str, tuple[object, ...]]:
        attempts = sum(self._kinds.values())
        extra = _text(ended)
        text = "%s works again: outage ended after %.1f s (since %s), %d attempt%s failed (%s)%s%s"
        args = (
            _text(self.what),
            seconds,
            _clock(self._since_wall),
            attempts,
            "" if attempts == 1 else "s",
            _kinds(self._kinds),
            "; " + extra if extra else "",
            self._quiet_said(),
        )
        return text, args

    def _count_quiet(self, seconds: float) -> None:
        if not self._quiet:
            self._quiet_first = self._since_wall
        self._quiet += 1
        self._quiet_seconds += seconds
        self._quiet_kinds.update(self._kinds)
        self._quiet_level = max(self._quiet_level, self._outage_level)

    def _quiet_said(self) -> str:
        """What the outages not logged one by one were (then forgotten), or ``""``."""
        if not self._quiet:
            return ""
        said = (
            f" (before it, {self._quiet} more outage{'s' if self._quiet > 1 else ''} since "
            f"{_clock(self._quiet_first)} not logged one by one, the link flapping: "
            f"{self._quiet_seconds:.1f} s down in all, failed: {_kinds(self._quiet_kinds)})"
        )
        self._quiet = 0
        self._quiet_seconds = 0.0
        self._quiet_kinds = Counter()
        self._quiet_level = logging.NOTSET
        return said

    def _summary_now(self, now: float) -> tuple[int, str, tuple[object, ...]] | None:
        """The line of the outages not logged one by one, once the link works and the limit
        allows one more line."""
        if not self._quiet or not self._take(now):
            return None
        level = self._quiet_level
        count, seconds, kinds, first = self._quiet, self._quiet_seconds, self._quiet_kinds, self._quiet_first
        self._quiet_said()  # said now: forget them
        text = (
            "%s works again after %d outage%s since %s not logged one by one (the link flapped): "
            "%.1f s down in all, failed: %s"
        )
        args = (_text(self.what), count, "s" if count > 1 else "", _clock(first), seconds, _kinds(kinds))
        return level, text, args


_shared: weakref.WeakKeyDictionary[object, dict[str, Outage]] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def shared(owner: object, name: str, make: Callable[[], Outage]) -> Outage:
    """The :class:`Outage` *name* of *owner* (made by *make* the first time), one for every
    caller that shares *owner*: the views of one reader (an exporter's whole ``/metrics``, its
    slices, its endpoint views) log one outage of their reads, not one each. Dropped with *owner*."""
    with _shared_lock:
        of_owner = _shared.setdefault(owner, {})
        found = of_owner.get(name)
        if found is None:
            found = of_owner[name] = make()
        return found


def _forked() -> None:
    # A lock held by a thread that does not exist in the child would never be released.
    global _shared_lock
    _shared_lock = threading.Lock()
    for outage in list(_every):
        outage._lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forked)
