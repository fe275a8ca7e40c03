"""Spoofing on a plain (keyless) mesh: forged beacons must not cut off or move a live peer.

Beacons carry UUIDs in the clear, so anyone on the LAN can forge one. The
forger here sends from 127.0.0.2 (loopback is a /8: every 127.x address is
this host, inside the interface's network), while the nodes live at
127.0.0.1. Identity takeover on the mailbox is in test_hostile.py.
"""

from __future__ import annotations

import socket
from typing import Callable, Iterator

import pytest

from peermesh.events import EventType
from peermesh.wire import zre

try:  # tests/ as a package
    from ..waiting import poll_until
    from .test_hostile import (Mesh, RawPeer, assert_no_mail, assert_none, beacon_barrier,
                               enter_raw, is_, make_raw, mesh)
except ImportError:  # tests/zre on sys.path (pytest's default "prepend" import mode)
    from waiting import poll_until
    from test_hostile import (Mesh, RawPeer, assert_no_mail, assert_none, beacon_barrier,
                              enter_raw, is_, make_raw, mesh)

__all__ = ["make_raw", "mesh"]  # fixtures, used by name

ENTER, EXIT, WHISPER = EventType.ENTER, EventType.EXIT, EventType.WHISPER
FORGER = "127.0.0.2"


@pytest.fixture
def forge() -> Iterator[Callable[[int, bytes], None]]:
    """``forge(beacon_port, datagram)``: broadcast from 127.0.0.2."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    sock.bind((FORGER, 0))
    yield lambda port, data: sock.sendto(data, ("127.255.255.255", port)) and None
    sock.close()


def test_forged_port_zero_beacon_does_not_cut_a_live_peer_off(
        mesh: Mesh, make_raw: Callable[..., RawPeer],
        forge: Callable[[int, bytes], None]) -> None:
    # One spoofed 22-byte beacon lost 1,442 of 1,921 whispers for `expired` seconds.
    assert mesh.good is not None and mesh.target is not None
    start = mesh.events.mark()
    good_start = mesh.good_events.mark()
    for _ in range(3):
        forge(mesh.port, zre.encode_beacon(zre.Beacon(mesh.good.uuid.bytes, 0)))
        forge(mesh.port, zre.encode_beacon(zre.Beacon(mesh.target.uuid.bytes, 0)))
    beacon_barrier(mesh, make_raw)
    mesh.assert_serving()
    assert_none(mesh.events, is_(EXIT, mesh.good.uuid), start=start, window=0)
    assert_none(mesh.good_events, is_(EXIT, mesh.target.uuid), start=good_start, window=0)
    assert mesh.target.stats()["leaves_ignored"] >= 3


def test_a_peers_own_port_zero_beacon_still_removes_it(
        mesh: Mesh, make_raw: Callable[..., RawPeer],
        forge: Callable[[int, bytes], None]) -> None:
    raw = make_raw()
    enter_raw(mesh, raw)
    start = mesh.events.mark()
    forge(mesh.port, raw.beacon_bytes(0))  # forged: ignored
    raw.beacon(mesh.port, 0)  # its own, from its address
    raw.disconnect()  # and its link closes, as a leaving node's does
    exit_ = mesh.events.wait_for(is_(EXIT, raw.uuid), start=start)
    assert exit_.reason == "left"
    mesh.assert_serving()


def test_a_port_zero_beacon_from_the_peers_own_address_does_not_cut_it_off(
        mesh: Mesh, make_raw: Callable[..., RawPeer]) -> None:
    # Another process on the peer's host (or a forged source address): the beacon
    # is the peer's own as far as UDP can tell, but its live link answers the PING.
    assert mesh.good is not None and mesh.target is not None
    start, good_start = mesh.events.mark(), mesh.good_events.mark()
    same_host = make_raw()  # at 127.0.0.1, where the good peer lives
    for _ in range(3):
        same_host.beacon(mesh.port, 0, uuid=mesh.good.uuid)
        same_host.beacon(mesh.port, 0, uuid=mesh.target.uuid)
    beacon_barrier(mesh, make_raw)
    for n in range(40):
        mesh.good.whisper(mesh.target.uuid, b"after-%d" % n)
    mesh.events.wait_for(is_(WHISPER, mesh.good.uuid, (b"after-39",)), start=start)
    got = [e.frames for e in mesh.events.since(start, mesh.good.uuid) if e.type is WHISPER
           and e.frames[0].startswith(b"after-")]
    assert got == [(b"after-%d" % n,) for n in range(40)]
    # the decision comes once `interval` has passed with the link still open
    poll_until(lambda: mesh.target.stats()["leaves_ignored"] >= 1  # type: ignore[union-attr]
               and mesh.good.stats()["leaves_ignored"] >= 1,  # type: ignore[union-attr]
               10.0, "the beacons judged forged")
    mesh.assert_serving()
    assert_none(mesh.events, is_(EXIT, mesh.good.uuid), start=start, window=0)
    assert_none(mesh.good_events, is_(EXIT, mesh.target.uuid), start=good_start, window=0)


def test_an_unanswered_port_zero_beacon_removes_the_peer_within_interval(
        mesh: Mesh, make_raw: Callable[..., RawPeer]) -> None:
    # The link stays open but nothing answers the PING (a node that hangs as it
    # leaves): gone after ``interval``, not after ``expired``.
    raw = make_raw()
    enter_raw(mesh, raw)
    start = mesh.events.mark()
    raw.beacon(mesh.port, 0)
    exit_ = mesh.events.wait_for(is_(EXIT, raw.uuid), start=start)
    assert exit_.reason == "left"
    assert isinstance(raw.expect(zre.Ping, sender=mesh.uuid), zre.Ping)
    mesh.assert_serving()


def test_forged_beacon_with_a_live_uuid_at_another_endpoint(
        mesh: Mesh, make_raw: Callable[..., RawPeer],
        forge: Callable[[int, bytes], None]) -> None:
    # A beacon with the good peer's UUID pointing elsewhere (the raw peer's
    # mailbox): no HELLO may go there, and the good peer stays where it is.
    assert mesh.good is not None and mesh.target is not None
    raw = make_raw()
    start = mesh.events.mark()
    forge(mesh.port, zre.encode_beacon(zre.Beacon(mesh.good.uuid.bytes, raw.port)))
    raw.beacon(mesh.port, uuid=mesh.good.uuid)  # and from 127.0.0.1, the good peer's host
    beacon_barrier(mesh, make_raw)
    mesh.assert_serving()
    assert_no_mail(raw)
    assert_none(mesh.events, lambda e: e.type in (ENTER, EXIT) and e.peer == mesh.good.uuid,
                start=start, window=0)
    assert mesh.target.peer_address(mesh.good.uuid) == mesh.good.endpoint
    assert mesh.target.stats()["reports_ignored"] >= 1
