"""NFP workers and brokers under the connection policy: a bounded flood of idle
connections is shed and a client still served; a key removed from the allowlist is cut
off, its jobs failed (bounded versions of the floods, on 127.0.0.1, with keys)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import gevent
import pytest

from peermesh.nfp import NfpNode
from peermesh.nfp.broker import Broker
from peermesh.nfp.store import FAILED
from peermesh.wire.nfp import Status
from flooding import flood, lowered_cap, wait_shed

from .conftest import wait_until
from .test_curve_nfp import KeyedMesh


@pytest.fixture
def keyed(free_udp_port: int, tmp_path: Path) -> Iterator[KeyedMesh]:
    mesh = KeyedMesh(free_udp_port, tmp_path)
    yield mesh
    mesh.close()


def ready(keyed: KeyedMesh, brokered: bool) -> tuple[Any, list[NfpNode]]:
    """w1 (and a broker), clients a and b seeing it; the listener they reach."""
    worker_node = keyed.add("w1", workers=(("svc", "w1"),))
    broker = keyed.add("broker", broker="always") if brokered else None
    clients = [keyed.add(name) for name in ("a", "b")]
    listener = broker.broker if broker is not None else worker_node.workers[0]
    for client in clients:
        seen(client, listener)
    return listener, clients


def seen(client: NfpNode, listener: Any) -> None:
    """Wait until ``client`` reaches w1 through ``listener`` (w1 or the broker)."""
    if isinstance(listener, Broker):
        wait_until(lambda: client.current_broker is not None
                   and client.current_broker.endpoint == listener.endpoint, 5, "broker elected")
        wait_until(lambda: listener.dispatcher is not None
                   and "svc" in listener.dispatcher.services, 5, "w1 at the broker")
    else:
        wait_until(lambda: "w1" in client.client.direct_workers().get("svc", []), 5, "w1")


@pytest.mark.parametrize("brokered", [False, True], ids=["worker", "broker"])
def test_a_flood_of_idle_connections_is_shed_and_jobs_still_run(keyed: KeyedMesh,
                                                                 brokered: bool) -> None:
    with lowered_cap():
        listener, (client, _) = ready(keyed, brokered)
    port = int(listener.endpoint.rpartition(":")[2])
    with flood(port):
        wait_shed(listener.limits, sleep=gevent.sleep)
        seen(client, listener)  # (a busy machine may have made it miss keepalives)
        reply = client.client.run("svc", "echo", [1], target="all", timeout=5)
        assert reply.status is Status.OK and list(reply.body["workers"]) == ["w1"]


@pytest.mark.parametrize("brokered", [False, True], ids=["worker", "broker"])
def test_a_revoked_key_is_cut_off_and_its_job_failed(keyed: KeyedMesh, brokered: bool) -> None:
    listener, (a, b) = ready(keyed, brokered)
    worker = keyed.members[0][1].workers[0]
    posted = b.client.post("svc", "sleep", kwargs={"seconds": 60}, target="all", timeout=5)
    assert posted.status is Status.ACCEPTED, posted
    job = posted.body["uuid"]
    wait_until(lambda: worker.load == 1, 5, "b's job running")
    os.remove(Path(keyed.allowed) / "b.key")
    wait_until(lambda: listener.limits.get("connections_revoked") >= 1, 5,
               "b's connections closed")
    record = wait_until(lambda: (r := worker.store.worker_job("w1", job)) is not None
                        and r.state == FAILED and r, 5, "b's job failed")
    assert record.result["errors"] == ["the caller's key is no longer allowed"]
    assert worker.load == 0
    reply = a.client.run("svc", "echo", [2], target="all", timeout=5)
    assert reply.status is Status.OK
