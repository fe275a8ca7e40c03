"""The one bind policy, and the objects that listen through it, on 127.0.0.1 and ipc.

A port outside 1-65535, a host that does not resolve, an endpoint in use or
an ipc path that cannot be made is a ``BindError`` naming the endpoint and the
reason, raised before anything starts; the endpoint reported is the one bound.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from peermesh.errors import PeermeshError
from peermesh.io import BindError, bind, bind_ephemeral, make_socket
from peermesh.io import endpoints as bind_module
from peermesh.io.endpoints import EPHEMERAL_PORTS


@pytest.fixture
def sock() -> Iterator[zmq.Socket]:
    sock = make_socket(zmq.ROUTER)
    yield sock
    sock.close()


@pytest.mark.parametrize("endpoint, reason", [
    ("tcp://127.0.0.1:0", "port '0' is not in 1-65535"),
    ("tcp://127.0.0.1:70000", "port '70000' is not in 1-65535"),
    ("tcp://127.0.0.1:99999", "port '99999' is not in 1-65535"),
    ("tcp://127.0.0.1:-1", "port '-1' is not in 1-65535"),
    ("tcp://127.0.0.1:*", "port '*' is not in 1-65535"),
    ("tcp://127.0.0.1", "not tcp://HOST:PORT"),
    ("127.0.0.1:5000", "not TRANSPORT://ADDRESS"),
    ("udp://127.0.0.1:5000", "transport 'udp' is not tcp, ipc or inproc"),
    ("tcp://nosuchhost.invalid:5000", "does not resolve to an address of this machine"),
])
def test_an_endpoint_that_cannot_be_bound_is_named_with_the_reason(
        sock: zmq.Socket, endpoint: str, reason: str) -> None:
    with pytest.raises(BindError) as caught:
        bind(sock, endpoint)
    assert endpoint in str(caught.value) and reason in str(caught.value)
    assert isinstance(caught.value, PeermeshError) and isinstance(caught.value, ValueError)
    assert sock.get(zmq.LAST_ENDPOINT) == b""  # nothing was bound


def test_an_endpoint_in_use_is_refused_after_a_short_wait(
        sock: zmq.Socket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bind_module, "BUSY_WAIT", 0.05)
    endpoint = bind_ephemeral(sock, "127.0.0.1")
    other = make_socket(zmq.ROUTER)
    try:
        with pytest.raises(BindError, match=f"cannot bind {endpoint}: the address is in use"):
            bind(other, endpoint)
    finally:
        other.close()


def test_the_endpoint_reported_is_the_one_bound(sock: zmq.Socket) -> None:
    endpoint = bind_ephemeral(sock, "127.0.0.1")
    assert endpoint == sock.get(zmq.LAST_ENDPOINT).decode()
    assert endpoint.startswith("tcp://127.0.0.1:")
    assert int(endpoint.rpartition(":")[2]) in EPHEMERAL_PORTS
    dealer = make_socket(zmq.DEALER)
    try:  # and it is where a message arrives
        dealer.connect(endpoint)
        dealer.send(b"hello")
        assert sock.poll(5000) and sock.recv_multipart()[1:] == [b"hello"]
    finally:
        dealer.close()


def test_a_host_name_is_reported_as_the_address_bound() -> None:
    probe = make_socket(zmq.ROUTER)
    named = make_socket(zmq.ROUTER)
    try:
        port = int(bind_ephemeral(probe, "127.0.0.1").rpartition(":")[2])
        probe.close()  # a port known to be free a moment ago (retried while libzmq lets go)
        assert bind(named, f"tcp://localhost:{port}") == f"tcp://127.0.0.1:{port}"
    finally:
        probe.close()
        named.close()


def test_an_ephemeral_port_on_an_address_that_is_not_a_host_is_refused(
        sock: zmq.Socket) -> None:
    for address in ("nosuchhost.invalid", "127.0.0.1:5000", "", "tcp://127.0.0.1"):
        with pytest.raises(BindError) as caught:
            bind_ephemeral(sock, address)
        assert repr(address) in str(caught.value) or address in str(caught.value)


def test_ipc_paths(sock: zmq.Socket, tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/mailbox"
    assert bind(sock, endpoint) == endpoint
    assert os.path.exists(tmp_path / "mailbox")
    other = make_socket(zmq.ROUTER)
    try:
        missing = f"ipc://{tmp_path}/no/such/dir/mailbox"
        with pytest.raises(BindError, match=f"cannot bind {missing}: the directory does not"):
            bind(other, missing)
    finally:
        other.close()


def test_a_prepare_step_sees_each_endpoint_before_it_is_bound(sock: zmq.Socket) -> None:
    seen: list[str] = []

    def prepare(endpoint: str) -> None:
        seen.append(endpoint)
        sock.setsockopt(zmq.ROUTING_ID, endpoint.encode())

    endpoint = bind_ephemeral(sock, "127.0.0.1", prepare)
    assert seen[-1] == endpoint and sock.get(zmq.ROUTING_ID) == endpoint.encode()


# --- the objects that listen through the policy --------------------------------------


def test_a_safir_darbaan_channel_given_a_bad_endpoint_raises_before_it_starts() -> None:
    from peermesh.sada import Channel

    for endpoint, reason in (("tcp://127.0.0.1:99999", "1-65535"),
                             ("tcp://nosuchhost.invalid:5000", "does not resolve"),
                             ("tcp://*:5055", "not a wildcard")):
        with pytest.raises(BindError, match=reason) as caught:
            Channel(endpoint=endpoint)
        assert endpoint in str(caught.value)
    channel = Channel(address="127.0.0.1")
    try:
        assert channel.endpoint == channel._sock.get(zmq.LAST_ENDPOINT).decode()
    finally:
        channel.stop()


def test_a_safir_darbaan_channel_reports_the_endpoint_it_bound() -> None:
    from peermesh.sada import Channel

    first = Channel(address="127.0.0.1")
    port = int(first.endpoint.rpartition(":")[2])
    first.stop()
    channel = Channel(endpoint=f"tcp://127.0.0.1:{port}")  # closed a moment ago: waited for
    try:
        assert channel.endpoint == f"tcp://127.0.0.1:{port}"
        assert channel._sock.get(zmq.LAST_ENDPOINT).decode() == channel.endpoint
    finally:
        channel.stop()


def test_an_nfp_worker_on_an_address_that_does_not_resolve_raises(tmp_path: Path) -> None:
    from peermesh.nfp import Worker
    from peermesh.nfp.store import JobStore

    store = JobStore(tmp_path / "jobs.sqlite")
    try:
        with pytest.raises(BindError, match="nosuchhost.invalid"):
            Worker("svc", "w1", {}, store, address="nosuchhost.invalid")
        worker = Worker("svc", "w1", {}, store, address="127.0.0.1")
        assert worker.endpoint == worker._mailbox.socket.get(zmq.LAST_ENDPOINT).decode()
        worker._mailbox.close()
    finally:
        store.close()


def test_the_spark_log_server_given_a_port_out_of_range_raises_at_start(
        tmp_path: Path) -> None:
    from peermesh.spark.service import DriverService

    service = DriverService(directory=tmp_path, interface="lo", bind="127.0.0.1",
                            bind_port=70000, channel=False)
    with pytest.raises(BindError, match="tcp://127.0.0.1:70000: port '70000' is not in"):
        service.start()
    assert not service.running and service.node is None
