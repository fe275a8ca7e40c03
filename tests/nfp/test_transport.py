"""The NFP CorkedSocket on both ZeroMQ paths: the C extension's batches and pyzmq alone."""

from __future__ import annotations

from typing import Callable

import gevent
import gevent.event
import pytest
import zmq

from peermesh.io import bind_ephemeral, socket as io_socket
from peermesh.io.socket import HubSocket
from peermesh.nfp import transport
from peermesh.nfp.transport import CorkedSocket
from peermesh.wire.nfp import MAX_MESSAGE

from .conftest import wait_until


Handler = Callable[[list[bytes]], None]


def _pair(on_router: Handler, on_dealer: Handler) -> tuple[CorkedSocket, CorkedSocket]:
    router = transport.nfp_socket(None, zmq.ROUTER)
    endpoint = bind_ephemeral(router, "127.0.0.1")
    dealer = transport.nfp_socket(None, zmq.DEALER)
    dealer.connect(endpoint)
    return CorkedSocket(router, on_router, "router"), CorkedSocket(dealer, on_dealer, "dealer")


def test_messages_and_replies_in_order(zmq_path: str) -> None:
    got: list[list[bytes]] = []
    router_channel: list[CorkedSocket] = []

    def echo(frames: list[bytes]) -> None:
        # replies from the handler are held until the batch is read, then sent in order
        router_channel[0].send([frames[0], b"", b"re", *frames[2:]])
        router_channel[0].send([frames[0], b"", b"again", *frames[2:]])

    router, dealer = _pair(echo, got.append)
    router_channel.append(router)
    try:
        for i in range(300):   # more than one batch
            assert dealer.send([b"", b"%d" % i, b"x" * (i % 7)])
        wait_until(lambda: len(got) == 600, what="600 replies")
        assert got[0] == [b"", b"re", b"0", b""]
        assert got[1] == [b"", b"again", b"0", b""]
        assert [m[2] for m in got[::2]] == [b"%d" % i for i in range(300)]
    finally:
        dealer.close()
        router.close()


def test_a_handler_may_close_its_channel_mid_batch(zmq_path: str) -> None:
    seen: list[list[bytes]] = []
    holder: list[CorkedSocket] = []

    def close_on_first(frames: list[bytes]) -> None:
        seen.append(frames)
        holder[0].close()

    router, dealer = _pair(close_on_first, lambda frames: None)
    holder.append(router)
    try:
        for i in range(20):
            dealer.send([b"", b"%d" % i])
        wait_until(lambda: seen, what="a message")
        # the reader handles a batch without yielding: had it gone on after the close
        # (touching the closed socket), it would have done so before this runs
        assert len(seen) == 1 and router.closed
        assert not router.send([b"x", b"", b"late"])
        assert not router.readable()
        with pytest.raises(zmq.ZMQError) as caught:   # never the closed socket's handle
            router._io.events()
        assert caught.value.errno == zmq.ENOTSOCK
        dealer.socket.close()            # closed behind the channel's back
        assert not dealer.readable()
        with pytest.raises(zmq.ZMQError) as caught:
            dealer._io.events()
        assert caught.value.errno == zmq.ENOTSOCK
    finally:
        dealer.close()
        router.close()



def test_a_message_whose_edge_was_taken_mid_batch_is_still_read(
        zmq_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the guard timer would deliver it eventually; with a long one only the reader's own
    # look after its batch (the socket was used meanwhile) delivers it in time
    monkeypatch.setattr(io_socket, "GUARD", 60.0)
    got: list[bytes] = []
    channels: dict[str, CorkedSocket] = {}

    def chat() -> None:
        dealer = channels["dealer"]
        dealer.send([b"", b"hello"])
        # the answer arrives while the reader is in its handler; asking for it takes in
        # the command that announced it (the edge the reader would wait for)
        wait_until(dealer.readable, 5, "the answer")

    def on_dealer(frames: list[bytes]) -> None:
        got.append(frames[1])
        if frames[1] == b"x":
            gevent.spawn(chat).join(5)  # the reader waits in its handler meanwhile

    def on_router(frames: list[bytes]) -> None:
        if frames[2] == b"join":
            channels["router"].send([frames[0], b"", b"x"])
        elif frames[2] == b"hello":
            channels["router"].send([frames[0], b"", b"y"])

    router, dealer = _pair(on_router, on_dealer)
    channels.update(router=router, dealer=dealer)
    try:
        dealer.send([b"", b"join"])
        wait_until(lambda: b"y" in got, 5, "the answer that arrived during the batch")
        assert got == [b"x", b"y"]
    finally:
        dealer.close()
        router.close()


def test_a_handler_that_waits_does_not_make_the_hub_spin(
        zmq_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    got: list[bytes] = []
    wakes: list[bool] = []
    sleeping = gevent.event.Event()
    on_edge = HubSocket._on_edge

    def counted(self: HubSocket) -> None:
        wakes.append(sleeping.is_set() and len(got) == 1)
        on_edge(self)
    monkeypatch.setattr(HubSocket, "_on_edge", counted)

    def on_router(frames: list[bytes]) -> None:
        got.append(frames[2])
        if frames[2] == b"0":
            sleeping.set()
            gevent.sleep(0.2)           # the reader waits in its handler; more arrives meanwhile

    router, dealer = _pair(on_router, lambda frames: None)
    try:
        dealer.send([b"", b"0"])
        assert sleeping.wait(5)
        for i in range(1, 6):
            dealer.send([b"", b"%d" % i])
        wait_until(lambda: len(got) == 6, 5, "every message")
        # the descriptor was readable for the whole 0.2 s: the watcher fired once (and
        # was stopped), not on every turn of the hub's loop
        assert sum(wakes) <= 2
        assert got == [b"%d" % i for i in range(6)]
    finally:
        dealer.close()
        router.close()


@pytest.mark.parametrize("kind", [zmq.ROUTER, zmq.DEALER])
def test_nfp_sockets_cut_off_a_peer_over_the_message_limit(kind: int) -> None:
    sock = transport.nfp_socket(zmq.Context.instance(), kind)
    try:
        assert sock.getsockopt(zmq.MAXMSGSIZE) == MAX_MESSAGE
        assert sock.getsockopt(zmq.LINGER) == 0
    finally:
        sock.close()
