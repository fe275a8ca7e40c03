"""Interoperability with pyre (``zeromq-pyre`` 0.3.4), a real third-party ZRE peer.

Every node, pyre or peermesh, runs in its own simulated LAN host (network
namespace, see ``tests/netlab.py``), driven over stdin/stdout by
``tests/lanpeers.py``. pyre picks the first non-loopback IPv4 interface,
which in a host is ``eth0``; it beacons every second and binds its beacon
socket to the subnet's broadcast address. A pyre node must be stopped or its
process hangs: the driver always calls ``stop()`` (also on end of input) and
the fixtures kill what is left.

pyre's string encoder counts lengths in characters, not UTF-8 octets, so it
cannot *send* non-ASCII names, groups or headers (its HELLO comes out
malformed). Its decoder reads octets, so it *reads* non-ASCII from peermesh
correctly. The tests therefore send non-ASCII only towards pyre, and check
separately that pyre's malformed HELLO is dropped without harm.
"""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Callable, Iterator

import pytest

try:
    from . import lanpeers, netlab
except ImportError:
    import lanpeers
    import netlab

Driver, Fleet = lanpeers.Driver, lanpeers.Fleet
match = lanpeers.match

pytest.importorskip("pyre", reason="zeromq-pyre is not installed (pip install zeromq-pyre==0.3.4)")
PYRE_VERSION = importlib.metadata.version("zeromq-pyre")

pytestmark = pytest.mark.interop  # conftest adds "lan" to tests that build a LAN

PYRE_HEADERS = {"X-Impl": "pyre", "role": "legacy"}  # ASCII: pyre cannot send anything else
MESH_HEADERS = {"X-Impl": "peermesh", "note": "café ☕ – naïve ünïcode"}
TRAFFIC_SECONDS = 3.0


@pytest.fixture
def fleet(lan_factory: Callable[..., netlab.Lan]) -> Iterator[Fleet]:
    """Starts nodes in hosts; stops them (bounded, then killed) before the LAN goes."""
    fleet = Fleet()
    try:
        yield fleet
    finally:
        fleet.close()


def test_pyre_is_the_pinned_version():
    assert PYRE_VERSION == "0.3.4"


def others(node: Driver, nodes: list[Driver]) -> list[Driver]:
    return [n for n in nodes if n is not node]


def assert_enter(observer: Driver, peer: Driver, host: netlab.Host, headers: dict,
                 since: int = 0) -> None:
    enter = observer.wait(match("ENTER", peer=peer.uuid), since=since)
    assert enter["name"] == peer.name, enter
    assert enter["headers"] == headers, enter
    assert enter["address"] == peer.endpoint, enter
    assert enter["address"].startswith(f"tcp://{host.address}:"), enter


# --------------------------------------------------------------------------


def test_enter_join_and_leave_both_ways(lan_factory, fleet):
    lan = lan_factory(2)
    p, m = lan.hosts
    pyre = fleet.start(p, "pyre", name="pyre-node", groups=["chat"], headers=PYRE_HEADERS)
    node = fleet.start(m, name="mesh-node", groups=["chat", "ops"],
                       headers={"X-Impl": "peermesh"})
    assert pyre.endpoint.startswith(f"tcp://{p.address}:"), pyre.ready  # pyre chose eth0 too

    assert_enter(node, pyre, p, PYRE_HEADERS)
    assert_enter(pyre, node, m, {"X-Impl": "peermesh"})
    node.wait(match("JOIN", peer=pyre.uuid, group="chat"))
    pyre.wait_all([match("JOIN", peer=node.uuid, group="chat"),
                   match("JOIN", peer=node.uuid, group="ops")])

    # JOIN and LEAVE after ENTER, several times: pyre asserts that every JOIN/LEAVE
    # status byte is its count + 1, so a wrong status would kill its node thread.
    for round_ in range(3):
        group = f"late-{round_}"
        since_p, since_n = pyre.mark(), node.mark()
        pyre.call("join", group=group)
        node.call("join", group=group)
        node.wait(match("JOIN", peer=pyre.uuid, group=group), since=since_n)
        pyre.wait(match("JOIN", peer=node.uuid, group=group), since=since_p)
        pyre.call("leave", group=group)
        node.call("leave", group=group)
        node.wait(match("LEAVE", peer=pyre.uuid, group=group), since=since_n)
        pyre.wait(match("LEAVE", peer=node.uuid, group=group), since=since_p)

    # both still alive and talking after all that
    node.call("shout", group="chat", msg="still friends?")
    pyre.wait(match("SHOUT", peer=node.uuid, group="chat", message="still friends?"))
    pyre.call("shout", group="chat", msg="yes")
    node.wait(match("SHOUT", peer=pyre.uuid, group="chat", message="yes"))
    assert [p_["peer"] for p_ in pyre.call("peers")] == [node.uuid]
    (info,) = node.call("peers")
    assert info["peer"] == pyre.uuid and info["groups"] == ["chat"]


def test_headers_and_non_ascii_read_correctly_both_ways(lan_factory, fleet):
    lan = lan_factory(2)
    p, m = lan.hosts
    pyre = fleet.start(p, "pyre", name="pyre-node", headers=PYRE_HEADERS)
    node = fleet.start(m, name="mesh-zoë ☕", headers=MESH_HEADERS, groups=["grüppe"])

    assert_enter(node, pyre, p, PYRE_HEADERS)
    assert_enter(pyre, node, m, MESH_HEADERS)  # pyre decodes UTF-8 octet lengths correctly
    pyre.wait(match("JOIN", peer=node.uuid, group="grüppe"))
    (info,) = pyre.call("peers")
    assert info == {"peer": node.uuid, "address": node.endpoint, "headers": MESH_HEADERS}
    (info,) = node.call("peers")
    assert info["headers"] == PYRE_HEADERS and info["address"] == pyre.endpoint
    # non-ASCII content is only bytes to ZRE: fine both ways
    node.call("whisper", peer=pyre.uuid, msg="grüße ☕")
    pyre.wait(match("WHISPER", peer=node.uuid, message="grüße ☕"))
    pyre.call("whisper", peer=node.uuid, msg="danke ☕")
    node.wait(match("WHISPER", peer=pyre.uuid, message="danke ☕"))


def test_whisper_and_shout_both_ways(lan_factory, fleet):
    lan = lan_factory(2)
    p, m = lan.hosts
    pyre = fleet.start(p, "pyre", name="pyre-node", groups=["chat"])
    node = fleet.start(m, "threaded", name="mesh-node", groups=["chat"])
    node.wait(match("JOIN", peer=pyre.uuid, group="chat"))
    pyre.wait(match("JOIN", peer=node.uuid, group="chat"))

    node.call("whisper", peer=pyre.uuid, msg="to pyre")
    node.call("whisper", peer=pyre.uuid, frames=["a", "b", "c"])
    node.call("shout", group="chat", msg="shout to pyre")
    node.call("shout", group="chat", frames=["x", "y"])
    pyre.call("whisper", peer=node.uuid, msg="to peermesh")
    pyre.call("whisper", peer=node.uuid, frames=["1", "2", "3"])
    pyre.call("shout", group="chat", msg="shout to peermesh")
    pyre.call("shout", group="chat", frames=["p", "q"])

    def frames(*texts: str) -> list[dict]:
        return [{"text": t} for t in texts]

    for receiver, sender, (one, multi, shout_one, shout_multi) in (
            (pyre, node, ("to pyre", ("a", "b", "c"), "shout to pyre", ("x", "y"))),
            (node, pyre, ("to peermesh", ("1", "2", "3"), "shout to peermesh", ("p", "q")))):
        got = receiver.wait(match("WHISPER", peer=sender.uuid, frames=frames(one)))
        assert got["name"] == sender.name
        receiver.wait(match("WHISPER", peer=sender.uuid, frames=frames(*multi)))
        got = receiver.wait(match("SHOUT", peer=sender.uuid, group="chat",
                                  frames=frames(shout_one)))
        assert got["name"] == sender.name
        receiver.wait(match("SHOUT", peer=sender.uuid, group="chat", frames=frames(*shout_multi)))
        # in the order sent
        kinds = [(e["event"], e["message"]) for e in receiver.events
                 if e.get("peer") == sender.uuid and e["event"] in ("WHISPER", "SHOUT")]
        assert kinds == [("WHISPER", one), ("WHISPER", "".join(multi)),
                         ("SHOUT", shout_one), ("SHOUT", "".join(shout_multi))]


def test_exit_on_graceful_stop_both_ways(lan_factory, fleet):
    """A port-0 beacon makes the other side report EXIT at once (its timeouts are 10/30 s)."""
    lan = lan_factory(3)
    p, a, b = lan.hosts
    pyre = fleet.start(p, "pyre", name="pyre-node", groups=["chat"])
    alpha = fleet.start(a, name="alpha", groups=["chat"])
    beta = fleet.start(b, "threaded", name="beta", groups=["chat"])
    for x in (pyre, alpha, beta):
        for y in others(x, [pyre, alpha, beta]):
            x.wait(match("JOIN", peer=y.uuid, group="chat"))

    # peermesh stops: pyre sees EXIT at once
    since = pyre.mark()
    started = time.monotonic()
    stopping = alpha.begin_stop()
    pyre.wait(match("EXIT", peer=alpha.uuid, name="alpha"), since=since)
    assert time.monotonic() - started < 3.0
    alpha.stop(since=stopping)

    # pyre stops: peermesh sees EXIT at once, with the reason
    since = beta.mark()
    started = time.monotonic()
    stopping = pyre.begin_stop()
    exit_ = beta.wait(match("EXIT", peer=pyre.uuid), since=since)
    assert exit_["reason"] == "left" and exit_["address"] == pyre.endpoint
    assert time.monotonic() - started < 3.0
    pyre.stop(since=stopping)
    assert beta.call("peers") == []


def test_ping_and_ping_ok_keep_a_quiet_pyre_peer(lan_factory, fleet):
    """pyre beacons once a second; with a 0.5 s evasive timeout peermesh PINGs it each time.

    pyre's PING-OK must refresh it (no SILENT, no EXIT), and the PINGs must
    carry the right sequence numbers (pyre drops a peer on any gap).
    """
    lan = lan_factory(2)
    p, m = lan.hosts
    pyre = fleet.start(p, "pyre", name="pyre-node", groups=["chat"])
    node = fleet.start(m, name="mesh-node", groups=["chat"], interval=0.2, evasive=0.5,
                       silent=0.8, expired=3.0)
    node.wait(match("JOIN", peer=pyre.uuid, group="chat"))
    pyre.wait(match("JOIN", peer=node.uuid, group="chat"))
    since = node.mark()
    # three rounds of silence, PING and PING-OK
    node.wait_count(match("EVASIVE", peer=pyre.uuid), 3, since=since)
    assert not node.find(lambda e: e["event"] in ("SILENT", "EXIT"), since)
    assert not pyre.find(match("EXIT"))
    node.call("whisper", peer=pyre.uuid, msg="after the pings")
    pyre.wait(match("WHISPER", peer=node.uuid, message="after the pings"))
    pyre.call("whisper", peer=node.uuid, msg="and back")
    node.wait(match("WHISPER", peer=pyre.uuid, message="and back"))


def test_mixed_mesh_stays_whole_under_traffic(lan_factory, fleet):
    """Two pyre and two peermesh nodes: everyone sees everyone, every message arrives in order."""
    lan = lan_factory(4)
    specs = [("pyre", "pyre-1"), ("green", "mesh-1"), ("pyre", "pyre-2"), ("threaded", "mesh-2")]
    nodes = [fleet.start(host, kind, name=name, groups=["chat"])
             for host, (kind, name) in zip(lan.hosts, specs)]
    for x in nodes:
        for y in others(x, nodes):
            x.wait(match("ENTER", peer=y.uuid, name=y.name, address=y.endpoint))
            x.wait(match("JOIN", peer=y.uuid, group="chat"))
    since = {n.name: n.mark() for n in nodes}

    rounds = 0
    deadline = time.monotonic() + TRAFFIC_SECONDS
    while time.monotonic() < deadline:
        marks = {n.name: n.mark() for n in nodes}
        for i, sender in enumerate(nodes):
            sender.send("shout", group="chat", msg=f"{sender.name}:{rounds}")
            successor = nodes[(i + 1) % len(nodes)]
            sender.send("whisper", peer=successor.uuid, msg=f"{sender.name}>{rounds}")
        for i, receiver in enumerate(nodes):
            predecessor = nodes[i - 1]
            receiver.wait_all(
                [match("SHOUT", peer=s.uuid, message=f"{s.name}:{rounds}")
                 for s in others(receiver, nodes)]
                + [match("WHISPER", peer=predecessor.uuid, message=f"{predecessor.name}>{rounds}")],
                since=marks[receiver.name])
        rounds += 1
    assert rounds >= 10, f"only {rounds} rounds in {TRAFFIC_SECONDS} s"

    for receiver in nodes:
        seen = receiver.find(lambda e: e["event"] in ("EXIT", "LEAVE", "ERROR", "GARBAGE"),
                             since[receiver.name])
        assert not seen, f"{receiver.name}: {seen}"
        for sender in others(receiver, nodes):
            shouts = [e["message"] for e in receiver.events[since[receiver.name]:]
                      if e["event"] == "SHOUT" and e["peer"] == sender.uuid]
            assert shouts == [f"{sender.name}:{r}" for r in range(rounds)], receiver.name
        peers = {p_["peer"] for p_ in receiver.call("peers")}
        assert peers == {n.uuid for n in others(receiver, nodes)}, receiver.name


def test_pyre_malformed_non_ascii_hello_is_dropped_harmlessly(lan_factory, fleet):
    """pyre encodes a non-ASCII header with its character count as length (its bug).

    For "café" (4 characters, 5 octets) pyre sends length 4 and the octets
    ``caf\\xc3``: its HELLO ends in invalid UTF-8. peermesh must drop it
    without reporting a garbled ENTER, and go on serving everyone else. (When
    the cut happens to leave valid UTF-8, e.g. "Zürich" sent as "Züric", the
    HELLO is well-formed ZRE and no receiver can tell.)
    """
    lan = lan_factory(3)
    p, a, b = lan.hosts
    node = fleet.start(a, name="mesh-node", groups=["chat"])
    other = fleet.start(b, name="other", groups=["chat"])
    node.wait(match("ENTER", peer=other.uuid))
    pyre = fleet.start(p, "pyre", name="pyre-node", groups=["chat"], headers={"place": "café"})
    pyre.wait(match("ENTER", peer=node.uuid))  # pyre's HELLO to node went out before this
    pyre.call("whisper", peer=node.uuid, msg="from an unready peer")  # must be ignored
    since = node.mark()
    other.call("whisper", peer=node.uuid, msg="ping")
    node.wait(match("WHISPER", peer=other.uuid, message="ping"), since=since)
    node.call("shout", group="chat", msg="pong")
    other.wait(match("SHOUT", peer=node.uuid, message="pong"))
    assert not node.find(match(peer=pyre.uuid)), "garbled or ignored pyre traffic was reported"
    assert [p_["peer"] for p_ in node.call("peers")] == [other.uuid]
    assert node.proc.poll() is None
