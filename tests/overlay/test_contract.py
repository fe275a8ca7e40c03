"""The overlay contract: one life cycle for every overlay, one roles header, HELLO headers.

Real nodes on loopback (interface "lo", a free beacon port); each case puts an
overlay in a state, applies one operation and checks the state it ends in,
the hooks that ran and, for what the table refuses, the ``NodeStateError``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import pytest

from peermesh import Node, NodeConfig
from peermesh.errors import NodeStateError, PeermeshError
from peermesh.events import EventType
from peermesh.overlay import ROLES_HEADER, Lifecycle, Overlay, advertise, roles_of

import waiting

INTERVAL = 0.1


class Probe(Overlay):
    """An overlay that notes which hooks ran."""

    roles = ("probe",)

    def __init__(self, headers: Optional[dict[str, str]] = None) -> None:
        super().__init__()
        self.advertised = dict(headers or {})
        self.calls: list[str] = []

    def headers(self) -> dict[str, str]:
        return self.advertised

    def on_attach(self, node: Node) -> None:
        self.calls.append("attach")

    def on_start(self) -> None:
        self.calls.append("start")

    def on_stop(self, timeout: float) -> None:
        self.calls.append("stop")


class Other(Probe):
    roles = ("other", "probe")


@pytest.fixture
def make_node(free_udp_port: int) -> Iterator[Callable[..., Node]]:
    """``make_node(name)``: a loopback node, not started; stopped at teardown."""
    nodes: list[Node] = []

    def make(name: str = "n") -> Node:
        node = Node(name, config=NodeConfig(), interface="lo", port=free_udp_port,
                    interval=INTERVAL)
        nodes.append(node)
        return node

    yield make
    for node in reversed(nodes):
        node.stop(timeout=0.2)


def in_state(state: Lifecycle, make_node: Callable[..., Node]) -> Probe:
    """A Probe brought to ``state`` the ordinary way (its node started when it must be)."""
    probe = Probe()
    node = make_node()
    if state in (Lifecycle.ATTACHED, Lifecycle.RUNNING, Lifecycle.STOPPED):
        probe.attach(node)
        node.start()
    if state in (Lifecycle.RUNNING, Lifecycle.STOPPED):
        probe.start()
    if state is Lifecycle.STOPPED:
        probe.stop()
    assert probe.lifecycle is state
    probe.calls.clear()
    return probe


NEW, ATTACHED, RUNNING, STOPPED = (Lifecycle.NEW, Lifecycle.ATTACHED, Lifecycle.RUNNING,
                                   Lifecycle.STOPPED)
#: (state, operation) -> (state after, hooks run) or the error's text
TABLE: dict[tuple[Lifecycle, str], Any] = {
    (NEW, "attach"): (ATTACHED, ["attach"]),
    (NEW, "start"): "Probe is new: attach it to a node first",
    (NEW, "stop"): (STOPPED, []),
    (ATTACHED, "attach"): "Probe is attached: it attaches once",
    (ATTACHED, "start"): (RUNNING, ["start"]),
    (ATTACHED, "stop"): (STOPPED, []),
    (RUNNING, "attach"): "Probe is running: it attaches once",
    (RUNNING, "start"): "Probe is running: it starts once",
    (RUNNING, "stop"): (STOPPED, ["stop"]),
    (STOPPED, "attach"): "Probe is stopped: it attaches once",
    (STOPPED, "start"): "Probe is stopped: it starts once",
    (STOPPED, "stop"): (STOPPED, []),
}


@pytest.mark.parametrize("state,operation", list(TABLE), ids=lambda v: getattr(v, "value", v))
def test_life_cycle_table(make_node: Callable[..., Node], state: Lifecycle,
                          operation: str) -> None:
    probe = in_state(state, make_node)
    fresh = make_node("fresh")                  # not started: attach is allowed on it
    act = {"attach": lambda: probe.attach(fresh), "start": probe.start,
           "stop": probe.stop}[operation]
    expected = TABLE[state, operation]
    if isinstance(expected, str):
        with pytest.raises(NodeStateError) as caught:
            act()
        assert str(caught.value) == expected
        assert isinstance(caught.value, PeermeshError)
        assert probe.lifecycle is state and probe.calls == []   # a refusal changes nothing
    else:
        act()
        assert (probe.lifecycle, probe.calls) == expected
        assert probe.running == (probe.lifecycle is RUNNING)


def test_start_waits_for_the_node_and_attach_after_start_is_refused(
        make_node: Callable[..., Node]) -> None:
    node = make_node()
    probe = Probe()
    probe.attach(node)
    with pytest.raises(NodeStateError, match=r"start the node first: Probe.start\(\) follows "
                                             r"node.start\(\)"):
        probe.start()
    assert probe.lifecycle is ATTACHED
    node.start()
    late = Probe({"X-PM-LATE": "1"})
    with pytest.raises(NodeStateError, match="attach Probe before its node starts: HELLO "
                                             "headers are sent once per connection"):
        late.attach(node)
    assert late.lifecycle is NEW and late.node is None and "X-PM-LATE" not in node.headers
    assert probe.start() is probe and probe.running


def test_roles_from_several_overlays_merge_into_one_header(
        make_node: Callable[..., Node]) -> None:
    node = make_node()
    node.set_header(ROLES_HEADER, "sada-channel")          # a role set another way
    Probe({"X-PM-A": "a"}).attach(node)
    Other({"X-PM-B": "b"}).attach(node)
    advertise(node, {}, ("probe", "extra"))
    assert node.headers[ROLES_HEADER] == "sada-channel,probe,other,extra"
    assert roles_of(node.headers) == ["sada-channel", "probe", "other", "extra"]
    assert node.headers["X-PM-A"] == "a" and node.headers["X-PM-B"] == "b"
    assert roles_of({}) == [] and roles_of({ROLES_HEADER: ",a,,b,"}) == ["a", "b"]


def test_a_peer_sees_the_headers_and_roles_in_hello(make_node: Callable[..., Node]) -> None:
    node, peer = make_node("served"), make_node("watcher")
    Probe({"X-PM-PROBE": "tcp://127.0.0.1:1"}).attach(node)
    Other().attach(node)
    node.start()
    peer.start()
    enter = waiting.wait_for(peer, lambda e: e.type is EventType.ENTER and e.name == "served",
                             5.0, "ENTER of served")
    assert enter.headers is not None
    assert enter.headers["X-PM-PROBE"] == "tcp://127.0.0.1:1"
    assert roles_of(enter.headers) == ["probe", "other"]
    assert roles_of(peer.peer_headers(node.uuid)) == ["probe", "other"]
