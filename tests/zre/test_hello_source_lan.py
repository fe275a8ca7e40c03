"""A HELLO from the host its endpoint names needs no other proof, on real sockets
between two network namespaces (``tests/netlab.py``): the node reads where each
connection comes from (``GuardedListener.source_of``).

This process's namespace is plugged into a LAN of one host (``Lan.link_root``); a
node runs here with ``max_unproven`` 1 and no discovery, and a raw ZRE sender in the
host says HELLO under several identities, each naming an endpoint at the host's
address (nobody listens there, as with fakes), and one naming another address.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

import gevent

from peermesh.config import NodeConfig
from peermesh.zre.node import Node

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import netlab  # noqa: E402
from waiting import poll_until  # noqa: E402

WAIT = 10.0

SENDER = r"""
import sys, uuid, zmq
from peermesh.wire import zre
mailbox, *endpoints = sys.argv[1:]
context = zmq.Context()
sockets = []
for i, endpoint in enumerate(endpoints):
    if i:
        sys.stdin.readline()  # one at a time: the next once the node took this one
    dealer = context.socket(zmq.DEALER)
    sockets.append(dealer)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.IDENTITY, b"\x01" + uuid.uuid4().bytes)
    dealer.connect(mailbox)
    hello = zre.Hello(1, endpoint, (), 0, "fake-" + endpoint.rpartition(":")[2], {})
    dealer.send_multipart(zre.encode(hello), flags=zmq.NOBLOCK)
sys.stdin.read()  # until the test is done: the connections stay open
for dealer in sockets:
    dealer.close()
context.term()
"""


def test_hellos_from_the_host_their_endpoints_name_enter_past_max_unproven(
        lan_factory: Callable[..., netlab.Lan]) -> None:
    lan = lan_factory(1)
    root = lan.link_root()
    host = lan.hosts[0]
    node = Node("here", config=NodeConfig(interface=root, discovery=(), max_unproven=1))
    node.start()
    sender = None
    try:
        own = [f"tcp://{host.address}:{port}" for port in (41001, 41002, 41003)]
        elsewhere = "tcp://10.99.0.9:41004"  # not the address its connection comes from
        sender = host.popen_python(SENDER, node.endpoint, *own, elsewhere,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        session = node._session
        # one connection at a time: with max_unproven 1 the mailbox also keeps at most one
        # connection that is no peer's yet, and holds its accepts a while past that
        for count in range(1, 5):
            poll_until(lambda: len(session.peers) == count, WAIT,
                       f"peer {count} of the three from their host and the one unproven",
                       sleep=gevent.sleep)
            if count < 4:
                assert sender.stdin is not None
                sender.stdin.write("\n")
                sender.stdin.flush()
        assert sorted(p.endpoint for p in session.peers.values() if p.ready) == \
            sorted([*own, elsewhere])
        assert [p.endpoint for p in session.unproven.values()] == [elsewhere]
        assert session.counters.get("unproven_refused") == 0
    finally:
        if sender is not None:
            sender.stdin.close()
            sender.wait(WAIT)
        node.stop()
