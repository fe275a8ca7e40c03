"""``confirm: full`` through the data flow and a real SQLite store, without sockets:
group commit before the writer's Confirm, Confirm ``multiple``, Reject ``recycle``,
release on a dead link, and everything pending again after a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from peermesh.mtl.credentials import CredentialsFile, make_user
from peermesh.mtl.dataflow import DataFlow, MeshShout
from peermesh.mtl.delivery import DurableQueues
from peermesh.mtl.profiles import MESH
from peermesh.mtl.store import ContentStore
from peermesh.wire.mtl import (Confirm, Content, Direction, Lease, Reject, Response, Summon,
                               decode_data, encode_data)

NOW = 1_800_000_000.0
R1, R2, W1 = b"reader-1", b"reader-2", b"writer-1"


@pytest.fixture
def users(tmp_path: Path) -> CredentialsFile:
    creds = CredentialsFile(tmp_path / "creds.json")
    alice = make_user("alice", "pw", read=["*"], write=["*"])
    creds.update(lambda u: u.__setitem__("alice", alice))
    return creds


def open_flow(tmp_path: Path, users: CredentialsFile, window: int = 1000) -> DataFlow:
    store = ContentStore(tmp_path / "mtl.sqlite3")
    return DataFlow(still_valid=users.still_valid, queues=DurableQueues(store, window))


@pytest.fixture
def flow(tmp_path: Path, users: CredentialsFile) -> Iterator[DataFlow]:
    flow = open_flow(tmp_path, users)
    yield flow
    assert flow.queues is not None
    flow.queues.close()


def bind(flow: DataFlow, users: CredentialsFile, identity: bytes, direction: Direction,
         resources: tuple[str, ...] = ("jobs",), confirm: str = "full") -> str:
    user = users.user("alice")
    assert user is not None
    grant = flow.grant(b"s", user, MESH, "", direction, resources, confirm, NOW)
    assert feed(flow, identity, Lease(1, grant.token)) == [(identity, Response(1, 200))]
    return grant.token


def feed(flow: DataFlow, identity: bytes, *commands: object, flush: bool = False) -> list:
    for command in commands:
        flow.handle(identity, encode_data(command), NOW)  # type: ignore[arg-type]
    if flush:
        flow.flush()
    sends, _ = flow.take()
    return [(who, decode_data(f)) for who, f in sends]


def test_writer_confirmed_only_after_commit_with_multiple(flow: DataFlow,
                                                          users: CredentialsFile) -> None:
    bind(flow, users, W1, Direction.WRITE)
    for command in (Content(1, "", b"a"), Content(2, "", b"b")):
        flow.handle(W1, encode_data(command), NOW)
    sends, actions = flow.take()
    assert sends == [] and actions == [MeshShout("jobs", [b"a"]), MeshShout("jobs", [b"b"])]
    flow.flush()
    sends, _ = flow.take()
    assert [(w, decode_data(f)) for w, f in sends] == [(W1, Confirm(2, True))]
    assert flow.queues is not None and flow.queues.store.pending("jobs") == 2


def test_reader_gets_stored_content_after_its_summon_response(flow: DataFlow,
                                                              users: CredentialsFile) -> None:
    bind(flow, users, W1, Direction.WRITE)
    feed(flow, W1, Content(1, "", b"a", {"n": 1}), Content(2, "", b"b"), flush=True)
    bind(flow, users, R1, Direction.READ)
    assert feed(flow, R1, Summon(2, "jobs")) == [
        (R1, Response(2, 200)), (R1, Content(1, "jobs", b"a", {"n": 1})),
        (R1, Content(2, "jobs", b"b"))]
    assert feed(flow, R1, Confirm(2, True), flush=True) == []
    assert flow.queues is not None and flow.queues.store.count == 0


def test_reject_recycle_redelivers_and_plain_reject_drops(flow: DataFlow,
                                                          users: CredentialsFile) -> None:
    bind(flow, users, R1, Direction.READ)
    feed(flow, R1, Summon(1, "jobs"))
    bind(flow, users, W1, Direction.WRITE)
    feed(flow, W1, Content(1, "", b"a"), Content(2, "", b"b"), flush=True)
    assert [c for _, c in feed(flow, R1, Reject(1, False, True))] == \
        [Content(3, "jobs", b"a")]  # back again, under the lease's next sequence
    assert feed(flow, R1, Reject(2, False, False), Confirm(3), flush=True) == []
    assert flow.queues is not None and flow.queues.store.count == 0


def test_window_bounds_what_a_reader_holds(tmp_path: Path, users: CredentialsFile) -> None:
    flow = open_flow(tmp_path, users, window=2)
    try:
        bind(flow, users, R1, Direction.READ)
        feed(flow, R1, Summon(1, "jobs"))
        bind(flow, users, W1, Direction.WRITE)
        out = feed(flow, W1, *[Content(i, "", b"%d" % i) for i in range(1, 6)], flush=True)
        assert [c.body for w, c in out if w == R1] == [b"1", b"2"]
        assert [c.body for _, c in feed(flow, R1, Confirm(1))] == [b"3"]
    finally:
        assert flow.queues is not None
        flow.queues.close()


def test_dead_reader_releases_to_another(flow: DataFlow, users: CredentialsFile) -> None:
    bind(flow, users, R1, Direction.READ)
    feed(flow, R1, Summon(1, "jobs"))
    bind(flow, users, R2, Direction.READ)
    feed(flow, R2, Summon(1, "jobs"))
    bind(flow, users, W1, Direction.WRITE)
    out = feed(flow, W1, Content(1, "", b"x"), flush=True)
    assert [w for w, c in out if isinstance(c, Content)] == [R1]  # one reader holds it
    flow.links[R2].heard = NOW + 100  # R2 stays alive, R1 goes silent
    flow.tick(NOW + 10)
    flow.flush()
    sends, _ = flow.take()
    assert [(w, decode_data(f)) for w, f in sends if decode_data(f) != Content(0)] == \
        [(R2, Content(1, "jobs", b"x"))]


def test_unconfirmed_content_survives_a_restart_confirmed_does_not(
        tmp_path: Path, users: CredentialsFile) -> None:
    flow = open_flow(tmp_path, users)
    bind(flow, users, W1, Direction.WRITE)
    feed(flow, W1, *[Content(i, "", b"%d" % i) for i in range(1, 4)], flush=True)
    bind(flow, users, R1, Direction.READ)
    feed(flow, R1, Summon(1, "jobs"))
    feed(flow, R1, Confirm(1), flush=True)  # 1 confirmed and committed; 2, 3 only handed out
    assert flow.queues is not None
    flow.queues.close()
    again = open_flow(tmp_path, users)
    try:
        assert again.queues is not None and again.queues.wants(("mesh", "jobs"))
        bind(again, users, R1, Direction.READ)
        assert [c.body for _, c in feed(again, R1, Summon(1, "jobs"))[1:]] == [b"2", b"3"]
    finally:
        again.queues.close()  # type: ignore[union-attr]


def test_shouts_into_a_durable_group_are_stored(flow: DataFlow, users: CredentialsFile) -> None:
    flow.shouted("jobs", [b"before"], "ab" * 16)  # nobody asked for jobs yet: not stored
    bind(flow, users, R1, Direction.READ)
    feed(flow, R1, Summon(1, "jobs"))
    flow.links.pop(R1)  # (the reader vanishes without a trace: a restart would do the same)
    flow.shouted("jobs", [b"kept"], "ab" * 16)
    flow.flush()
    assert flow.queues is not None and flow.queues.store.count == 1
