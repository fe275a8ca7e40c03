"""An MTL gateway with failover on ``peermesh.sim`` in virtual time: two real ``Gateway``
overlays (real SQLite stores) on simulated nodes, electing one to serve while the other
holds a copy of its confirmed content; clients speak 11/MTL on simulated links. The
serving gateway is lost (its host cut off); the standby serves, and a reader gets from
it, exactly once and in order, everything a writer was confirmed and no reader confirmed
before."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterator

import gevent
import pytest
import scramp

from peermesh.config import NodeConfig
from peermesh.mtl.gateway import Gateway
from peermesh.sim import SimNetwork
from peermesh.wire.mtl import (Authorize, Challenged, Confirm, Content, DataLease, Direction,
                               Lease, LeaseRequest, Ok, Open, Ping, Pong, Ready, Reply, Response,
                               SelectProfile, Summon, decode_data, decode_reply, encode_data,
                               encode_request)
from peermesh.zre.node import Node

from gatewayhelp import default_users

TIMING: dict[str, Any] = dict(interval=0.1, evasive=0.3, silent=0.5, expired=1.0)


class Mesh:
    """One simulated LAN: gateway hosts and client hosts."""

    def __init__(self, tmp: Path) -> None:
        self.network = SimNetwork(latency=0.002, seed=11)
        self.clock = self.network.clock
        self.tmp = tmp
        self.credentials = tmp / "creds.json"
        default_users(self.credentials)
        self.closers: list[Callable[[], Any]] = []
        self.states: dict[str, list[str]] = {}
        self.hosts: dict[str, str] = {}

    def gateway(self, name: str, priority: int) -> Gateway:
        transport = self.network.transport()
        self.hosts[name] = transport.address
        node = Node(name, config=NodeConfig(interface="sim0", rtt_probe=0, **TIMING),
                    transport=transport)
        states = self.states[name] = []
        gateway = Gateway(self.credentials, run="elected", priority=priority, settle=0.1,
                          data_dir=self.tmp / name, on_state=states.append)
        (self.tmp / name).mkdir()
        gateway.attach(node)
        node.start()
        gateway.start()
        self.closers += [node.stop, gateway.stop]
        return gateway

    def until(self, what: str, done: Callable[[], bool], seconds: float) -> None:
        """Advance virtual time in small steps until ``done()``; fail after ``seconds``."""
        end = self.clock.now() + seconds
        while not done():
            if self.clock.now() >= end:
                pytest.fail(f"{what}: not within {seconds} virtual seconds")
            self.clock.advance(0.05)

    def client(self, name: str, control: str) -> "Client":
        client = Client(self, name, control)
        self.closers.append(client.close)
        return client

    def close(self) -> None:
        for close in reversed(self.closers):
            close()


class Client:
    """An 11/MTL client on a simulated host: a control link (REQ envelopes) and a data
    link; Pings on the data link are answered."""

    def __init__(self, mesh: Mesh, name: str, control: str) -> None:
        self.mesh = mesh
        self.name = name.encode()
        self.transport = mesh.network.transport()
        self.control_endpoint = control
        self.control = self.transport.connect(self.name + b"-control", control, 1000)
        self.replies: deque[list[bytes]] = deque()
        self.inbox: deque[Any] = deque()
        self.data: Any = None
        self.sequence = 0
        self.greenlets = [gevent.spawn(self.control.serve,
                                       lambda first, rest: self.replies.append(rest))]

    def ask(self, request: Any) -> Reply:
        assert self.control.try_send([b"", *encode_request(request)])
        self.mesh.until(f"an answer to {request!r}", lambda: bool(self.replies), 10.0)
        return decode_reply(self.replies.popleft())

    def login(self) -> None:
        self.ask(Open("/"))
        scram = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "wonderland")
        reply = self.ask(Authorize("SCRAM-SHA-256", scram.get_client_first().encode()))
        assert isinstance(reply, Challenged), reply
        scram.set_server_first(reply.challenge.decode())
        reply = self.ask(Authorize("SCRAM-SHA-256", scram.get_client_final().encode()))
        assert isinstance(reply, Ready), reply
        assert isinstance(self.ask(SelectProfile("mesh")), Ok)

    def lease(self, direction: Direction) -> None:
        """A ``confirm: full`` lease on "jobs", presented on a new data link."""
        lease = self.ask(LeaseRequest(direction, ("jobs",), "full"))
        assert isinstance(lease, DataLease), lease
        host = self.control_endpoint.rpartition(":")[0]
        self.data = self.transport.connect(self.name + b"-data", f"{host}:{lease.port}", 1000)
        self.greenlets.append(gevent.spawn(self.data.serve, self._on_data))
        assert self.command(Lease(self.next(), lease.lease)) == Response(1, 200)

    def _on_data(self, first: bytes, rest: list[bytes]) -> None:
        command = decode_data([first, *rest])
        if isinstance(command, Ping):
            self.send(Pong())
        else:
            self.inbox.append(command)

    def next(self) -> int:
        self.sequence += 1
        return self.sequence

    def send(self, command: Any) -> None:
        assert self.data.try_send(encode_data(command))

    def command(self, command: Any) -> Any:
        """Send ``command`` and wait for its Response."""
        self.send(command)
        self.mesh.until(f"the Response to {command!r}",
                        lambda: any(isinstance(c, Response) for c in self.inbox), 10.0)
        (response,) = [c for c in self.inbox if isinstance(c, Response)]
        self.inbox.remove(response)
        return response

    def contents(self, count: int) -> list[Content]:
        self.mesh.until(f"{count} contents", lambda: sum(
            isinstance(c, Content) for c in self.inbox) >= count, 20.0)
        got = [c for c in self.inbox if isinstance(c, Content)][:count]
        for content in got:
            self.inbox.remove(content)
        return got

    def settled(self) -> None:
        """A Ping answered: what this client sent before it was handled and committed (and,
        on a ``confirm: full`` link, committed by a replica too)."""
        self.send(Ping())
        self.mesh.until("a Pong", lambda: any(isinstance(c, Pong) for c in self.inbox), 20.0)
        self.inbox.remove(Pong())

    def close(self) -> None:
        for greenlet in self.greenlets:
            greenlet.kill(block=False)
        self.control.close()
        if self.data is not None:
            self.data.close()


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    m = Mesh(tmp_path)
    try:
        yield m
    finally:
        m.close()


def test_the_standby_delivers_what_the_lost_gateway_confirmed(mesh: Mesh) -> None:
    serving = mesh.gateway("a", priority=9)
    standby = mesh.gateway("b", priority=1)
    mesh.until("a serves and b holds a copy of its store",
               lambda: mesh.states["a"][-1:] == ["serving"]
               and mesh.states["b"][-1:] == ["replica"], 30.0)
    assert standby.elected_endpoint() == serving.control_endpoint

    writer = mesh.client("writer", serving.control_endpoint)
    writer.login()
    writer.lease(Direction.WRITE)
    for i in range(1, 51):
        writer.send(Content(writer.next(), "", b"job %d" % i))
    last = writer.sequence
    mesh.until("the writer's Confirm of everything", lambda: any(
        isinstance(c, Confirm) and c.multiple and c.sequence >= last for c in writer.inbox),
        20.0)
    assert standby.node is not None
    assert standby.replicas == frozenset() and serving.replicas == {standby.node.uuid}

    reader = mesh.client("reader", serving.control_endpoint)
    reader.login()
    reader.lease(Direction.READ)
    assert reader.command(Summon(reader.next(), "jobs")) == Response(2, 200)
    first = reader.contents(50)
    assert [c.body for c in first] == [b"job %d" % i for i in range(1, 51)]
    reader.send(Confirm(first[9].sequence, True))   # jobs 1-10 are safe with the reader
    reader.settled()                                # (and forgotten by the standby)

    # the serving gateway's host is cut off: for the mesh it is gone, with its store
    mesh.network.partition([[mesh.hosts["a"]]])
    mesh.until("b serves", lambda: mesh.states["b"][-1:] == ["serving"], 30.0)
    assert standby.active and standby.elected_endpoint() == standby.control_endpoint

    reader = mesh.client("reader-2", standby.control_endpoint)
    reader.login()
    reader.lease(Direction.READ)
    assert reader.command(Summon(reader.next(), "jobs")) == Response(2, 200)
    again = reader.contents(40)
    assert [c.body for c in again] == [b"job %d" % i for i in range(11, 51)]  # once, in order
    reader.send(Confirm(again[-1].sequence, True))
    reader.settled()
    mesh.clock.advance(2.0)
    assert not any(isinstance(c, Content) for c in reader.inbox)   # nothing more
    assert mesh.clock.now() < 120.0                                  # virtual seconds
