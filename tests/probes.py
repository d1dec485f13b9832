"""What a test asks of something running: a GET that gives an error's status and body too, and a
wait until a check holds."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any


def fetch(url: str, timeout: float = 30) -> tuple[int, bytes]:
    """(status, body) of ``GET`` *url*, an HTTP error's as well."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def until(check: Callable[[], Any], timeout: float = 5.0) -> bool:
    """Whether *check* holds within *timeout* seconds (asked every 20 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False
