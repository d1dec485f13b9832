"""Steps: a decision procedure written once, carried out blocking or awaited.

A sans-I/O procedure (one read of a namespace, one flush round of a writer) is a generator that
yields ``(what, argument)`` steps — "run this transaction", "send this script call" — and is sent
each step's result, or thrown the exception carrying it out raised. :func:`run` carries the steps
out with a blocking function (the threaded classes), :func:`arun` with a coroutine function (the
asyncio twins in ``redis_stats/aio/``): the procedure itself, with every decision in it (retry,
fall back, count a failure), exists once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

T = TypeVar("T")

#: A procedure: yields (what, argument), is sent the result, returns its outcome.
Steps = Generator[tuple[str, Any], Any, T]


def run(steps: Steps[T], carry_out: Callable[[str, Any], Any]) -> T:
    """Carry out every step of *steps* with *carry_out* (blocking); the procedure's outcome.

    An ``Exception`` raised by a step is thrown into the procedure, which handles it or lets it
    propagate; ``BaseException`` (KeyboardInterrupt, SystemExit) is not: it ends the procedure.
    """
    result: Any = None
    error: Exception | None = None
    while True:
        try:
            what, arg = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            result, error = carry_out(what, arg), None
        except Exception as exc:
            result, error = None, exc


async def arun(steps: Steps[T], carry_out: Callable[[str, Any], Awaitable[Any]]) -> T:
    """:func:`run`, with each step awaited (the same loop: only the ``await`` differs)."""
    result: Any = None
    error: Exception | None = None
    while True:
        try:
            what, arg = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            result, error = await carry_out(what, arg), None
        except Exception as exc:
            result, error = None, exc
