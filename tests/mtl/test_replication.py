"""Copies between gateways without sockets: the serving gateway's replicas (marks, held
answers, late replicas) and a standby following it (on a real store)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from peermesh.mtl.delivery import DurableQueues
from peermesh.mtl.replication import Follower, Offers, Replicas
from peermesh.mtl.store import ContentStore, make_cid

A, B, C = uuid4(), uuid4(), uuid4()


def replicas(*peers: UUID) -> Replicas:
    out = Replicas(wait=10.0)
    for peer in peers:
        out.add(peer)
    return out


def test_marks_are_numbered_per_standby_and_acknowledged_up_to_the_highest() -> None:
    r = replicas(A)
    assert [r.next_mark(A), r.next_mark(A), r.next_mark(B)] == [1, 2, 1]
    r.acknowledged(A, 2)
    r.acknowledged(A, 1)   # late and out of order: changes nothing
    assert r.reached(A, 2) and r.reached(A, 1) and not r.reached(A, 3)
    assert not r.reached(B, 1)


def test_answers_wait_in_order_until_one_replica_acknowledges() -> None:
    r = replicas(A, B)
    first = r.hold(["confirm 1"], now=0.0)
    second = r.hold(["confirm 2"], now=1.0)
    assert first == {A: 1, B: 1} and second == {A: 2, B: 2}
    assert r.holding and r.release() == []
    r.acknowledged(B, 2)                  # B has the second, so the first too
    assert r.release() == [["confirm 1"], ["confirm 2"]]
    assert not r.holding


def test_an_acknowledged_later_batch_never_overtakes_an_earlier_one() -> None:
    r = replicas(A)
    r.hold(["one"], now=0.0)
    marks = r.hold(["two"], now=0.0)
    r.add(B)                              # joined after both: no mark of its own
    r.acknowledged(B, marks[A])           # (a number of B's own marks, not these)
    assert r.release() == []
    r.acknowledged(A, 1)
    assert r.release() == [["one"]]
    r.acknowledged(A, 2)
    assert r.release() == [["two"]]


def test_answers_go_once_no_replica_in_step_can_acknowledge() -> None:
    r = replicas(A, B)
    r.hold(["x"], now=0.0)
    r.discard(A)                          # could not store a copy
    assert r.release() == []
    r.forget(B)                           # left the mesh
    assert r.release() == [["x"]]
    assert len(r) == 0 and r.hold(["y"], now=0.0) == {} and r.release() == [["y"]]


def test_replicas_silent_past_the_wait_stop_being_replicas() -> None:
    r = replicas(A, B, C)
    marks = r.hold(["x"], now=100.0)
    r.acknowledged(C, marks[C] - 1)       # an older mark only
    r.discard(B)
    assert r.late(109.9) == []
    assert sorted(r.late(110.0), key=str) == sorted([A, C], key=str)
    assert list(r) == [] and A not in r
    assert r.release() == [["x"]]
    assert r.late(200.0) == []            # nothing held any more


# --- a standby following the serving gateway, on a real store ---------------------

UPSTREAM = 0x1234   # the serving gateway's store origin


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[Follower]:
    queues = DurableQueues(ContentStore(tmp_path / "standby.db"))
    yield Follower(queues, wait=10.0)
    queues.close()


def repl(*contents: tuple[int, bytes], group: bytes = b"chat",
         table: bytes = b"\x00\x00") -> list[bytes]:
    """An MTL-REPL's frames after the first: (id at the serving gateway, body) each."""
    frames: list[bytes] = []
    for number, body in contents:
        frames += [group, make_cid(UPSTREAM, number), table, body]
    return frames


def test_a_copy_stores_what_comes_and_drops_what_it_did_not_name(follower: Follower) -> None:
    f = follower
    store = f.queues.store
    f.queues.received("chat", b"old", b"\x00\x00", make_cid(UPSTREAM, 1))  # held from before
    assert f.follow(A, now=5.0) == (1).to_bytes(8, "big") and f.upstream == A and f.copying
    f.copied(repl((2, b"two"), (3, b"three")))
    f.forgotten(make_cid(UPSTREAM, 3) + make_cid(UPSTREAM, 99))   # one held, one not
    assert not f.broken
    assert f.complete((7).to_bytes(8, "big")) is None      # another copy's mark
    assert f.complete((1).to_bytes(8, "big")) == 1         # "old": confirmed meanwhile
    assert not f.copying and f.upstream == A               # in step: a replica now
    assert store.all_cids() == {make_cid(UPSTREAM, 2)}
    assert f.complete((1).to_bytes(8, "big")) is None      # once


@pytest.mark.parametrize("frames", [
    [],                                            # no content
    repl((1, b"x"))[:3],                           # a content cut short
    repl((1, b"x"), group=b"\xff"),                # a group that is not UTF-8
    repl((1, b"x"), table=b"\x00\x05ab"),          # a table shorter than it says
    [b"chat", b"short cid", b"\x00\x00", b"x"],
])
def test_an_ill_formed_copy_breaks_it(follower: Follower, frames: list[bytes]) -> None:
    f = follower
    f.follow(A, now=0.0)
    f.copied(frames)
    assert f.broken
    f.stop()
    assert not f.broken and f.upstream is None and not f.copying


def test_a_copy_is_asked_again_until_something_comes_and_given_up_when_silent(
        follower: Follower) -> None:
    f = follower
    assert f.due(0.0) is None                              # not copying
    f.follow(A, now=100.0)
    assert f.due(100.5) == "ask"
    assert f.ask(101.0) == (1).to_bytes(8, "big")
    f.heard(101.2)
    assert f.due(105.0) is None
    assert f.due(111.3) == "stalled" and f.upstream is None
    assert f.follow(B, now=120.0) == (2).to_bytes(8, "big")   # a new copy, a new number
    f.lost()                                               # a whisper dropped on the way
    assert f.broken


# --- what other gateways offer ------------------------------------------------------

def handoff(number: int, body: bytes, group: bytes = b"chat") -> list[bytes]:
    """An MTL-HANDOFF's frames after the first."""
    return [group, number.to_bytes(8, "big"), make_cid(UPSTREAM, number), b"\x00\x00", body]


def test_a_batch_is_acknowledged_only_if_all_of_it_was_stored(tmp_path: Path) -> None:
    queues = DurableQueues(ContentStore(tmp_path / "serving.db"))
    try:
        offers = Offers(queues)
        for number in (1, 2):
            offers.offered(A, handoff(number, b"%d" % number))
        offers.offered(A, handoff(2, b"again"))                   # known: stored once, counted
        offers.offered(B, handoff(9, b"b"))
        assert offers.ended(A, 3) and not offers.ended(A, 3)      # (a batch ends once)
        offers.offered(A, handoff(3, b"x", group=b""))            # ill-formed: not counted
        offers.offered(A, handoff(4, b"x")[:4])
        offers.offered(A, handoff(5, b"five"))
        assert not offers.ended(A, 3)
        offers.lost(B)                                            # a whisper of B's dropped
        assert not offers.ended(B, 1)
        assert queues.store.all_cids() == {make_cid(UPSTREAM, n) for n in (1, 2, 5, 9)}
    finally:
        queues.close()
