"""The private servers the demo and the tests start: ports that a restart in place can take again."""

from __future__ import annotations

from pathlib import Path

import pytest

from redis_stats.tools.embedded import free_port

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@pytest.mark.skipif(not RANGE.exists(), reason="Linux only: the kernel's ephemeral port range")
def test_free_ports_are_below_the_ephemeral_range():
    """A port in the kernel's ephemeral range can become the local end of any process's outgoing
    connection while a server is stopped, and the restart in place then fails with "Address
    already in use" (CI failed so on a Cluster node's bus port). Free ports come from below it."""
    low = int(RANGE.read_text().split()[0])
    ports = {free_port() for _ in range(50)}
    assert all(1024 < p < low and p != 6379 for p in ports), sorted(ports)
    assert len(ports) > 40  # drawn at random, not one port handed to every caller
