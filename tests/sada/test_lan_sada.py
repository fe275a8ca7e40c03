"""Channels and servers on a simulated LAN: each in its own network namespace.

Hosts come from ``tests/netlab.py`` (``lan_factory``); every peer is a
``sadachild.py`` process inside a host, using the host's ``eth0`` and the
default beacon port (each LAN is private to the test). Needs root and ``ip``;
skipped with the harness's reason otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import PING, WAIT, Child, start_child

pytestmark = pytest.mark.lan


@pytest.fixture
def peers() -> Iterator[Callable[..., Child]]:
    """``peers(host, role, **cfg)``: a child in ``host``; closed, then killed, at the end."""
    started: list[Child] = []

    def make(host: Any, role: str, **cfg: Any) -> Child:
        child = start_child(role, popen=host.popen, **cfg)
        started.append(child)
        return child

    try:
        yield make
    finally:
        for child in reversed(started):
            try:
                child.close()
            finally:
                child.kill()


def test_requests_across_hosts_and_a_killed_server(lan_factory: Callable[..., Any],
                                                   peers: Callable[..., Child],
                                                   tmp_path: Path) -> None:
    lan = lan_factory(3)
    front, left, right = lan.hosts
    timing = dict(interval=0.1)
    channel = peers(front, "channel", name="front", port=5670, ping_interval=PING, **timing)
    assert channel.ready["endpoint"].startswith(f"tcp://{front.address}:")
    victim = peers(left, "server", name="left", port=5670, log_dir=str(tmp_path), **timing)
    peers(right, "server", name="right", port=5670, log_dir=str(tmp_path), **timing)
    assert channel.call("wait", service="work", count=2, timeout=WAIT) is True
    addresses = {s["address"] for s in channel.call("servers")}
    assert addresses == {left.address, right.address}
    assert channel.call("call", service="echo", action="info")["server"] in ("left", "right")

    since = channel.mark()
    channel.send("load", n=400, window=16, retries=1, ms=10)
    channel.wait(lambda e: e.get("event") == "PROGRESS" and e["done"] >= 100, WAIT, since)
    victim.kill9()
    report = channel.wait(lambda e: e.get("event") == "LOAD", 15, since)
    assert report["answered"] == 400 and report["ok"] == 400, report
    assert report["duplicates"] == 0 and report["wrong"] == 0 and not report["errors"]
    assert report["servers"]["right"] > 0 and report["servers"].get("left", 0) > 0
    assert report["stats"]["servers_dropped"] == 1
    assert [s["address"] for s in channel.call("servers")] == [right.address]
    # the LAN is still healthy for what remains
    assert channel.call("call", service="echo", action="echo", payload="after") == "after"
