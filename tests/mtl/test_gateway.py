"""The MTL gateway with real sockets on loopback: a threaded node runs it, raw clients
(plain pyzmq REQ and DEALER) talk to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import zmq

from gatewayhelp import TIMING, WAIT, RawClient, default_users
from scraping import scrape, value
from waiting import poll_until
from peermesh import ThreadedNode
from peermesh.metrics import MetricsServer
from peermesh.mtl.credentials import make_user
from peermesh.mtl.gateway import Gateway
from peermesh.wire.mtl import (Authorize, Confirm, Content, DataLease, Direction, Failure, Ok,
                               Open, Ping, Pong, Ready, Response, SelectProfile, Summon,
                               Unauthorized, encode_data)


@pytest.fixture
def gateway(tmp_path: Path, free_udp_port: int) -> Iterator[Gateway]:
    default_users(tmp_path / "creds.json")
    gw = Gateway(tmp_path / "creds.json", run="always", heartbeat=0.5, data_dir=tmp_path)
    node = ThreadedNode("gw", interface="lo", port=free_udp_port, overlays=[gw], **TIMING)
    node.start()
    try:
        yield gw
    finally:
        node.stop()


@pytest.fixture
def clients(gateway: Gateway) -> Iterator[list[RawClient]]:
    made: list[RawClient] = []
    yield made
    for client in made:
        client.close()


def new(clients: list[RawClient], gateway: Gateway) -> RawClient:
    client = RawClient(gateway.control_endpoint)
    clients.append(client)
    return client


def test_scram_login_profile_and_lease(gateway: Gateway, clients: list[RawClient]) -> None:
    client = new(clients, gateway)
    assert client.ask(Open("/")) == Unauthorized(("SCRAM-SHA-256",))
    ready = client.scram("alice", "wonderland")
    assert isinstance(ready, Ready) and ready.profiles == ("test", "mesh")
    assert ready.gateways == (gateway.control_endpoint,)
    assert client.ask(SelectProfile("Mesh")) == Ok()
    lease = client.lease(Direction.READ, ("chat",))
    assert isinstance(lease, DataLease) and lease.port == gateway.data_port
    assert client.connect_data(lease) == Response(1, 200)
    assert client.command(Summon(client.next(), "chat")) == Response(2, 200)
    samples = {(name, tuple(sorted(labels.items()))): value
               for name, labels, value in gateway.metrics()}  # (settled: read from here)
    assert samples[("mtl_logins_total", (("result", "ok"),))] == 1
    assert samples[("mtl_sessions", ())] == 1 and samples[("mtl_leases", ())] == 1


def test_metrics_count_contents_and_what_waits_for_a_confirm(
        tmp_path: Path, free_udp_port: int) -> None:
    """Scraped from the gateway's node while a writer writes and a confirmed reader reads,
    then confirms."""
    default_users(tmp_path / "creds.json")
    gw = Gateway(tmp_path / "creds.json", run="always", heartbeat=0.5, data_dir=tmp_path)
    node = ThreadedNode("gw", interface="lo", port=free_udp_port, overlays=[gw], **TIMING)
    node.start()
    reader, writer = RawClient(gw.control_endpoint), RawClient(gw.control_endpoint)
    server = node.call(lambda n: MetricsServer(n).start("127.0.0.1:0"))
    try:
        families = scrape(server.url)
        assert families["peermesh_mtl_contents"].type == "counter"
        assert families["peermesh_mtl_oldest_content_age_seconds"].type == "gauge"
        assert value(families, "peermesh_mtl_contents", what="received") == 0
        reader.login()
        lease = reader.lease(Direction.READ, ("jobs",), "full")
        assert isinstance(lease, DataLease)
        reader.connect_data(lease)
        assert reader.command(Summon(reader.next(), "jobs")) == Response(2, 200)
        writer.login()
        lease = writer.lease(Direction.WRITE, ("jobs",), "full")
        assert isinstance(lease, DataLease)
        writer.connect_data(lease)
        for i in range(1, 4):
            writer.send(Content(i, "", b"job %d" % i))
        contents = reader.contents(3)
        families = scrape(server.url)
        for what, count in (("received", 3), ("stored", 3), ("delivered", 3), ("confirmed", 0)):
            assert value(families, "peermesh_mtl_contents", what=what) == count, what
        assert value(families, "peermesh_mtl_stored_contents") == 3
        assert value(families, "peermesh_mtl_unconfirmed_contents") == 3
        assert value(families, "peermesh_mtl_stored_bytes") > 3 * len(b"job 1")
        assert value(families, "peermesh_mtl_oldest_content_age_seconds") > 0
        reader.send(Confirm(contents[-1].sequence, True))

        def confirmed() -> Optional[dict[str, Any]]:
            now = scrape(server.url)
            return now if value(now, "peermesh_mtl_contents", what="confirmed") == 3 else None
        families = poll_until(confirmed, WAIT, "the confirm counted", step=0.05)
        assert value(families, "peermesh_mtl_stored_contents") == 0
        assert value(families, "peermesh_mtl_unconfirmed_contents") == 0
        assert value(families, "peermesh_mtl_oldest_content_age_seconds") == 0
        # unconfirmed content (after the first, routed on its header's bytes) counts too
        fast = RawClient(gw.control_endpoint)
        try:
            fast.login()
            lease = fast.lease(Direction.WRITE, ("jobs",))
            assert isinstance(lease, DataLease)
            fast.connect_data(lease)
            for i in range(1, 4):
                fast.send(Content(i, "", b"quick %d" % i))
            poll_until(lambda: value(scrape(server.url), "peermesh_mtl_contents",
                                     what="received") == 6, WAIT, "6 contents received",
                       step=0.05)
        finally:
            fast.close()
    finally:
        node.call(lambda n: server.close())
        reader.close()
        writer.close()
        node.stop()


def test_wrong_password_mechanism_not_offered_and_retry(gateway: Gateway,
                                                        clients: list[RawClient]) -> None:
    client = new(clients, gateway)
    client.ask(Open("/"))
    assert isinstance(client.scram("alice", "rabbit-hole"), Unauthorized)
    reply = client.ask(Authorize("PLAIN", b"\x00alice\x00wonderland"))
    assert isinstance(reply, Unauthorized) and "not offered" in reply.reason
    assert isinstance(client.ask(SelectProfile("mesh")), Unauthorized)
    assert isinstance(client.scram("alice", "wonderland"), Ready)


def test_reauthentication_on_401_after_the_password_changed(
        tmp_path: Path, gateway: Gateway, clients: list[RawClient]) -> None:
    client = new(clients, gateway)
    client.login()
    gateway.credentials.update(lambda users: users.__setitem__(
        "alice", make_user("alice", "looking-glass", read=["*"], write=["*"])))
    # the gateway reads the file again within a second: until then the old entry holds
    reply = poll_until(lambda: _unauthorized(client.ask(SelectProfile("mesh"))), 5.0,
                       "a 401 after the password changed", step=0.05)
    assert "changed" in reply.reason
    assert isinstance(client.scram("alice", "looking-glass"), Ready)
    assert client.ask(SelectProfile("mesh")) == Ok()


def _unauthorized(reply: object) -> object:
    return reply if isinstance(reply, Unauthorized) else None


def test_test_profile_fans_out(gateway: Gateway, clients: list[RawClient]) -> None:
    readers = [new(clients, gateway) for _ in range(2)]
    for reader in readers:
        reader.login(user="bob", password="builder", profile="test")
        lease = reader.lease(Direction.READ, ("resource",))
        assert isinstance(lease, DataLease)
        reader.connect_data(lease)
        assert reader.command(Summon(reader.next(), "resource")) == Response(2, 200)
    writers = [new(clients, gateway) for _ in range(2)]
    for i, writer in enumerate(writers):
        writer.login(profile="test")
        lease = writer.lease(Direction.WRITE)
        assert isinstance(lease, DataLease)
        writer.connect_data(lease)
        writer.send(Content(1, "resource", b"from writer %d" % i))
    for reader in readers:
        contents = reader.contents(2)
        assert sorted(c.body for c in contents) == [b"from writer 0", b"from writer 1"]
        assert {c.resource for c in contents} == {"resource"}


def test_forbidden_resource(gateway: Gateway, clients: list[RawClient]) -> None:
    client = new(clients, gateway)
    client.login(user="bob", password="builder")
    assert client.lease(Direction.WRITE, ("public",)) == \
        Failure(403, "bob may not write 'public'")
    lease = client.lease(Direction.READ)
    assert isinstance(lease, DataLease)
    client.connect_data(lease)
    assert client.command(Summon(client.next(), "secret")) == Response(2, 400)


def test_unsupported_confirm_and_lease_not_granted(gateway: Gateway,
                                                   clients: list[RawClient]) -> None:
    client = new(clients, gateway)
    client.login(profile="test")
    assert client.lease(Direction.READ, (), "full").status == 501  # type: ignore[union-attr]
    fake = DataLease(gateway.data_port, "not-a-lease")
    assert client.connect_data(fake) == Response(1, 403)


def test_heartbeat_ping_pong(gateway: Gateway, clients: list[RawClient]) -> None:
    client = new(clients, gateway)
    client.login()
    lease = client.lease(Direction.READ, ("chat",))
    assert isinstance(lease, DataLease)
    client.connect_data(lease)
    assert isinstance(client.recv(), Ping)  # the gateway pings a silent client
    client.send(Ping())
    assert isinstance(client.recv(), (Pong, Ping))


HOSTILE_CONTROL = [
    [b"Connection.Open"],                                  # one frame
    [b"Connection.Open", b"{", b"x"],                      # three frames
    [b"Connection.Open", b"not json"],
    [b"Connection.Open", b"\xff\xfe"],
    [b"\x00\x01", b"{}"],
    [b"Connection.Open", b"[" * 50_000],
]


def test_hostile_control_frames_are_dropped_others_served(gateway: Gateway,
                                                          clients: list[RawClient]) -> None:
    context = zmq.Context.instance()
    for frames in HOSTILE_CONTROL:
        req = context.socket(zmq.REQ)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(gateway.control_endpoint)
        req.send_multipart(frames)
        assert not req.poll(150), f"{frames!r} was answered"
        req.close(0)
    raw = context.socket(zmq.DEALER)  # no REQ envelope, and oversized
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(gateway.control_endpoint)
    raw.send_multipart([b"Connection.Open", b"{}"])
    raw.send_multipart([b"", b"Connection.Open", b" " * 200_000])
    assert not raw.poll(150)
    raw.close(0)
    client = new(clients, gateway)
    assert client.ask([b"connection.nonsense", b"{}"]).status == 400  # type: ignore[union-attr]
    client.login()
    assert isinstance(client.lease(Direction.READ), DataLease)


def test_hostile_data_frames_are_dropped_others_served(gateway: Gateway,
                                                       clients: list[RawClient]) -> None:
    reader = new(clients, gateway)
    reader.login()
    lease = reader.lease(Direction.READ, ("chat",))
    assert isinstance(lease, DataLease)
    reader.connect_data(lease)
    reader.command(Summon(reader.next(), "chat"))
    host = gateway.control_endpoint.rpartition(":")[0]
    hostile = zmq.Context.instance().socket(zmq.DEALER)
    hostile.setsockopt(zmq.LINGER, 0)
    hostile.connect(f"{host}:{gateway.data_port}")
    for frames in ([b"\x05"], [b"\x05", b"", b"", b""], [b"\xee", b""], [b"", b""],
                   [b"\x03" + bytes(8) + b"\x09abc", b""],
                   encode_data(Content(1, "chat", b"content before a lease"))):
        hostile.send_multipart(frames)
    hostile.send_multipart(encode_data(Summon(1, "chat")))
    assert hostile.poll(2000)
    assert hostile.recv_multipart() == encode_data(Response(1, 403))
    hostile.close(0)
    writer = new(clients, gateway)
    writer.login()
    wl = writer.lease(Direction.WRITE, ("chat",))
    assert isinstance(wl, DataLease)
    writer.connect_data(wl)
    writer.send(Content(1, "", b"still served"))
    assert [c.body for c in reader.contents(1)] == [b"still served"]


def test_misuse_is_refused_and_an_unstarted_gateway_frees_its_ports(
        tmp_path: Path, free_udp_port: int, free_tcp_port: int) -> None:
    from peermesh import Node
    with pytest.raises(ValueError, match="run must be one of"):
        Gateway(tmp_path / "creds.json", run="sometimes")
    for _ in range(2):  # the second binds the same port: the first let it go
        gw = Gateway(tmp_path / "creds.json", run="always", control_port=free_tcp_port)
        gw.attach(Node("never-started", interface="lo", port=free_udp_port))
        assert gw.control_endpoint == f"tcp://127.0.0.1:{free_tcp_port}"
        gw.stop()
