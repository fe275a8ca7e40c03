"""A guarded mailbox keeps at most ``max_per_address`` connections from one other host
(loopback addresses other than the mailbox's own stand for other hosts)."""

from __future__ import annotations

import logging
import socket

import gevent
import zmq

from peermesh.counters import Counters
from peermesh.io.connections import _remote_address
from peermesh.io.transport import GuardedMailbox, ZmqTransport
from waiting import poll_until

WAIT = 5.0


def connection(source: str, port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def test_connections_from_one_other_address_are_kept_under_the_bound() -> None:
    transport = ZmqTransport(zmq.Context())
    counters = Counters(logging.getLogger(__name__), "test", ("connections_shed",))
    mailbox = transport.bind_mailbox("127.0.0.1", 1000, max_connections=64, counters=counters,
                                     max_per_address=2)
    assert isinstance(mailbox, GuardedMailbox)
    made = [connection("127.0.0.2", mailbox.port) for _ in range(5)]
    made += [connection("127.0.0.3", mailbox.port)]
    made += [connection("127.0.0.1", mailbox.port) for _ in range(3)]  # this host: not counted
    try:
        poll_until(lambda: counters.get("connections_shed") >= 3 and mailbox.connections == 6,
                   WAIT, "3 connections shed", sleep=gevent.sleep, step=0.01)
        assert mailbox.per_address == {"127.0.0.2": 2, "127.0.0.3": 1}
        gevent.sleep(0.1)  # nothing more is shed
        assert counters.get("connections_shed") == 3 and mailbox.connections == 6
        for sock in made:
            sock.close()
        poll_until(lambda: not (mailbox.per_address or mailbox.connections), WAIT,
                   "the closed connections forgotten", sleep=gevent.sleep, step=0.01)
    finally:
        for sock in made:
            sock.close()
        mailbox.close()
        transport.context.term()


def test_a_connection_closed_before_it_is_looked_at_has_no_address() -> None:
    sock = socket.socket()
    fd = sock.fileno()
    sock.close()
    assert _remote_address(fd, 1) == ""
