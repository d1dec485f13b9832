"""The step drivers the sync and asyncio twins share: one procedure, two ways to carry it out."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from redis_stats._core.steps import Steps, arun, run


def _procedure(log: list[str]) -> Steps[str]:
    got = yield ("get", 1)
    log.append(f"got {got}")
    try:
        yield ("fail", 2)
    except ValueError as exc:  # handled by the procedure: it goes on
        log.append(f"handled {exc}")
    try:
        yield ("fail", 3)
    except KeyError:
        pass  # not the error raised: the ValueError propagates
    return "never"


def _carry(what: str, arg: Any) -> Any:
    if what == "fail":
        raise ValueError(arg)
    return arg * 10


def test_results_are_sent_errors_thrown_in_and_unhandled_ones_raised():
    log: list[str] = []
    with pytest.raises(ValueError, match="3"):
        run(_procedure(log), _carry)
    assert log == ["got 10", "handled 2"]

    async def carry(what: str, arg: Any) -> Any:
        await asyncio.sleep(0)
        return _carry(what, arg)

    log2: list[str] = []
    with pytest.raises(ValueError, match="3"):
        asyncio.run(arun(_procedure(log2), carry))
    assert log2 == log


def test_the_outcome_is_returned_and_interrupts_are_not_thrown_in():
    def short() -> Steps[int]:
        a = yield ("get", 2)
        b = yield ("get", 3)
        return a + b

    assert run(short(), _carry) == 50
    caught: list[BaseException] = []

    def catching() -> Steps[None]:
        try:
            yield ("interrupt", None)
        except BaseException as exc:  # only GeneratorExit (when collected) may arrive here
            caught.append(exc)

    def interrupt(what: str, arg: Any) -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(catching(), interrupt)
    assert not [e for e in caught if isinstance(e, KeyboardInterrupt)]
