"""Nodes in separate processes on loopback: shout, whisper, sequence wrap, a killed peer.

The test process runs a gevent ``Node`` ("parent"); each child process
(``sys.executable -c CHILD``) runs one more node that obeys commands
whispered to it (see ``CHILD``). Children are driven through the mesh
itself; their stdout only says READY. A child ends when its stdin closes
(the fixture closes it, then kills what is left), so none outlives a test.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Optional

import gevent
import gevent.subprocess
import pytest

import waiting
from peermesh import Event, EventType, Node, NodeConfig

ENTER, EXIT, JOIN, WHISPER, SHOUT = (EventType.ENTER, EventType.EXIT, EventType.JOIN,
                                     EventType.WHISPER, EventType.SHOUT)

INTERVAL = 0.05
TIMEOUT = 10.0  # generous: includes a child's interpreter start-up


def wait_for(node: Any, predicate: Callable[[Event], bool], timeout: float = TIMEOUT) -> Event:
    """``waiting.wait_for`` with this module's bound."""
    return waiting.wait_for(node, predicate, timeout)

CHILD = r"""
import json, sys
import gevent, gevent.os
from peermesh import EventType, Node, NodeConfig

cfg = json.loads(sys.argv[1])
node = Node(cfg["name"], config=NodeConfig(), interface="lo", port=cfg["port"],
            interval=cfg["interval"], groups=cfg["groups"], **cfg["settings"]).start()
print("READY", node.uuid.hex, node.endpoint, flush=True)

def serve():
    waiting = []  # (peer, count) asking to be told when count peers are known
    expecting = counted = exits = misplaced = 0
    for event in node.events():
        if event.type is EventType.EXIT:
            exits += 1
        if event.type is EventType.WHISPER:
            command, *args = event.frames
            if command[:2] == b"n:":
                misplaced += int.from_bytes(command[2:8], "big") != counted
                counted += 1
                if counted == expecting:
                    node.whisper(event.peer, b"counted", b"%d" % counted, b"%d" % exits,
                                 b"%d" % misplaced)
            elif command == b"expect":
                expecting, counted = int(args[0]), 0
                node.whisper(event.peer, b"expecting")
            elif command == b"echo":
                node.whisper(event.peer, b"echo", *args)
            elif command == b"shout":
                node.shout(args[0].decode(), *args[1:])
            elif command == b"await-peers":
                waiting.append((event.peer, int(args[0])))
            elif command == b"flood":
                for i in range(int(args[0])):
                    node.whisper(event.peer, i.to_bytes(4, "big"))
                node.whisper(event.peer, b"end")
        elif event.type is EventType.SHOUT:
            node.whisper(node.find_peer(cfg["reporter"]), b"heard", event.name.encode(),
                         event.group.encode(), *event.frames)
        for peer, count in list(waiting):
            if len(node.peers()) >= count:
                waiting.remove((peer, count))
                node.whisper(peer, b"peers-ok", str(len(node.peers())).encode())

def stdin_closed():
    gevent.os.make_nonblocking(0)
    while gevent.os.nb_read(0, 4096):
        pass

worker = gevent.spawn(serve)
watcher = gevent.spawn(stdin_closed)
gevent.wait([worker, watcher], count=1, timeout=cfg["lifetime"])
worker.kill()
node.stop()
"""


def wait_all(node: Any, predicates: list[Callable[[Event], bool]],
             timeout: float = TIMEOUT) -> list[Event]:
    """``waiting.wait_all`` with this module's bound; an EXIT fails at once."""
    return waiting.wait_all(node, predicates, timeout, unexpected=lambda e: e.type is EXIT)


def match(type: EventType, peer: Optional[uuid.UUID] = None,
          first: Optional[bytes] = None) -> Callable[[Event], bool]:
    """Events of ``type`` (from ``peer``, whose first frame is ``first``)."""
    def predicate(event: Event) -> bool:
        return (event.type is type and (peer is None or event.peer == peer)
                and (first is None or (event.frames[:1] == (first,))))
    predicate.__name__ = f"match({type.value}, {peer and peer.hex[:8]}, {first!r})"
    return predicate






class Child:
    """A node in a child process."""

    def __init__(self, proc: gevent.subprocess.Popen, name: str) -> None:
        self.proc = proc
        self.name = name
        with gevent.Timeout(TIMEOUT, AssertionError(f"child {name} never became ready")):
            line = proc.stdout.readline().decode()
        words = line.split()
        assert words[:1] == ["READY"], f"child {name} said {line!r}"
        self.uuid = uuid.UUID(hex=words[1])
        self.endpoint = words[2]

    def close(self) -> None:
        """Close stdin (the child stops its node and exits); kill it if it lingers."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=3)
            except Exception:
                self.proc.kill()
                self.proc.wait(timeout=3)
        self.proc.stdout.close()


@pytest.fixture
def parent(free_udp_port: int) -> Iterator[Callable[..., Node]]:
    """``parent(**settings)``: the in-process node, stopped at teardown (after the children)."""
    nodes: list[Node] = []

    def make(**settings: Any) -> Node:
        settings.setdefault("groups", ["g"])
        node = Node("parent", config=NodeConfig(), interface="lo", port=free_udp_port,
                    interval=INTERVAL, **settings)
        nodes.append(node)
        return node.start()

    yield make
    for node in nodes:
        node.stop(timeout=0.5)


@pytest.fixture
def spawn(free_udp_port: int, parent: Any) -> Iterator[Callable[..., Child]]:
    """``spawn(name, groups=["g"], **settings)``: a node in a child process; ended at teardown."""
    children: list[Child] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERMESH_")}

    def make(name: str, groups: tuple[str, ...] = ("g",), **settings: Any) -> Child:
        cfg = {"name": name, "port": free_udp_port, "interval": INTERVAL,
               "groups": list(groups), "reporter": "parent", "lifetime": 120,
               "settings": settings}
        proc = gevent.subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(cfg)],
                                       stdin=gevent.subprocess.PIPE,
                                       stdout=gevent.subprocess.PIPE, env=env)
        try:
            child = Child(proc, name)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        children.append(child)
        return child

    yield make
    for child in children:
        child.close()


def test_shout_and_whisper_across_three_processes(parent, spawn):
    me = parent()
    c1, c2 = spawn("c1"), spawn("c2")
    entered = wait_all(me, [match(ENTER, c1.uuid), match(ENTER, c2.uuid),
                            match(JOIN, c1.uuid), match(JOIN, c2.uuid)])
    addresses = {e.peer: e.address for e in entered if e.type is ENTER}
    assert addresses == {c1.uuid: c1.endpoint, c2.uuid: c2.endpoint}
    for child in (c1, c2):  # and the children know each other
        me.whisper(child.uuid, b"await-peers", b"2")
    wait_all(me, [match(WHISPER, c1.uuid, b"peers-ok"), match(WHISPER, c2.uuid, b"peers-ok")])

    # parent -> group: both children hear it (and say so).
    me.shout("g", b"hello", b"", b"world")
    heard = wait_all(me, [match(WHISPER, c1.uuid, b"heard"), match(WHISPER, c2.uuid, b"heard")])
    assert [e.frames for e in heard] == [(b"heard", b"parent", b"g", b"hello", b"", b"world")] * 2

    # c1 -> group: the parent hears it, and so does c2.
    me.whisper(c1.uuid, b"shout", b"g", b"from c1")
    found = wait_all(me, [match(SHOUT, c1.uuid), match(WHISPER, c2.uuid, b"heard")])
    shout = next(e for e in found if e.type is SHOUT)
    assert (shout.group, shout.frames, shout.name) == ("g", (b"from c1",), "c1")
    report = next(e for e in found if e.type is WHISPER)
    assert report.frames == (b"heard", b"c1", b"g", b"from c1")

    # whispers both ways
    me.whisper(c2.uuid, b"echo", b"x", "Zoë")
    event = wait_for(me, match(WHISPER, c2.uuid, b"echo"))
    assert event.frames == (b"echo", b"x", "Zoë".encode())
    assert sorted(me.peers()) == sorted([c1.uuid, c2.uuid])


def test_70000_whispers_wrap_the_sequence_without_loss(parent, spawn):
    """Past 65,536 messages the 2-octet sequence wraps to 0; the link must survive."""
    me = parent()
    child = spawn("flooder")
    wait_for(me, match(ENTER, child.uuid))
    count = 70_000
    me.whisper(child.uuid, b"flood", b"%d" % count)

    expected = 0
    deadline = time.monotonic() + 60
    while True:
        event = me.recv(max(0.0, deadline - time.monotonic()))
        assert event is not None, f"stalled after {expected} of {count} whispers"
        assert event.type is not EXIT, f"link lost after {expected} whispers: {event!r}"
        if event.type is not WHISPER:
            continue
        assert event.peer == child.uuid
        if event.frames == (b"end",):
            break
        assert event.frames == (expected.to_bytes(4, "big"),), f"message {expected} out of order"
        expected += 1
    assert expected == count

    # The link still works both ways after the wrap.
    me.whisper(child.uuid, b"echo", b"after the wrap")
    event = wait_for(me, lambda e: e.type in (WHISPER, EXIT))
    assert event.frames == (b"echo", b"after the wrap")
    assert me.peers() == [child.uuid]


def test_child_killed_with_sigkill_is_reported_exit(parent, spawn):
    me = parent(evasive=0.3, silent=0.6, expired=1.0)
    child = spawn("doomed")
    wait_for(me, match(ENTER, child.uuid))
    me.whisper(child.uuid, b"echo", b"alive?")
    wait_for(me, match(WHISPER, child.uuid, b"echo"))

    child.proc.send_signal(signal.SIGKILL)
    assert child.proc.wait(timeout=TIMEOUT) == -signal.SIGKILL
    event = wait_for(me, match(EXIT, child.uuid))
    # No port-0 beacon came from a killed process: the node found out by itself.
    assert event.reason == "expired" or event.reason.startswith("not responding"), event
    assert me.peers() == []


def test_child_stopping_normally_is_reported_left(parent, spawn):
    me = parent()
    child = spawn("leaver")
    wait_for(me, match(ENTER, child.uuid))
    child.close()  # closes its stdin: it stops its node
    assert child.proc.returncode == 0
    assert wait_for(me, match(EXIT, child.uuid)).reason == "left"


#: Zyre's timeouts (evasive 5 s, silent 10 s, expired 30 s, and our send_timeout
#: 5 s) and a 12 s pause, all scaled by 1/10; the messages are not scaled.
PAUSED_SETTINGS = dict(evasive=0.5, silent=1.0, expired=3.0, send_timeout=0.5)
PAUSE = 1.2
PAUSED_MESSAGES = 100_000


def test_receiver_paused_while_100000_whispers_are_sent_loses_none(parent, spawn):
    """A receiver that stops (SIGSTOP) while a sender whispers 100,000 100-byte
    messages gets every one once it resumes, and neither side reports EXIT: the
    sender's per-peer buffer (bounded in octets, ``send_buffer``) holds what the
    sockets cannot, and silence shorter than ``expired`` is only EVASIVE/SILENT."""
    me = parent(**PAUSED_SETTINGS)
    child = spawn("paused", **PAUSED_SETTINGS)
    wait_for(me, match(ENTER, child.uuid))
    me.whisper(child.uuid, b"expect", b"%d" % PAUSED_MESSAGES)
    wait_for(me, match(WHISPER, child.uuid, b"expecting"))

    child.proc.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        padding = b"." * 92
        for i in range(PAUSED_MESSAGES):
            me.whisper(child.uuid, b"n:" + i.to_bytes(6, "big") + padding)
        gevent.sleep(max(0.0, PAUSE - (time.monotonic() - stopped)))  # the pause itself
    finally:
        child.proc.send_signal(signal.SIGCONT)

    report = waiting.wait_for(me, lambda e: e.type is EXIT or match(
        WHISPER, child.uuid, b"counted")(e), 60.0, "the child's count")
    assert report.type is WHISPER, f"the sender dropped the receiver: {report!r}"
    # all of them, no EXIT at the receiver, every one in order
    assert report.frames[1:] == (b"%d" % PAUSED_MESSAGES, b"0", b"0"), report
    assert me.peers() == [child.uuid]
    assert not [e for e in waiting.drain(me) if e.type is EXIT]
