"""Joins are bounded: a stranger cannot take an instance's ranks, and ranks come back.

Rank 0's ``Directory`` counts ranks given and not attached (``max_joining``, and
``joins_per_link`` per connection), reclaims them after ``lost`` seconds, and
reclaims ranks reported lost after ``reclaim`` seconds. The flood tests send
joins as a stranger's link would, through ``FluxCore.receive``.
"""

from __future__ import annotations

import os

from peermesh.flux.core import FluxCore, FluxSettings, Send, State
from peermesh.flux.directory import Directory, Refusal
from peermesh.flux.topology import Topology
from peermesh.wire.flux import Errno, Request, Response, decode, encode, json_payload

from .harness import Tree

K2 = Topology(2)


def given(result: object) -> int:
    assert not isinstance(result, Refusal), result
    assert isinstance(result, tuple)
    return result[0]


def test_joins_per_connection_and_joining_in_all_are_bounded() -> None:
    directory = Directory(K2, 1000, "tcp://root", "root", max_joining=8, joins_per_link=3)
    ranks = [given(directory.give(-1, f"u{i}", f"tcp://a{i}", 0.0, "attacker"))
             for i in range(3)]
    assert ranks == [1, 2, 3]
    refused = directory.give(-1, "u3", "tcp://a3", 0.0, "attacker")
    assert isinstance(refused, Refusal) and refused.errnum == Errno.EAGAIN
    # the same node asking again (a retry) gets its rank again, not a new one
    assert given(directory.give(-1, "u1", "tcp://a1", 0.5, "attacker")) == 2
    for i in range(5):   # other connections fill what is left of max_joining
        given(directory.give(-1, f"v{i}", f"tcp://b{i}", 0.0, ("member", i)))
    refused = directory.give(-1, "real", "tcp://real", 0.0, "real")
    assert isinstance(refused, Refusal) and refused.errnum == Errno.EAGAIN
    # a node that attached is no longer joining: room again
    directory.attached(4, "v0", "tcp://b0")
    assert directory.joining == 7
    assert given(directory.give(-1, "real", "tcp://real", 1.0, "real")) == 9


def test_ranks_not_attached_are_reclaimed_and_given_again() -> None:
    directory = Directory(K2, 1000, "tcp://root", "root", max_joining=8, joins_per_link=8)
    for i in range(8):
        given(directory.give(-1, f"u{i}", f"tcp://a{i}", float(i), "attacker"))
    directory.attached(3, "u2", "tcp://a2")
    assert directory.expire(29.0, pending=30.0, reclaim=300.0) == []
    assert directory.expire(31.5, pending=30.0, reclaim=300.0) == [1, 2]   # given at 0 and 1
    assert sorted(directory.members) == [0, 3, 4, 5, 6, 7, 8]
    # the lowest free rank number is given first
    assert given(directory.give(-1, "real", "tcp://real", 32.0, "real")) == 1
    assert sorted(directory.expire(100.0, pending=30.0, reclaim=300.0)) == [1, 4, 5, 6, 7, 8]
    assert sorted(directory.members) == [0, 3]                  # the attached rank stays
    assert directory.joining == 0


def test_ranks_reported_lost_are_reclaimed_after_reclaim_unless_back() -> None:
    directory = Directory(K2, 1000, "tcp://root", "root")
    for i in range(3):
        given(directory.give(-1, f"u{i}", f"tcp://a{i}", 0.0, ("link", i)))
        directory.attached(i + 1, f"u{i}", f"tcp://a{i}")
    directory.lost(1, "u0", now=10.0)                           # its parent reported it
    directory.lost(2, "u1", now=10.0)
    directory.lost(3)                                           # a joiner could not reach it
    directory.attached(2, "u1", "tcp://a1")                     # rank 2 came back
    assert directory.expire(300.0, pending=30.0, reclaim=300.0) == []
    assert directory.expire(310.0, pending=30.0, reclaim=300.0) == [1]
    assert sorted(directory.members) == [0, 2, 3]
    assert given(directory.give(-1, "new", "tcp://new", 311.0, "new")) == 1


def test_taken_reports_count_as_joining() -> None:
    directory = Directory(K2, 1000, "tcp://root", "root", max_joining=100, joins_per_link=2)
    for rank in range(10, 20):
        directory.taken(rank, 0.0, "attacker")
    assert sorted(directory.members) == [0, 10, 11]
    assert directory.expire(30.0, pending=30.0, reclaim=300.0) == [10, 11]


def _join_topic() -> str:
    """The topic a joining node asks rank 0 for a rank with (as the code names it)."""
    joiner = FluxCore(os.urandom(16), "tcp://joiner", bootstrap=["tcp://root"])
    for output in joiner.start(0.0):
        if isinstance(output, Send):
            message = decode(list(output.frames))
            assert isinstance(message, Request)
            return message.topic
    raise AssertionError("a joining node sent no join")


JOIN = _join_topic()
HELLO = JOIN.rpartition(".")[0] + ".hello"


def _join_frames(uuid: str, tag: int) -> list[bytes]:
    return encode(Request(JOIN, json_payload(
        {"rank": -1, "uuid": uuid, "endpoint": f"tcp://10.0.0.9:{tag}"}), 0, tag, 0, ()))


def _answers(outputs: list) -> list[Response]:
    out = []
    for o in outputs:
        if isinstance(o, Send):
            message = decode(list(o.frames[1:]))
            if isinstance(message, Response):
                out.append(message)
    return out


def test_a_join_flood_over_one_connection_leaves_the_ranks_to_real_members() -> None:
    """The shape of 131,100 joins from one connection, bounded: 5,000 joins."""
    tree = Tree(k=0, max_size=64)   # flat: every member attaches to rank 0
    root = tree.add(root=True)
    stranger = os.urandom(16)
    errors = []
    for i in range(5000):
        for answer in _answers(root.receive(stranger, _join_frames(os.urandom(8).hex(), i + 1),
                                            tree.now)):
            errors.append(answer.errnum)
    settings = root.settings
    assert len(errors) == 5000
    assert errors.count(0) == settings.joins_per_link
    assert set(errors) == {0, Errno.EAGAIN}
    real = tree.add()                                           # a real member still joins
    assert real.state is State.ONLINE and real.rank == settings.joins_per_link + 1
    tree.advance(settings.lost + settings.heartbeat)            # the stranger's ranks expire
    assert sorted(root.directory.members) == [0, real.rank]
    assert root.directory.joining == 0
    again = tree.add()
    assert again.state is State.ONLINE and again.rank == 1      # a reclaimed number


def test_settings_bound_reclaim_below_lost() -> None:
    import pytest

    from peermesh.flux.errors import FluxStateError
    with pytest.raises(FluxStateError, match="reclaim"):
        FluxSettings(reclaim=1.0)
    with pytest.raises(FluxStateError, match="joins_per_link"):
        FluxSettings(joins_per_link=0)
    assert FluxCore(os.urandom(16), "tcp://x", root=True).directory.max_joining == 1024


def test_nesting_bombs_from_a_stranger_are_answered_eproto(caplog) -> None:  # type: ignore[no-untyped-def]
    import logging
    root = FluxCore(os.urandom(16), "tcp://root", root=True)
    root.start(0.0)
    stranger = os.urandom(16)
    bombs = [b"[" * 3000, b'{"a":' * 3000, b"[" * 200 + b"]" * 200]
    with caplog.at_level(logging.DEBUG):
        for tag, bomb in enumerate(bombs * 50, 1):
            for topic in (JOIN, HELLO):
                frames = encode(Request(topic, bomb + b"\0", 0, tag, 0, ()))
                for answer in _answers(root.receive(stranger, frames, 0.0)):
                    assert answer.errnum in (Errno.EPROTO, Errno.EINVAL)
    assert not [r for r in caplog.records if r.exc_info]
    assert sorted(root.directory.members) == [0]
