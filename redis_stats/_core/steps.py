"""Steps: a decision procedure written once, carried out blocking or awaited.

A sans-I/O procedure (one read of a namespace, one flush round of a writer) is a generator that
yields ``(what, argument)`` steps — "run this transaction", "send this script call" — and is sent
each step's result, or thrown the exception carrying it out raised. :func:`run` carries the steps
out with a blocking function (the threaded classes), :func:`arun` with a coroutine function (the
asyncio twins in ``redis_stats/aio/``): the procedure itself, with every decision in it (retry,
fall back, count a failure), exists once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: A procedure: yields (what, argument), is sent the result, returns its outcome.
Steps = Generator[tuple[str, Any], Any, T]


class _Driver(Generic[T]):
    """Walks *steps*: iterating gives each step, :meth:`send` or :meth:`throw` says what carrying
    it out came to, and ``outcome`` is the procedure's once the iteration ends (the part of
    :func:`run` and :func:`arun` that is not the call of a step)."""

    def __init__(self, steps: Steps[T]) -> None:
        self._steps = steps
        self._result: Any = None
        self._error: Exception | None = None
        self.outcome: T

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        steps = self._steps
        while True:
            error, self._error = self._error, None
            try:
                step = steps.throw(error) if error is not None else steps.send(self._result)
            except StopIteration as done:
                self.outcome = done.value
                return
            self._result = None
            yield step

    def send(self, result: Any) -> None:
        """The step just given was carried out: *result* is sent into the procedure."""
        self._result = result

    def throw(self, exc: Exception) -> None:
        """Carrying out the step just given raised *exc*: it is thrown into the procedure."""
        self._error = exc


def run(steps: Steps[T], carry_out: Callable[[str, Any], Any]) -> T:
    """Carry out every step of *steps* with *carry_out* (blocking); the procedure's outcome.

    An ``Exception`` raised by a step is thrown into the procedure, which handles it or lets it
    propagate; ``BaseException`` (KeyboardInterrupt, SystemExit) is not: it ends the procedure.
    """
    driver = _Driver(steps)
    for what, arg in driver:
        try:
            driver.send(carry_out(what, arg))
        except Exception as exc:
            driver.throw(exc)
    return driver.outcome


async def arun(steps: Steps[T], carry_out: Callable[[str, Any], Awaitable[Any]]) -> T:
    """:func:`run`, with each step awaited."""
    driver = _Driver(steps)
    for what, arg in driver:
        try:
            driver.send(await carry_out(what, arg))
        except Exception as exc:
            driver.throw(exc)
    return driver.outcome
