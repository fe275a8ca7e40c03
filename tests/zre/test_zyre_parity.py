"""ZRE as Zyre behaves, between processes in simulated LAN hosts (``tests/netlab.py``):
a peer restarted at its endpoint under a new UUID (pyre standing in for Zyre, which
binds the same port again), and Zyre's leader election among peermesh's faces."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

try:
    from . import lanpeers, netlab
except ImportError:
    import lanpeers
    import netlab

Driver, Fleet = lanpeers.Driver, lanpeers.Fleet
match = lanpeers.match
MAILBOX_PORT = 49160  # where the restarted pyre binds again, as Zyre would


@pytest.fixture
def fleet(lan_factory: Callable[..., netlab.Lan]) -> Iterator[Fleet]:
    fleet = Fleet()
    try:
        yield fleet
    finally:
        fleet.close()


def poll(what: str, check: Callable[[], Any], timeout: float = 3 * lanpeers.WAIT) -> Any:
    """``check()`` again every 50 ms until it returns something true; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


@pytest.mark.interop
def test_pyre_restarted_at_its_endpoint_is_entered_and_nothing_it_sends_is_lost(
        lan_factory, fleet):
    pytest.importorskip("pyre", reason="zeromq-pyre is not installed")
    lan = lan_factory(2)
    p, m = lan.hosts
    node = fleet.start(m, name="mesh", groups=["chat"])
    old = fleet.start(p, "pyre", name="old", groups=["chat"], mailbox_port=MAILBOX_PORT)
    node.wait(match("ENTER", peer=old.uuid))
    old.wait(match("ENTER", peer=node.uuid))

    old.kill()  # crashed: no port-0 beacon, its connections closed by the kernel
    since = node.mark()
    # A whisper into the restart window is taken, and its sender is told it was not
    # confirmed (the old node cannot answer: flush says False) and, next, EXIT.
    node.call("whisper", peer=old.uuid, msg="into the window")
    assert node.call("flush", seconds=0.5) is False

    new = fleet.start(p, "pyre", name="new", groups=["chat"], mailbox_port=MAILBOX_PORT)
    assert new.endpoint == old.endpoint and new.uuid != old.uuid
    # As Zyre does, the new node sends as soon as it has heard a beacon, before it
    # knows whether its HELLO was taken.
    poll("the restarted node knows the mesh node", lambda: node.uuid in new.call("known"))
    for i in range(20):
        new.send("whisper", peer=node.uuid, msg=f"early-{i}")

    got = node.wait_count(match("WHISPER", peer=new.uuid), 20, since=since)
    assert [e["message"] for e in got] == [f"early-{i}" for i in range(20)]
    gone = node.wait(match("EXIT", peer=old.uuid), since=since)
    assert gone["reason"] == "replaced by another node at its endpoint"
    enter = node.wait(match("ENTER", peer=new.uuid), since=since)
    assert enter["name"] == "new" and enter["address"] == new.endpoint
    node.wait(match("JOIN", peer=new.uuid, group="chat"), since=since)
    kinds = [e["event"] for e in node.find(lambda e: e.get("peer") == new.uuid, since)]
    assert "EXIT" not in kinds, kinds  # no "sequence gap": the pair stays in step

    node.call("whisper", peer=new.uuid, msg="welcome back")
    new.wait(match("WHISPER", peer=node.uuid, message="welcome back"))
    new.call("whisper", peer=node.uuid, msg="late")
    node.wait(match("WHISPER", peer=new.uuid, message="late"), since=since)
    assert not new.find(match("WHISPER", message="into the window"))


def test_a_live_election_among_peermesh_faces_and_a_reelection_when_the_leader_leaves(
        lan_factory, fleet):
    lan = lan_factory(3)
    h1, h2, h3 = lan.hosts
    a = fleet.start(h1, "green", name="a", groups=["ops"], contest=["ops"])
    b = fleet.start(h2, "threaded", name="b", groups=["ops"], contest=["ops"])
    c = fleet.start(h3, "green", name="c", groups=["ops"])  # takes part, does not stand
    nodes = [a, b, c]
    for x in nodes:
        for y in nodes:
            if x is not y:
                x.wait(match("JOIN", peer=y.uuid, group="ops"))
    winner, runner_up = sorted((a, b), key=lambda d: d.uuid)
    for x in nodes:
        poll(f"{x.name} names the leader {winner.uuid}: "
             f"{[(e['event'], e.get('peer')) for e in x.find(lambda e: e.get('event') in ('LEADER', 'JOIN', 'ENTER', 'EXIT'))]} "
             f"{[(y.name, y.uuid) for y in nodes]}",
             lambda x=x: x.call("leader", group="ops") == winner.uuid)
        event = x.wait(match("LEADER", peer=winner.uuid, group="ops"), 3 * lanpeers.WAIT)
        assert event["name"] == winner.name

    marks = {x.name: x.mark() for x in (runner_up, c)}
    winner.stop()  # the leader leaves: the other contester takes over
    for x in (runner_up, c):
        x.wait(match("EXIT", peer=winner.uuid), since=marks[x.name])
        event = x.wait(match("LEADER", peer=runner_up.uuid, group="ops"), 3 * lanpeers.WAIT,
                       since=marks[x.name])
        assert event["name"] == runner_up.name
        poll(f"{x.name} names the new leader",
             lambda x=x: x.call("leader", group="ops") == runner_up.uuid)
