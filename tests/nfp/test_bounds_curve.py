"""Bounds per client key on a mesh with keys: the POST bodies a worker stores per key."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator

import pytest

from peermesh import Node
from peermesh.nfp import NfpNode
from peermesh.wire.nfp import Status

from .conftest import NFP_TIMING, TIMING, make_tasks, wait_until
from .test_curve_nfp import KeyedMesh


@pytest.fixture
def keyed(free_udp_port: int, tmp_path: Path) -> Iterator[KeyedMesh]:
    mesh = KeyedMesh(free_udp_port, tmp_path)
    yield mesh
    mesh.close()


def add_bounded_worker(mesh: KeyedMesh, per_client: int) -> NfpNode:
    mesh.ring.allow("allowed", "w1")
    node = Node("w1", interface="lo", port=mesh.port, key_file=mesh.ring.secret("w1"),
                allowed_keys=mesh.allowed, **TIMING)
    nfp = NfpNode(node, data_dir=mesh.ring.root / "data", **NFP_TIMING)
    nfp.add_worker("svc", "w1", make_tasks(), max_stored_per_client=per_client)
    mesh.members.append((node, nfp))
    node.start()
    nfp.start()
    return nfp


@pytest.mark.parametrize("brokered", [False, True], ids=["direct", "brokered"])
def test_stored_bytes_are_bounded_per_client_key(keyed: KeyedMesh, brokered: bool,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    worker = add_bounded_worker(keyed, 10_000).workers[0]
    broker = keyed.add("broker", broker="always") if brokered else None
    greedy, modest = keyed.add("greedy"), keyed.add("modest")
    for client in (greedy, modest):
        if broker is not None:
            wait_until(lambda: client.current_broker is not None, 5, "broker elected")
            wait_until(lambda: len(broker.broker.dispatcher.services.get(  # type: ignore
                "svc", {})) >= 1, 5, "w1 registered with the broker")
        else:
            wait_until(lambda: "w1" in client.client.direct_workers().get("svc", []), 5, "w1")

    def post(client: NfpNode) -> Status:
        return client.client.post("svc", "echo", ["x" * 3000], target="w1", timeout=5).status

    with caplog.at_level(logging.WARNING, logger="peermesh.nfp.worker"):
        statuses = [post(greedy) for _ in range(5)]
        assert statuses == [Status.ACCEPTED] * 3 + [Status.ERROR] * 2
        assert post(modest) is Status.ACCEPTED   # another key has room of its own
    refused = greedy.client.post("svc", "echo", ["x" * 3000], target="w1", timeout=5)
    assert "max_stored_per_client" in str(refused.body)
    assert worker.limits.get("max_stored_per_client") == 3
    assert worker.limits.get("max_stored") == 0
    assert len([r for r in caplog.records
                if "max_stored_per_client" in r.getMessage()]) == 1   # once per interval
    # the caller's key is stored with each job: a count from the store agrees
    greedy_key = keyed.ring.public("greedy").decode()
    modest_key = keyed.ring.public("modest").decode()
    counted = worker.store.worker_bytes_by_caller("w1")
    assert set(counted) == {greedy_key, modest_key}
    assert counted == worker.quota.stored_by
    assert 9000 < counted[greedy_key] <= 10_000
