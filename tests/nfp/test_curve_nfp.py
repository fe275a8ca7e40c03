"""NFP on nodes with CURVE keys: workers, client and broker on the node's keys."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from peermesh import Node
from peermesh.nfp import NfpNode
from peermesh.wire.nfp import Status

from .conftest import NFP_TIMING, TIMING, make_tasks, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zre"))
from curvemesh import KeyRing  # noqa: E402


class KeyedMesh:
    """In-process nodes with keys, all admitting each other; stopped at the end."""

    def __init__(self, port: int, root: Path) -> None:
        self.port, self.ring = port, KeyRing(root)
        self.allowed = str(root / "allowed")
        (root / "allowed").mkdir()
        self.members: list[tuple[Node, NfpNode]] = []

    def add(self, name: str, **nfp_kw: Any) -> NfpNode:
        self.ring.allow("allowed", name)
        workers = nfp_kw.pop("workers", ())
        node = Node(name, interface="lo", port=self.port, key_file=self.ring.secret(name),
                    allowed_keys=self.allowed, **TIMING)
        nfp = NfpNode(node, data_dir=self.ring.root / "data", **{**NFP_TIMING, **nfp_kw})
        for service, worker in workers:
            nfp.add_worker(service, worker, make_tasks())
        self.members.append((node, nfp))
        node.start()
        nfp.start()
        return nfp

    def close(self) -> None:
        for node, nfp in reversed(self.members):
            try:
                nfp.stop()
            finally:
                node.stop()


@pytest.fixture
def keyed(free_udp_port: int, tmp_path: Path) -> Iterator[KeyedMesh]:
    mesh = KeyedMesh(free_udp_port, tmp_path)
    yield mesh
    mesh.close()


@pytest.mark.parametrize("brokered", [False, True], ids=["brokerless", "brokered"])
def test_jobs_over_curve(keyed: KeyedMesh, brokered: bool) -> None:
    for name in ("w1", "w2"):
        keyed.add(name, workers=(("svc", name),))
    broker = keyed.add("broker", broker="always") if brokered else None
    client = keyed.add("client")
    if broker is not None:
        wait_until(lambda: client.current_broker is not None
                   and client.current_broker.uuid == broker.node.uuid, 5, "broker elected")
        wait_until(lambda: broker.broker is not None and broker.broker.dispatcher is not None
                   and len(broker.broker.dispatcher.services.get("svc", {})) >= 2, 5,
                   "workers registered with the broker")
    else:
        wait_until(lambda: len(client.client.direct_workers().get("svc", [])) >= 2, 5,
                   "two workers")
    reply = client.client.run("svc", "echo", [1], target="all", timeout=5)
    assert reply.status is Status.OK and sorted(reply.body["workers"]) == ["w1", "w2"]
    assert all(keyed.ring.public(n).decode() in client.keys.values() for n in ("w1", "w2"))


@pytest.mark.parametrize("brokered", [False, True], ids=["brokerless", "brokered"])
def test_admin_role_is_a_set_of_keys(keyed: KeyedMesh, brokered: bool) -> None:
    admins = keyed.ring.allow("admins", "boss")
    keyed.add("w1", workers=(("svc", "w1"),), admin_keys=admins, admin_token="ignored")
    broker = keyed.add("broker", broker="always", admin_keys=admins) if brokered else None
    boss, other = keyed.add("boss"), keyed.add("other")
    for client in (boss, other):
        if broker is not None:
            wait_until(lambda: client.current_broker is not None, 5, "broker elected")
            wait_until(lambda: len(broker.broker.dispatcher.services.get(  # type: ignore
                "svc", {})) >= 1, 5, "w1 registered with the broker")
        else:
            wait_until(lambda: "w1" in client.client.direct_workers().get("svc", []), 5, "w1")

    def disconnect(client: NfpNode, **kwargs: Any) -> dict[str, Any]:
        reply = client.client.run("mmi.service.worker", "disconnect", kwargs=kwargs,
                                  target="w1", timeout=5)
        return reply.body["workers"]["w1"]

    refused = disconnect(other, token="ignored")  # the token does not count with admin keys
    assert refused["failed"] and "not an admin key" in refused["errors"][0]
    assert disconnect(boss)["failed"] is False
    if broker is not None:
        show = other.client.run("mmi.service.broker", "show_broker", target="any", timeout=5)
        assert show.status is Status.OK  # reading is anyone's
        (entry,) = other.client.run("mmi.service.broker", "shutdown", target="any",
                                    timeout=5).body["workers"].values()
        assert entry["failed"] and "not an admin key" in entry["errors"][0]
        assert broker.is_broker


def test_admin_keys_need_a_node_with_keys(tmp_path: Path, free_udp_port: int) -> None:
    node = Node("plain", interface="lo", port=free_udp_port)
    with pytest.raises(ValueError, match="admin_keys needs a node with keys"):
        NfpNode(node, data_dir=tmp_path, admin_keys=tmp_path)
