"""Helpers for the MTL gateway tests: a gateway on a threaded node, a raw MTL client.

``RawClient`` speaks 11/MTL with plain blocking pyzmq sockets (a REQ for
control, a DEALER for data) and the codec, from the test's thread: every
receive has a timeout, so a test never hangs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import scramp
import zmq

from peermesh.mtl.credentials import CredentialsFile, User, make_user
from peermesh.wire.mtl import (Authorize, Challenged, Content, DataLease, Direction, Lease,
                               LeaseRequest, Open, Ready, Reply, Response, SelectProfile,
                               decode_data, decode_reply, encode_data, encode_request)

TIMING = dict(interval=0.05, evasive=0.3, silent=0.4, expired=0.6)
#: seconds a wait for an answer may take, Pings or not: generous, for a loaded 2-core
#: machine (a freshly started gateway process answers its first login after its imports)
WAIT = 30.0
RECV_MS = int(WAIT * 1000)


def add_users(path: Path, *users: User) -> CredentialsFile:
    """Write ``users`` into the credentials file at ``path``."""
    creds = CredentialsFile(path)
    creds.update(lambda table: table.update((u.name, u) for u in users))
    return creds


def default_users(path: Path) -> CredentialsFile:
    return add_users(path,
                     make_user("alice", "wonderland", read=["*"], write=["*"]),
                     make_user("bob", "builder", read=["resource", "public"],
                               write=["resource"]))


class RawClient:
    """One MTL client: a control REQ and, once leased, a data DEALER."""

    def __init__(self, control: str, context: Optional[zmq.Context] = None) -> None:
        self.context = context or zmq.Context.instance()
        self.control_endpoint = control
        self.req = self._socket(zmq.REQ)
        self.req.connect(control)
        self.data: Optional[zmq.Socket] = None
        self.sequence = 0

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, RECV_MS)
        return sock

    def close(self) -> None:
        self.req.close(0)
        if self.data is not None:
            self.data.close(0)

    # --- control ------------------------------------------------------------

    def ask(self, request: Any) -> Reply:
        frames = request if isinstance(request, list) else encode_request(request)
        self.req.send_multipart(frames)
        return decode_reply(self.req.recv_multipart())

    def scram(self, user: str, password: str) -> Reply:
        client = scramp.ScramClient(["SCRAM-SHA-256"], user, password)
        reply = self.ask(Authorize("SCRAM-SHA-256", client.get_client_first().encode()))
        if isinstance(reply, Challenged):
            client.set_server_first(reply.challenge.decode())
            reply = self.ask(Authorize("SCRAM-SHA-256", client.get_client_final().encode()))
            if isinstance(reply, Ready) and reply.additional is not None:
                client.set_server_final(reply.additional.decode())
        return reply

    def login(self, user: str = "alice", password: str = "wonderland",
              profile: str = "mesh", vhost: str = "/") -> Ready:
        self.ask(Open(vhost))
        ready = self.scram(user, password)
        assert isinstance(ready, Ready), ready
        assert self.ask(SelectProfile(profile)).__class__.__name__ == "Ok"
        return ready

    def lease(self, direction: Direction, resources: tuple[str, ...] = (),
              confirm: str = "none") -> Reply:
        return self.ask(LeaseRequest(direction, resources, confirm))

    # --- data -----------------------------------------------------------------

    def connect_data(self, lease: DataLease) -> Response:
        """Open the data DEALER on the lease's port and present the lease."""
        host = self.control_endpoint.rpartition(":")[0]
        if self.data is not None:
            self.data.close(0)
        self.data = self._socket(zmq.DEALER)
        self.data.connect(f"{host}:{lease.port}")
        return self.command(Lease(self.next(), lease.lease))  # type: ignore[return-value]

    def next(self) -> int:
        self.sequence += 1
        return self.sequence

    def send(self, command: Any) -> None:
        assert self.data is not None
        self.data.send_multipart(command if isinstance(command, list) else encode_data(command))

    def recv(self, deadline: Optional[float] = None) -> Any:
        """The next data command; zmq.Again after ``RECV_MS`` or past ``deadline``."""
        assert self.data is not None
        if deadline is not None and time.monotonic() > deadline:
            raise zmq.Again("gave up waiting")
        return decode_data(self.data.recv_multipart())

    def command(self, command: Any) -> Any:
        """Send a command and return the Response to it (skipping Pings)."""
        self.send(command)
        deadline = time.monotonic() + WAIT
        while True:
            answer = self.recv(deadline)
            if isinstance(answer, Response):
                return answer

    def contents(self, count: int) -> list[Content]:
        """The next ``count`` Contents (Pings answered, other commands skipped)."""
        out: list[Content] = []
        deadline = time.monotonic() + WAIT
        while len(out) < count:
            answer = self.recv(deadline)
            if isinstance(answer, Content):
                out.append(answer)
            elif answer.__class__.__name__ == "Ping":
                self.send([b"\x09", b""])
        return out

    def quiet(self, ms: int = 200) -> list:
        """Everything but Pings that arrives within ``ms``."""
        assert self.data is not None
        out = []
        while self.data.poll(ms):
            answer = decode_data(self.data.recv_multipart())
            if answer.__class__.__name__ != "Ping":
                out.append(answer)
        return out
