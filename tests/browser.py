"""A real headless Chromium, driven through chromedriver's W3C WebDriver HTTP API (urllib only).

Debian packages: ``apt-get install chromium chromium-driver`` (``make test-browser`` does it).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

from redis_stats.tools.embedded import free_port

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--window-size=1280,800",
]


def missing() -> str | None:
    """Why no browser test can run here, or None.

    With ``CI_REQUIRE_BROWSER=1`` (CI, ``.ci/run``) a missing browser is not a reason
    to skip: it raises, so the live page is never left untested.
    """
    why = None
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        why = "no chromium here: make test-browser installs it (apt-get install chromium chromium-driver)"
    elif not shutil.which("chromedriver"):
        why = "no chromedriver here: make test-browser installs it (apt-get install chromium-driver)"
    if why and os.environ.get("CI_REQUIRE_BROWSER") == "1":
        raise RuntimeError(f"CI_REQUIRE_BROWSER=1 but {why}")
    return why


class Browser:
    """One headless Chromium session."""

    def __init__(self) -> None:
        self.port = free_port()
        self.profile = tempfile.mkdtemp(prefix="redis_stats-chromium-")
        self.driver = subprocess.Popen(
            ["chromedriver", f"--port={self.port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                self._call("GET", "/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        caps = {"browserName": "chrome", "goog:chromeOptions": {
            "args": [*CHROMIUM_ARGS, f"--user-data-dir={self.profile}"],
            "binary": shutil.which("chromium") or shutil.which("chromium-browser"),
        }}  # fmt: skip
        reply = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})
        self.session = f"/session/{reply['value']['sessionId']}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # the driver's own words (a script's exception)
            detail = json.loads(exc.read() or b"{}").get("value", {})
            raise AssertionError(f"WebDriver {method} {path}: {detail.get('message', exc)}") from None

    def get(self, url: str) -> None:
        """Load *url* (returns when the page has loaded)."""
        self._call("POST", self.session + "/url", {"url": url})

    def js(self, script: str) -> Any:
        """The value of *script* (a function body: ``return ...``) in the page."""
        return self._call("POST", self.session + "/execute/sync", {"script": script, "args": []})["value"]

    def resize(self, width: int, height: int) -> None:
        """Set the window's size (a taller window screenshots the whole page)."""
        self._call("POST", self.session + "/window/rect", {"width": width, "height": height})

    def screenshot(self) -> bytes:
        """The window as PNG."""
        return base64.b64decode(self._call("GET", self.session + "/screenshot")["value"])

    def close(self) -> None:
        """End the session and the driver (which ends its browser)."""
        try:
            self._call("DELETE", self.session)
        except OSError:
            pass
        self.driver.terminate()
        self.driver.wait(10)
        shutil.rmtree(self.profile, ignore_errors=True)
