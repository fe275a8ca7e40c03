"""``confirm: full`` end to end: a gateway in its own process killed with SIGKILL and
started again on the same store, or killed for good while a standby gateway takes over;
clients reconnect. Nothing confirmed to a writer is lost; nothing a reader confirmed
comes again."""

from __future__ import annotations

import json
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import childprocs
import pytest

from gatewayhelp import WAIT, RawClient, default_users
from peermesh.wire.mtl import (Confirm, Content, DataLease, Direction, Ping, Pong, Reject,
                               Response, Summon)

HERE = Path(__file__).resolve().parent


class Child:
    """A ``gatewaychild.py`` process."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.proc = subprocess.Popen([sys.executable, str(HERE / "gatewaychild.py"),
                                      json.dumps(config)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, cwd=str(HERE))
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            if not selector.select(30.0):
                self.close()
                pytest.fail("the gateway child did not start within 30 s")
        line = self.proc.stdout.readline()
        if not line:
            pytest.fail(f"the gateway child exited with {self.proc.wait(5)}")
        self.endpoints = json.loads(line)

    def expect_state(self, state: str) -> None:
        """Wait (at most WAIT) for the child to print that it reached ``state``."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + WAIT
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not selector.select(deadline - time.monotonic()):
                    break
                line = self.proc.stdout.readline()
                if not line:
                    pytest.fail(f"the gateway child exited with {self.proc.wait(5)}")
                if json.loads(line).get("state") == state:
                    return
        pytest.fail(f"the gateway child was not {state} within {WAIT} s")

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL: no commit, no close
        self.proc.wait(10)

    def close(self) -> None:
        childprocs.stop(self.proc, 10)


@pytest.fixture
def config(tmp_path: Path, free_udp_port: int) -> dict[str, Any]:
    default_users(tmp_path / "creds.json")
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    return {"name": "gw", "port": free_udp_port, "credentials": str(tmp_path / "creds.json"),
            "data_dir": str(tmp_path), "control_port": ports[0], "data_port": ports[1]}


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for child in made:
        child.close()


def connect(control: str, direction: Direction) -> RawClient:
    client = RawClient(control)
    client.login()
    lease = client.lease(direction, ("jobs",), "full")
    assert isinstance(lease, DataLease), lease
    assert client.connect_data(lease) == Response(1, 200)
    client.leased = lease  # type: ignore[attr-defined]
    return client


def confirmed_up_to(writer: RawClient, last: int) -> int:
    """Wait for the writer's Confirm covering ``last`` (answering Pings); its sequence."""
    deadline = time.monotonic() + WAIT
    while True:
        answer = writer.recv(deadline)
        if isinstance(answer, Confirm) and answer.multiple and answer.sequence >= last:
            return answer.sequence
        assert not isinstance(answer, Reject), answer
        if isinstance(answer, Ping):
            writer.send(Pong())


def settled(client: RawClient) -> None:
    """A Ping answered: whatever the client sent before it was handled and committed."""
    client.send(Ping())
    deadline = time.monotonic() + WAIT
    while not isinstance(client.recv(deadline), Pong):
        pass


@pytest.mark.parametrize("name", ["gw", None])  # None: a random node name at each start
def test_confirm_full_across_kill_9_and_reconnect(config: dict[str, Any], name: Any,
                                                  children: list[Child]) -> None:
    config = {**config, "name": name}
    child = Child(config)
    children.append(child)
    control = child.endpoints["control"]
    writer = connect(control, Direction.WRITE)
    for i in range(1, 51):
        writer.send(Content(i, "", b"job %d" % i))
    confirmed_up_to(writer, 50)
    reader = connect(control, Direction.READ)
    assert reader.command(Summon(reader.next(), "jobs")) == Response(2, 200)
    first = reader.contents(50)
    assert [c.body for c in first] == [b"job %d" % i for i in range(1, 51)]
    reader.send(Confirm(first[9].sequence, True))  # jobs 1-10 are safe with the reader
    settled(reader)
    child.kill()
    writer.close()
    reader.close()

    child = Child(config)  # the same ports, the same store
    children.append(child)
    reader = connect(child.endpoints["control"], Direction.READ)
    reader.command(Summon(reader.next(), "jobs"))
    again = reader.contents(40)
    assert [c.body for c in again] == [b"job %d" % i for i in range(11, 51)]
    # a reconnect (a new data connection presenting the same lease) gets what it held back
    reader.send(Confirm(again[19].sequence, True))  # jobs 11-30 confirmed
    settled(reader)
    assert reader.connect_data(reader.leased).code == 200  # type: ignore[attr-defined]
    assert reader.command(Summon(reader.next(), "jobs")).code == 200
    rest = reader.contents(20)
    assert [c.body for c in rest] == [b"job %d" % i for i in range(31, 51)]
    reader.send(Confirm(rest[-1].sequence, True))
    settled(reader)
    assert reader.quiet(300) == []  # nothing more: no duplicates once confirmed
    reader.close()


def test_content_confirmed_to_the_writer_survives_a_kill_9(config: dict[str, Any],
                                                           children: list[Child]) -> None:
    child = Child(config)
    children.append(child)
    writer = connect(child.endpoints["control"], Direction.WRITE)
    total = 2000
    for i in range(1, total + 1):
        writer.send(Content(i, "", b"w%d" % i))
    confirmed = confirmed_up_to(writer, 1)  # some are confirmed, the rest may be in flight
    child.kill()
    writer.close()
    child = Child(config)
    children.append(child)
    writer = connect(child.endpoints["control"], Direction.WRITE)
    if confirmed < total:
        for i in range(confirmed + 1, total + 1):  # the client sends again the unconfirmed
            writer.send(Content(i, "", b"w%d" % i))
        confirmed_up_to(writer, total)
    reader = connect(child.endpoints["control"], Direction.READ)
    reader.command(Summon(reader.next(), "jobs"))
    wanted = {b"w%d" % i for i in range(1, total + 1)}
    seen: set[bytes] = set()
    for _ in range(2 * total):  # (stored twice at most: once before the kill, once resent)
        if wanted <= seen:
            break
        (content,) = reader.contents(1)  # each within WAIT
        seen.add(content.body)
        reader.send(Confirm(content.sequence))
    assert sorted(wanted - seen) == [] and seen == wanted
    writer.close()
    reader.close()


def test_a_standby_takes_over_what_a_gateway_killed_for_good_held(
        tmp_path: Path, free_udp_port: int, children: list[Child]) -> None:
    default_users(tmp_path / "creds.json")
    common = {"port": free_udp_port, "credentials": str(tmp_path / "creds.json"),
              "run": "elected", "settle": 0.1}
    serving = Child({**common, "name": "a", "data_dir": str(tmp_path / "a"), "priority": 9})
    children.append(serving)
    serving.expect_state("serving")
    standby = Child({**common, "name": "b", "data_dir": str(tmp_path / "b"), "priority": 1})
    children.append(standby)
    standby.expect_state("replica")

    writer = connect(serving.endpoints["control"], Direction.WRITE)
    for i in range(1, 301):
        writer.send(Content(i, "", b"job %d" % i))
    confirmed_up_to(writer, 300)
    reader = connect(serving.endpoints["control"], Direction.READ)
    assert reader.command(Summon(reader.next(), "jobs")) == Response(2, 200)
    first = reader.contents(300)
    assert [c.body for c in first] == [b"job %d" % i for i in range(1, 301)]
    reader.send(Confirm(first[99].sequence, True))  # jobs 1-100 are safe with the reader
    settled(reader)                                   # (and forgotten by the standby)
    for i in range(301, 501):                         # more, some of it in flight at the kill
        writer.send(Content(i, "", b"job %d" % i))
    confirmed = confirmed_up_to(writer, 301)
    serving.kill()                                    # for good: its store is never read again
    writer.close()
    reader.close()

    standby.expect_state("serving")
    reader = connect(standby.endpoints["control"], Direction.READ)
    assert reader.command(Summon(reader.next(), "jobs")).code == 200
    due = [b"job %d" % i for i in range(101, confirmed + 1)]
    got = [c for c in reader.contents(len(due))]
    got += [c for c in reader.quiet(300) if isinstance(c, Content)]  # (unconfirmed ones too)
    bodies = [c.body for c in got]
    assert len(bodies) == len(set(bodies))            # exactly once
    assert set(due) <= set(bodies) <= {b"job %d" % i for i in range(101, 501)}
    assert bodies[:len(due)] == due                   # in order
    reader.send(Confirm(got[-1].sequence, True))
    settled(reader)
    assert reader.quiet(300) == []
    reader.close()
