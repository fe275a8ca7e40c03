"""A Flux rank's tree ROUTER under the connection policy: a bounded flood of idle
connections is shed and members still served; a client whose key leaves the allowlist
is cut off and no longer answered."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import gevent
import pytest

from peermesh.flux import FluxClient, FluxError, FluxOverlay, FluxSettings
from peermesh.io.curve import Curve
from flooding import flood, lowered_cap, wait_shed

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zre"))
from curvemesh import KeyRing  # noqa: E402

from .conftest import wait_until  # noqa: E402

#: each test with the common hops routed in C and in Python (conftest ``both_paths``)
pytestmark = pytest.mark.usefixtures("both_paths")

FAST = FluxSettings(heartbeat=0.1, torpid=0.3, lost=0.6, hello_timeout=0.5)


def port_of(flux: FluxOverlay) -> int:
    return int(flux.endpoint.rpartition(":")[2])


def test_a_flood_of_idle_connections_to_rank_0_is_shed_and_members_served() -> None:
    with lowered_cap():
        root = FluxOverlay(root=True, topology="kary:2", settings=FAST,
                           address="127.0.0.1").start()
    one = FluxOverlay(parents=[root.endpoint], topology="kary:2", settings=FAST,
                      address="127.0.0.1").start()
    try:
        assert one.wait_online(10)
        root.register("demo.who", lambda request: {"rank": root.rank})
        with flood(port_of(root)):
            wait_shed(root.limits, sleep=gevent.sleep)
            wait_until(lambda: one.wait_online(0), 5, "rank 1 online")
            assert one.rpc("demo.who", None, 0).get_json(5) == {"rank": 0}
    finally:
        one.stop()
        root.stop()


def test_a_client_whose_key_is_removed_is_cut_off(tmp_path: Path) -> None:
    ring = KeyRing(tmp_path)
    allowed = ring.allow("allowed", "root", "one", "client")
    root = FluxOverlay(curve=Curve.load(ring.secret("root"), allowed), root=True,
                       settings=FAST, address="127.0.0.1").start()
    root_key = ring.public("root").decode()
    one = FluxOverlay(curve=Curve.load(ring.secret("one"), allowed),
                      parents={root.endpoint: root_key}, settings=FAST,
                      address="127.0.0.1").start()
    client = FluxClient({root.endpoint: root_key}, curve=Curve.load(ring.secret("client")))
    try:
        assert one.wait_online(10)
        root.register("demo.who", lambda request: {"rank": root.rank})
        client.connect(5)
        assert client.rpc("demo.who").get_json(5) == {"rank": 0}
        os.remove(Path(allowed) / "client.key")
        wait_until(lambda: root.limits.get("connections_revoked") >= 1, 5,
                   "the client's connection closed")
        with pytest.raises(FluxError):
            client.rpc("demo.who").get_json(1.0)  # refused at its handshake now
        assert one.rpc("demo.who", None, 0).get_json(5) == {"rank": 0}
    finally:
        client.close()
        one.stop()
        root.stop()
