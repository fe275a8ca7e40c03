"""Bounded connection floods on loopback, shared by the tests of every overlay listener."""

from __future__ import annotations

import contextlib
import socket
from typing import Any, Callable, Iterator

import gevent.socket

from peermesh.io.connections import ConnectionPolicy, set_default_policy
from waiting import poll_until

#: idle connections a flood opens, and the cap the listeners get meanwhile
FLOOD, CAP = 300, 32
WAIT = 8.0


@contextlib.contextmanager
def lowered_cap(cap: int = CAP) -> Iterator[ConnectionPolicy]:
    """Listeners bound meanwhile keep at most ``cap`` connections."""
    policy = ConnectionPolicy(max_connections=cap)
    old = set_default_policy(policy)
    try:
        yield policy
    finally:
        set_default_policy(old)


@contextlib.contextmanager
def flood(port: int, count: int = FLOOD, address: str = "127.0.0.1",
          wait: bool = True) -> Iterator[list[socket.socket]]:
    """``count`` idle TCP connections to ``port`` (they never say anything), closed after.

    Each is connected before the next (the kernel queues what the listener has not
    accepted yet), so all ``count`` reach a listener that listens; cooperatively
    (gevent sockets), so a hub the test shares with its nodes goes on running
    meanwhile. One refused or reset (a listener that paused) is left out. Without
    ``wait`` every connection is only begun: one to a listener that holds its accepts
    (its SYN dropped) gets in when the kernel sends the SYN again, if the listener
    accepts then.
    """
    made: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = gevent.socket.socket()
            made.append(sock)
            sock.settimeout(WAIT)
            try:
                if wait:
                    sock.connect((address, port))
                else:
                    sock.setblocking(False)
                    sock.connect_ex((address, port))
            except (ConnectionRefusedError, ConnectionResetError):
                made.pop().close()
        yield made
    finally:
        for sock in made:
            sock.close()


def wait_shed(counters: Any, at_least: int = FLOOD - CAP,
              sleep: Callable[[float], None] | None = None) -> None:
    """Wait until ``counters`` (a ``Counters``, or a function of a counter's name) count
    ``at_least`` connections shed."""
    kwargs = {"sleep": sleep} if sleep is not None else {}
    get = counters if callable(counters) else counters.get
    poll_until(lambda: get("connections_shed") >= at_least, WAIT,
               f"{at_least} connections shed", step=0.02, **kwargs)
