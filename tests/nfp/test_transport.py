"""NFP's sockets come from the transport: the worker's and the broker's ROUTERs are mailboxes
(``bind_mailbox``, guarded by the connection policy once started) and every link is dialled
by a driver; a peer sending more than ``MAX_MESSAGE`` is cut off on each of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import zmq

from peermesh.io.connections import GuardedListener
from peermesh.io.transport import ZmqTransport
from peermesh.nfp.store import JobStore
from peermesh.overlay import Lifecycle
from peermesh.nfp.worker import Tasks, Worker
from peermesh.wire.nfp import MAX_MESSAGE

from .conftest import wait_until


class _Recording(ZmqTransport):
    """The real transport, remembering what it bound and dialled."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[Any] = []

    def bind_mailbox(self, *args: Any, **kwargs: Any) -> Any:
        mailbox = super().bind_mailbox(*args, **kwargs)
        self.made.append(mailbox)
        return mailbox

    def connect(self, *args: Any, **kwargs: Any) -> Any:
        link = super().connect(*args, **kwargs)
        self.made.append(link)
        return link


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    store = JobStore(tmp_path / "w.db")
    transport = _Recording()
    w = Worker("svc", "w1", Tasks({"echo": lambda job, x: x}), store, transport=transport)
    w.lifecycle = Lifecycle.ATTACHED     # (no node: the worker alone)
    try:
        yield w
    finally:
        w.stop()
        store.close()


def test_a_worker_binds_its_router_through_its_transport_and_guards_it_when_started(
        worker: Worker) -> None:
    transport: Any = worker.transport
    (mailbox,) = transport.made
    assert mailbox.endpoint == worker.endpoint and worker.endpoint.startswith("tcp://127.0.0.1:")
    assert mailbox.socket.getsockopt(zmq.MAXMSGSIZE) == MAX_MESSAGE
    assert mailbox.socket.getsockopt(zmq.LINGER) == 0
    assert mailbox.socket.getsockopt(zmq.HEARTBEAT_IVL) == 0    # NFP's keepalive finds the dead
    worker.start()
    assert isinstance(worker._listener, GuardedListener)
    assert worker._listener.listener is mailbox
    worker.connect_broker("tcp://127.0.0.1:9")   # nothing listens there: the link is dialled
    wait_until(lambda: len(transport.made) == 2, what="the broker link")
    link = transport.made[1]
    assert link.socket.getsockopt(zmq.MAXMSGSIZE) == MAX_MESSAGE
    worker.stop()
    assert mailbox.closed and link.closed


def test_a_peer_sending_over_the_limit_to_a_worker_is_cut_off(worker: Worker) -> None:
    worker.start()
    accepted, gone = [], []
    listener: Any = worker._listener
    peer = ZmqTransport().connect(b"big", worker.endpoint, 10, handover=True)
    try:
        wait_until(lambda: listener.accepted, what="the peer's connection")
        accepted.append(len(listener.accepted))
        assert peer.try_send([b"", b"x" * (MAX_MESSAGE + 1)])
        wait_until(lambda: not listener.accepted, 10, "the connection cut")
        gone.append(len(listener.accepted))
    finally:
        peer.close()
    assert accepted == [1] and gone == [0]
