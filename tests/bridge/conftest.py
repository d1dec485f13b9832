"""Fixtures of the bridge's tests."""

from __future__ import annotations

import pytest

from tests.helpers.metrics_source import SyntheticCatalogue, serve


@pytest.fixture
def inproc():
    """An in-process source (faster than a process where no kill is needed)."""
    servers = []

    def make(catalog: str = "sglang", engines: int = 1, auth: str | None = None, process: bool = False):
        cat = SyntheticCatalogue(catalog, engines, seed=len(servers), process=process)
        server = serve(cat, auth=auth)
        servers.append(server)
        return cat, f"http://127.0.0.1:{server.server_port}/metrics"

    yield make
    for s in servers:
        s.shutdown()
        s.server_close()
