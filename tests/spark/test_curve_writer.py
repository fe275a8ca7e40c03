"""Spark writers on a mesh with keys: the executors' nodes join it with keyFile/allowedKeys."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from peermesh.spark.service import MeshSettings
from peermesh.spark.source import WriteOptions

from .conftest import INTERVAL, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zre"))
from curvemesh import KeyRing  # noqa: E402


def test_write_options_carry_the_workers_keys(tmp_path: Path) -> None:
    opts = WriteOptions.parse({"group": "out", "serverkey": "k" * 40,
                               "keyfile": "/etc/pm/w.key_secret", "allowedkeys": "/etc/pm/ok"})
    assert opts.mesh.node_settings() == {"key_file": "/etc/pm/w.key_secret",
                                         "allowed_keys": "/etc/pm/ok"}
    assert MeshSettings.from_options({k.lower(): v for k, v in opts.mesh.to_options().items()}
                                     ) == opts.mesh
    with pytest.raises(ValueError, match="a write needs option keyFile"):
        WriteOptions.parse({"group": "out", "serverkey": "k" * 40})


def test_a_write_reaches_a_peer_on_a_mesh_with_keys(
        spark: Any, make_service: Callable[..., Any], make_peer: Callable[..., Any],
        tmp_path: Path) -> None:
    ring = KeyRing(tmp_path)
    allowed = ring.allow("allowed", "driver", "listener", "executors")
    make_service(["in"], spark, key_file=ring.secret("driver"), allowed_keys=allowed)
    listener = make_peer("listener", groups=["out"], key_file=ring.secret("listener"),
                         allowed_keys=allowed)
    received: list[Any] = []

    def arrived() -> bool:
        while (event := listener.recv(0)) is not None:
            if event.type.value == "SHOUT" and event.group == "out":
                received.append(event)
        return len(received) >= 20

    df = spark.createDataFrame([(i,) for i in range(20)], "id long").coalesce(1)
    (df.write.format("peermesh").option("group", "out")
     .option("keyFile", ring.secret("executors")).option("allowedKeys", allowed)
     .mode("append").save())
    wait_until(arrived, 30, "20 shouts in 'out'")
    assert sorted(e.unpack()["id"] for e in received) == list(range(20))
    executors = ring.public("executors").decode()
    assert {listener.peer_header_value(e.peer, "X-PUBLICKEY") for e in received} == {executors}


def test_an_executors_channel_speaks_curve_with_its_nodes_key(
        make_peer: Callable[..., Any], beacon_port: int, tmp_path: Path) -> None:
    """Service writes: the executor's Safir-Darbaan channel, on the executors' keys, is
    reached by a keyed server of the mesh (no Spark session needed)."""
    sada = pytest.importorskip("peermesh.sada")
    from peermesh.spark.executor import ExecutorMesh

    ring = KeyRing(tmp_path)
    allowed = ring.allow("allowed", "server", "executors")
    service = sada.Service("calc", "1.0")

    @service.action("double", inline=True)
    def double(value: Any) -> Any:
        return value * 2

    node = make_peer("calc-server", headers=dict(sada.ThreadedServer.headers),
                     key_file=ring.secret("server"), allowed_keys=allowed)
    server = sada.ThreadedServer(services=[service]).start(node)
    mesh = ExecutorMesh(MeshSettings(interface="lo", port=beacon_port, interval=INTERVAL,
                                     key_file=ring.secret("executors"), allowed_keys=allowed),
                        channel=True).start()
    try:
        assert mesh.curve is not None and mesh.curve.public == ring.public("executors")
        assert mesh.wait_service("calc", timeout=10)
        outcomes = mesh.request_many("calc", "double", [1, 2, 3], timeout=5)
        assert [o.value for o in outcomes] == [2, 4, 6]
    finally:
        mesh.stop()
        server.stop(0.2)
