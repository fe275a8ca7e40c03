"""Routing identities at a mailbox: never taken over, and a link made again gets through.

A mailbox has no ``ROUTER_HANDOVER``: a second connection under an identity
in use is ignored for as long as it lasts. So a node that drops its link to a
peer and makes it again at once must not connect before the peer has seen
the old connection end (``RECONNECT_GAP``).
"""

from __future__ import annotations

import gevent
import zmq

from peermesh.io.transport import ZmqTransport
from waiting import poll_until

WAIT = 5.0


def test_a_second_connection_under_a_live_identity_is_ignored() -> None:
    transport = ZmqTransport(zmq.Context())
    got: list[tuple[bytes, list[bytes]]] = []
    try:
        mailbox = transport.bind_mailbox("127.0.0.1", 1000)
        endpoint = f"tcp://127.0.0.1:{mailbox.port}"
        server = gevent.spawn(mailbox.serve, lambda i, f: got.append((i, f)))
        owner = transport.connect(b"\x01owner", endpoint, 100)
        owner.try_send([b"first"])
        with gevent.Timeout(WAIT):
            while len(got) < 1:
                gevent.sleep(0.01)
        hijacker = transport.context.socket(zmq.DEALER)
        hijacker.setsockopt(zmq.IDENTITY, b"\x01owner")
        hijacker.setsockopt(zmq.LINGER, 0)
        hijacker.connect(endpoint)
        hijacker.send(b"forged")
        gevent.sleep(0.2)
        owner.try_send([b"second"])
        with gevent.Timeout(WAIT):
            while len(got) < 2:
                gevent.sleep(0.01)
        gevent.sleep(0.1)
        assert got == [(b"\x01owner", [b"first"]), (b"\x01owner", [b"second"])]
        hijacker.close()
        owner.close()
        server.kill()
        mailbox.close()
    finally:
        transport.context.destroy(linger=0)


def test_a_link_closed_and_made_again_at_once_gets_through() -> None:
    transport = ZmqTransport(zmq.Context())
    got: list[bytes] = []
    try:
        mailbox = transport.bind_mailbox("127.0.0.1", 1000)
        endpoint = f"tcp://127.0.0.1:{mailbox.port}"
        server = gevent.spawn(mailbox.serve, lambda i, f: got.append(f[0]))
        for round_ in range(5):
            link = transport.connect(b"\x01same", endpoint, 100)
            token = b"%d" % round_
            if not link.try_send([token]):  # (a link made again waits RECONNECT_GAP)
                assert link.wait_writable(WAIT) and link.try_send([token])
            with gevent.Timeout(WAIT, AssertionError(f"round {round_}: {got}")):
                while token not in got:
                    gevent.sleep(0.005)
            link.close()  # and at once a new link under the same identity
        server.kill()
        mailbox.close()
    finally:
        transport.context.destroy(linger=0)


def test_a_link_made_again_to_a_handover_mailbox_takes_a_send_at_once() -> None:
    # (the Flux tree: a member retrying its join sends once on a link made again at once;
    # a send refused there would be lost, and so would every retry after it)
    transport = ZmqTransport(zmq.Context())
    got: list[bytes] = []
    try:
        mailbox = transport.bind_mailbox("127.0.0.1", 1000, handover=True)
        endpoint = f"tcp://127.0.0.1:{mailbox.port}"
        server = gevent.spawn(mailbox.serve, lambda i, f: got.append(f[0]))
        for round_ in range(5):
            link = transport.connect(b"\x01same", endpoint, 100, handover=True)
            token = b"%d" % round_
            assert link.try_send([token]), f"round {round_}: the send was refused"
            poll_until(lambda: token in got, WAIT, f"round {round_}", sleep=gevent.sleep,
                       step=0.005)
            link.close()
        server.kill()
        mailbox.close()
    finally:
        transport.context.destroy(linger=0)
