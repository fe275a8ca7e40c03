"""A job belongs to the key that posted it: GET, DELETE and a POST again from another key are
refused, unless that key is an admin key or granted all_jobs (a mesh with keys)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from peermesh.nfp import NfpNode
from peermesh.nfp.client import Reply
from peermesh.nfp.grants import parse
from peermesh.wire.nfp import Status

from .conftest import wait_until
from .test_curve_nfp import KeyedMesh
from .test_curve_roles import wait_for_w1

REFUSED = "was posted by another key"


@pytest.fixture
def keyed(free_udp_port: int, tmp_path: Path) -> Iterator[KeyedMesh]:
    mesh = KeyedMesh(free_udp_port, tmp_path)
    yield mesh
    mesh.close()


@pytest.mark.parametrize("brokered", [False, True], ids=["direct", "brokered"])
def test_a_job_is_only_its_posting_keys(keyed: KeyedMesh, brokered: bool) -> None:
    ring = keyed.ring
    grants = ring.root / "grants.toml"
    everyone = ", ".join(f'"{ring.public(n).decode()}"' for n in ("alice", "bob", "ops"))
    grants.write_text(f'[[grant]]\nkeys = [{everyone}]\ntasks = ["svc/*"]\n\n'
                      f'[[grant]]\nkeys = ["{ring.public("ops").decode()}"]\nall_jobs = true\n')
    admins = ring.allow("admins", "admin")
    keyed.add("w1", workers=(("svc", "w1"),), grants=str(grants), admin_keys=admins)
    broker = keyed.add("broker", broker="always", grants=str(grants), admin_keys=admins) \
        if brokered else None
    alice, bob, ops, admin = (keyed.add(n) for n in ("alice", "bob", "ops", "admin"))
    for client in (alice, bob, ops, admin):
        wait_for_w1(client, broker)
    worker = keyed.members[0][1].workers[0]

    def get(client: NfpNode, uuid: str) -> Reply:
        return client.client.get(uuid, service="svc", target="w1", timeout=5)

    def refused(reply: Reply) -> bool:
        return reply.status is Status.ERROR and REFUSED in str(reply.body)

    done = alice.client.run("svc", "echo", [1], target="w1", timeout=5)
    uuid = done.body["uuid"]
    # the key it came with is stored with the job (a finished one is read from the store)
    assert worker.store.worker_job("w1", uuid).body["caller"] == ring.public("alice").decode()
    assert refused(get(bob, uuid))
    assert refused(bob.client.delete(uuid, service="svc", target="w1", timeout=5))
    assert refused(bob.client.post("svc", "echo", [2], target="w1", uuid=uuid, timeout=5))
    for allowed in (alice, ops, admin):                   # its key, all_jobs, an admin key
        assert get(allowed, uuid).status is Status.OK

    running = alice.client.post("svc", "sleep", kwargs={"seconds": 30}, target="w1", timeout=5)
    assert running.status is Status.ACCEPTED, running
    long = running.body["uuid"]
    assert refused(bob.client.delete(long, service="svc", target="w1", timeout=5))
    assert get(alice, long).status is Status.PENDING     # still running
    deleted = alice.client.delete(long, service="svc", target="w1", timeout=5)
    assert deleted.status is Status.OK, deleted
    wait_until(lambda: get(alice, long).status is Status.OK, 5, "cancelled")

    counted = worker.stats["not_owner"] + (broker.broker.stats["not_owner"]  # type: ignore
                                           if broker is not None else 0)
    assert counted == 4
    if broker is not None:        # the broker refuses what it knows before any worker is asked
        assert broker.broker.stats["not_owner"] == 4  # type: ignore[union-attr]


def test_all_jobs_is_a_checked_grant_field() -> None:
    key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
    assert parse(f'[[grant]]\nkeys = ["{key}"]\nall_jobs = true\n') == {
        key.encode(): ((), (), True)}
    with pytest.raises(ValueError, match="all_jobs must be true or false"):
        parse(f'[[grant]]\nkeys = ["{key}"]\nall_jobs = "yes"\n')
