"""The serving gateway's replicas as a table, without sockets: marks, held answers, late
replicas."""

from __future__ import annotations

from uuid import UUID, uuid4

from peermesh.mtl.replication import Replicas

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
