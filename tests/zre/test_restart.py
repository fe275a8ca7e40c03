"""A node back at its endpoint under a new UUID, and a pair out of step: nothing may be
dropped silently. Raw peers (``tests/rawpeer.py``) play the restarted node on loopback;
the mesh with its target and good peer is test_hostile.py's."""

from __future__ import annotations

from typing import Callable

from peermesh.events import EventType
from peermesh.wire import zre

try:  # tests/ as a package
    from .test_hostile import (Mesh, RawPeer, assert_whisper_delivered, enter_raw, is_,
                               make_raw, mesh, raw_at_port)
except ImportError:  # tests/zre on sys.path (pytest's default "prepend" import mode)
    from test_hostile import (Mesh, RawPeer, assert_whisper_delivered, enter_raw, is_,
                              make_raw, mesh, raw_at_port)

__all__ = ["make_raw", "mesh"]  # fixtures, used by name

ENTER, EXIT, JOIN, WHISPER = EventType.ENTER, EventType.EXIT, EventType.JOIN, EventType.WHISPER


def test_commands_after_a_held_hello_are_applied_in_order(
        mesh: Mesh, make_raw: Callable[..., RawPeer]) -> None:
    # The old holder's link stays open (a process that hangs, its port given up): the
    # new node's HELLO waits on a PING to it, and what the new node sends meanwhile,
    # as Zyre does at once, is held and applied after its HELLO, not dropped.
    old = make_raw(name="old")
    enter_raw(mesh, old)
    old.router.close(linger=0)  # its mailbox port is free again; its DEALER lives on
    start = mesh.events.mark()
    new = raw_at_port(make_raw, old.port, name="new")
    new.connect(mesh.endpoint)
    new.hello()
    new.join("early")
    for n in range(30):
        new.whisper(b"early-%d" % n)
    gone = mesh.events.wait_for(is_(EXIT, old.uuid), start=start)
    assert gone.reason == "replaced by another node at its endpoint"
    mesh.events.wait_for(is_(WHISPER, new.uuid, (b"early-29",)), start=start)
    got = [(e.type, e.group or (e.frames[0] if e.frames else None))
           for e in mesh.events.since(start, new.uuid)]
    assert got == [(ENTER, None), (JOIN, "early")] + [(WHISPER, b"early-%d" % n)
                                                      for n in range(30)]
    assert_whisper_delivered(mesh, new, b"in step")
    assert mesh.target.stats()["held_dropped"] == 0  # type: ignore[union-attr]
    mesh.assert_serving()


def test_a_live_holder_keeps_its_endpoint_and_the_claimant_gets_nothing_in(
        mesh: Mesh, make_raw: Callable[..., RawPeer]) -> None:
    # A third party says HELLO with the good peer's endpoint: the good peer answers the
    # PING over its link, so it stays, and the claimant's commands are dropped with
    # its claim.
    assert mesh.good is not None and mesh.target is not None
    start = mesh.events.mark()
    claimant = make_raw(name="claimant")
    claimant.connect(mesh.endpoint)
    claimant.hello(endpoint=mesh.good.endpoint)
    claimant.whisper(b"let me in")
    mesh.assert_serving()
    assert mesh.events.since(start, claimant.uuid) == []
    assert set(mesh.target.peers()) == {mesh.good.uuid}


def test_a_sequence_gap_makes_the_node_say_hello_again_at_once(
        mesh: Mesh, make_raw: Callable[..., RawPeer]) -> None:
    # Out of step, the target does not ignore the peer for ever: it drops it (EXIT)
    # and says HELLO again on a new link, so that the peer starts over too.
    raw = make_raw()
    enter_raw(mesh, raw)
    start = mesh.events.mark()
    raw.whisper(b"skipped ahead", sequence=raw.sequence + 2)
    gone = mesh.events.wait_for(is_(EXIT, raw.uuid), start=start)
    assert gone.reason.startswith("sequence gap")
    again = raw.expect(zre.Hello, sender=mesh.uuid)
    assert again.sequence == 1
    raw.hello()  # the peer starts over: HELLO back, numbered from 1
    mesh.events.wait_for(is_(ENTER, raw.uuid), start=start)
    assert_whisper_delivered(mesh, raw, b"in step again")
    assert mesh.target.stats()["sequence_resyncs"] == 1  # type: ignore[union-attr]
    mesh.assert_serving()


def test_a_restarted_node_whose_old_link_closed_is_in_at_its_hello(
        mesh: Mesh, make_raw: Callable[..., RawPeer]) -> None:
    # The old node's process is gone (its connection closed): no PING, no wait; the
    # target's own link to the endpoint reaches the new node, which may see it first.
    old = make_raw(name="old")
    enter_raw(mesh, old)
    old.close()
    start = mesh.events.mark()
    new = raw_at_port(make_raw, old.port, name="new")
    new.connect(mesh.endpoint)
    new.hello()
    new.whisper(b"first")
    mesh.events.wait_for(is_(WHISPER, new.uuid, (b"first",)), start=start)
    assert [e.type for e in mesh.events.since(start)
            if e.peer in (old.uuid, new.uuid)] == [EXIT, ENTER, WHISPER]
    while True:  # whatever reached the new node before the target's HELLO was not a PING
        message = new.recv_from(5.0)
        assert message is not None, "no HELLO from the target"
        if isinstance(message[1], zre.Hello):
            break
        assert not isinstance(message[1], zre.Ping), "the target asked the old node"
    mesh.assert_serving()
