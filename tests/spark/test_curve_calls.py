"""``ServiceCaller`` on a mesh with keys: the executors' nodes and channels join it with
``key_file`` / ``allowed_keys`` (a writer's ``keyFile`` / ``allowedKeys``)."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from peermesh.spark.service import MeshSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zre"))
from curvemesh import KeyRing  # noqa: E402

sada = pytest.importorskip("peermesh.sada", reason="Safir-Darbaan (peermesh.sada) is missing")


def test_a_caller_carries_the_executors_keys() -> None:
    from peermesh.spark import ServiceCaller

    mesh = MeshSettings(interface="lo", port=5999)
    caller = ServiceCaller("calc", "double", mesh=mesh, key_file="/etc/pm/w.key_secret",
                           allowed_keys="/etc/pm/ok")
    assert caller.mesh == MeshSettings(interface="lo", port=5999,
                                       key_file="/etc/pm/w.key_secret",
                                       allowed_keys="/etc/pm/ok")
    assert pickle.loads(pickle.dumps(caller)) == caller
    assert ServiceCaller("calc", "double", mesh=mesh).mesh == mesh   # no keys: plain ZRE
    with pytest.raises(ValueError, match="allowed_keys needs key_file"):
        ServiceCaller("calc", "double", mesh=mesh, allowed_keys="/etc/pm/ok")
    with pytest.raises(ValueError, match="key_file is a path"):
        ServiceCaller("calc", "double", mesh=mesh, key_file="")


def test_a_keyed_service_call_from_executors(
        spark: Any, make_service: Callable[..., Any], make_peer: Callable[..., Any],
        tmp_path: Path) -> None:
    from peermesh.spark import ServiceCaller

    ring = KeyRing(tmp_path)
    allowed = ring.allow("allowed", "driver", "server", "executors")
    service = sada.Service("calc", "1.0")

    @service.action("double", inline=True)
    def double(value: Any) -> Any:
        return {"value": value * 2}

    make_service(["unused"], spark, key_file=ring.secret("driver"), allowed_keys=allowed)
    node = make_peer("calc-server", headers=dict(sada.ThreadedServer.headers),
                     key_file=ring.secret("server"), allowed_keys=allowed)
    server = sada.ThreadedServer(services=[service]).start(node)
    try:
        df = spark.range(0, 40, numPartitions=2)
        caller = ServiceCaller("calc", "double", key_file=ring.secret("executors"),
                               allowed_keys=allowed, discovery_timeout=20)
        rows = caller.apply(df, payload="id", reply_schema="value long").collect()
        assert sorted((r.id, r.value) for r in rows) == [(i, 2 * i) for i in range(40)]

        # a key the mesh does not admit finds no server: the rows say so
        ring.make("stranger")
        refused = ServiceCaller("calc", "double", key_file=ring.secret("stranger"),
                                allowed_keys=allowed, discovery_timeout=2, errors="column")
        rows = refused.apply(df.limit(2), payload="id", reply_schema="value long").collect()
        assert [(r.value, r.status) for r in rows] == [(None, 404), (None, 404)]
        assert "no server offers service 'calc'" in rows[0].error

        # a key file that is not there fails the task, naming it
        missing = ServiceCaller("calc", "double", key_file=str(tmp_path / "missing.key_secret"),
                                allowed_keys=allowed, discovery_timeout=2)
        with pytest.raises(Exception, match="no key file at"):
            missing.apply(df.limit(1), payload="id").collect()
    finally:
        server.stop(0.2)
