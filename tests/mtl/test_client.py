"""``peermesh.mtl.Client`` and ``peermesh mtl read|write`` against real gateways on loopback.

Each gateway is the gateway overlay (``peermesh.mtl.Gateway``, ``run="always"``) on a
``ThreadedNode`` of its own, with its SQLite store in the test's directory.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest
import zmq

from gatewayhelp import TIMING
from peermesh import ThreadedNode
from peermesh.mtl.client import (AsyncClient, AuthenticationFailed, Client,
                                 GatewayUnavailable, Received, RequestRefused)
from peermesh.mtl.credentials import CredentialsFile, User, make_user
from peermesh.mtl.gateway import Gateway
from waiting import poll_until

WAIT = 10.0          # upper bound for anything that normally takes milliseconds
HEARTBEAT = 0.1


class Served:
    """A gateway on a node of its own; what the tests look at, by short names."""

    def __init__(self, credentials: CredentialsFile, data_dir: Path, port: int,
                 heartbeat: float, **options: Any) -> None:
        self.gateway = Gateway(credentials, run="always", plain=True, heartbeat=heartbeat,
                               data_dir=data_dir, **options)
        self.node = ThreadedNode(data_dir.name, interface="lo", port=port,
                                 overlays=[self.gateway], **TIMING)  # type: ignore[arg-type]
        self.node.start()
        self.endpoint = self.gateway.control_endpoint
        self.credentials = credentials
        self.stopped = False

    @property
    def store(self) -> Any:
        return self.gateway.store

    @property
    def data(self) -> Any:
        return self.gateway.data

    def stop(self) -> None:
        """Stop the node, and the gateway with it (its sockets close)."""
        if not self.stopped:
            self.stopped = True
            self.node.stop()


@pytest.fixture
def credentials(tmp_path: Path) -> CredentialsFile:
    creds = CredentialsFile(tmp_path / "creds.json")
    alice = make_user("alice", "pencil", read=["*"], write=["*"])
    bob = make_user("bob", "pw", read=["resource", "chat"], write=["resource"])
    creds.update(lambda users: users.update(alice=alice, bob=bob))
    return creds


@pytest.fixture
def gateways(tmp_path: Path, credentials: CredentialsFile,
             free_udp_port: int) -> Iterator[Any]:
    started: list[Served] = []

    def start(name: str = "a", heartbeat: float = HEARTBEAT, **options: Any) -> Served:
        gateway = Served(credentials, tmp_path / f"gw-{name}", free_udp_port, heartbeat,
                         **options)
        started.append(gateway)
        return gateway

    try:
        yield start
    finally:
        for gateway in started:
            gateway.stop()


def client(gateway: Any, user: Optional[str] = "alice", password: str = "pencil",
           **options: Any) -> Client:
    endpoints = gateway if isinstance(gateway, list) else [gateway.endpoint]
    return Client(endpoints, user, password, **{"timeout": 2.0, "heartbeat": HEARTBEAT,
                                                **options})


def receive(reader: Any, count: int) -> list[Received]:
    got: list[Received] = []
    deadline = time.monotonic() + WAIT
    while len(got) < count:
        received = reader.receive(timeout=max(0.0, deadline - time.monotonic()))
        assert received is not None, f"received {len(got)} of {count}"
        got.append(received)
    return got


def test_test_profile_fans_out_from_writers_to_readers(gateways: Any) -> None:
    gateway = gateways()
    with client(gateway, profile="test") as one, client(gateway, "bob", "pw",
                                                        profile="test") as two:
        assert one.profiles == ("test", "mesh") and one.gateway == gateway.endpoint
        readers = [one.reader(["resource"]), two.reader(["resource"])]
        for reader in readers:
            reader.summon("resource")
        writer = two.writer(["resource"])
        assert writer.send(b"hello", properties={"k": [1, "v"]}) == 1
        writer.send(b"again", "resource")
        for reader in readers:
            got = receive(reader, 2)
            assert [r.body for r in got] == [b"hello", b"again"]
            assert got[0].resource == "resource" and got[0].properties == {"k": [1, "v"]}
            assert reader.receive(timeout=0.05) is None
        readers[0].dismiss("resource")
        writer.send(b"only for two")
        assert receive(readers[1], 1)[0].body == b"only for two"
        assert readers[0].receive(timeout=0.2) is None   # nothing after the Dismiss


def test_a_writer_sends_bytes_likes_and_refuses_the_rest_whole(gateways: Any) -> None:
    gateway = gateways()
    with client(gateway, profile="test") as one:
        reader = one.reader(["resource"])
        reader.summon("resource")
        writer = one.writer(["resource"])
        writer.send(bytearray(b"array"))
        with pytest.raises(TypeError):
            writer.send("text")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="not a short string"):
            writer.send(b"x", "bad\nname")
        writer.send(memoryview(b"view"), "resource")
        big = os.urandom(200_000)   # past pyzmq's copy threshold
        writer.send(big)
        got = receive(reader, 3)
        assert [r.body for r in got] == [b"array", b"view", big]
        assert [r.resource for r in got] == ["resource"] * 3
        assert reader.receive(timeout=0.05) is None


def test_refusals(gateways: Any, credentials: CredentialsFile) -> None:
    gateway = gateways()
    with pytest.raises(AuthenticationFailed, match="refused alice"):
        client(gateway, password="wrong").connect()
    with pytest.raises(AuthenticationFailed, match="offers SCRAM-SHA-256, PLAIN, not"):
        Client([gateway.endpoint], "alice", "x", mechanism="CRAM-MD5").connect()
    with client(gateway, "bob", "pw") as bob:
        with pytest.raises(RequestRefused) as refused:
            bob.writer(["chat"])                         # bob may only read chat
        assert refused.value.status == 403
        reader = bob.reader(["chat"])
        with pytest.raises(RequestRefused, match="Summon 'news': 400"):
            reader.summon("news")                        # not in the lease
    with client(gateway, profile="test") as test:
        with pytest.raises(RequestRefused) as refused:
            test.reader(["resource"], confirm="full")
        assert refused.value.status == 501
    with pytest.raises(RequestRefused, match="Connection.Profile 'nope': 400"):
        client(gateway, profile="nope").connect()
    silent: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.ROUTER)   # answers nothing
    try:
        silent.bind("tcp://127.0.0.1:*")
        with pytest.raises(GatewayUnavailable, match="no reply within 0.2 s"):
            Client([silent.getsockopt_string(zmq.LAST_ENDPOINT)], "alice", "pencil",
                   timeout=0.2).connect()
    finally:
        silent.close(0)
    with pytest.raises(ValueError, match="not tcp://HOST:PORT"):
        Client(["ipc:///tmp/x"])


def test_plain_and_a_new_verifier_for_the_same_password(gateways: Any) -> None:
    gateway = gateways()
    with client(gateway, mechanism="PLAIN") as plain:
        plain.reader(["chat"]).summon("chat")
    gateway.credentials.update(lambda users: users.update(
        alice=make_user("alice", "pencil", read=["*"])))
    with client(gateway) as fresh:   # the same password, a new salt: SCRAM both ways
        fresh.reader(["chat"]).summon("chat")


def test_anonymous_clients_get_the_anonymous_users_grants(gateways: Any) -> None:
    gateway = gateways(anonymous=True)
    gateway.credentials.update(lambda users: users.update(
        anonymous=make_user("anonymous", "unused", read=["public"])))
    with Client([gateway.endpoint], heartbeat=HEARTBEAT) as nobody:
        assert nobody.mechanism == "ANONYMOUS"
        nobody.reader(["public"]).summon("public")
        with pytest.raises(RequestRefused) as refused:
            nobody.reader(["chat"])
        assert refused.value.status == 403
    with pytest.raises(AuthenticationFailed, match="not ANONYMOUS"):
        Client([gateways("b").endpoint]).connect()     # a gateway without ANONYMOUS


def test_confirm_full_survives_the_reader_and_never_repeats_confirmed(gateways: Any) -> None:
    gateway = gateways()
    with client(gateway) as alice:
        writer = alice.writer(["jobs"], confirm="full")
        reader = alice.reader(["jobs"], confirm="full")
        reader.summon("jobs")
        for i in range(20):
            writer.send(b"job %d" % i)
        assert writer.wait(WAIT) and writer.unconfirmed == 0 and not writer.rejected
        got = receive(reader, 20)
        assert [r.body for r in got] == [b"job %d" % i for i in range(20)]
        assert reader.confirm(got[9], multiple=True)      # jobs 0-9
        assert reader.reject(got[10], recycle=False)      # job 10 dropped
        assert reader.reject(got[11], recycle=True)       # job 11 again, first
        assert receive(reader, 1)[0].body == b"job 11"
        reader.close()                                    # 11-19 unconfirmed
    with client(gateway, "bob", "pw") as bob, pytest.raises(RequestRefused):
        bob.reader(["jobs"], confirm="full")              # bob may not read jobs
    with client(gateway) as again:
        reader = again.reader(["jobs"], confirm="full")
        reader.summon("jobs")
        deadline = time.monotonic() + WAIT
        bodies: list[bytes] = []
        while len(bodies) < 9 and time.monotonic() < deadline:
            # the first reader's link is unbound once the gateway hears nothing from it
            received = reader.receive(timeout=0.2)
            if received is not None:
                bodies.append(received.body)
                reader.confirm(received)
        assert sorted(bodies) == sorted(b"job %d" % i for i in range(11, 20))
        assert reader.receive(timeout=0.3) is None


def test_failover_to_the_next_gateway(gateways: Any) -> None:
    # (the second gateway gives its links a second of silence: the reader is not read
    # while the writer waits for the first gateway to time out)
    first, second = gateways("a"), gateways("b", heartbeat=1.0)
    with client([first.endpoint, second.endpoint], timeout=1.0) as alice:
        reader = alice.reader(["chat"])
        reader.summon("chat")
        writer = alice.writer(["chat"], confirm="full")
        writer.send(b"before")
        assert receive(reader, 1)[0].body == b"before" and writer.wait(WAIT)
        assert alice.gateway == first.endpoint
        first.stop()
        # the reader notices the silence, reconnects to the second gateway, summons again
        assert reader.receive(timeout=HEARTBEAT * 3 + 0.5) is None
        deadline = time.monotonic() + WAIT
        while alice.gateway != second.endpoint and time.monotonic() < deadline:
            reader.receive(timeout=0.1)
        assert alice.gateway == second.endpoint and reader.summoned == ["chat"]
        writer.send(b"after")                          # the writer follows on its own
        assert writer.wait(WAIT)
        assert receive(reader, 1)[0].body == b"after"


def test_changed_credentials_mean_authenticating_again(gateways: Any) -> None:
    gateway = gateways()
    with client(gateway, "bob", "pw") as bob:
        bob.reader(["chat"])
        grants: dict[str, User] = {}

        def widen(users: dict[str, User]) -> None:
            users["bob"] = grants["bob"] = make_user("bob", "pw", read=["*"])

        gateway.credentials.update(widen)
        reader = bob.reader(["news"])    # 401, authenticated again, the new grant applies
        reader.summon("news")
        gateway.credentials.update(lambda users: users.update(bob=make_user("bob", "new")))
        with pytest.raises(AuthenticationFailed, match="refused bob"):
            bob.reader(["news"])


def test_an_idle_reader_answers_pings_and_stays_bound(gateways: Any) -> None:
    gateway = gateways()
    with client(gateway) as alice:
        reader = alice.reader(["chat"])
        reader.summon("chat")
        writer = alice.writer(["chat"])
        link = reader.link
        # quiet for many heartbeats: the gateway pings, the reader answers and pings; the
        # writer, not called meanwhile, is unbound by the gateway
        assert reader.receive(timeout=HEARTBEAT * 8) is None
        assert reader.link == link and len(gateway.data.links) == 1
        writer.send(b"still here")             # binds its lease again first
        assert receive(reader, 1)[0].body == b"still here"
        assert writer.link == 2


def test_asyncio_face(gateways: Any) -> None:
    gateway = gateways()

    async def main() -> list[bytes]:
        async with AsyncClient([gateway.endpoint], "alice", "pencil",
                               heartbeat=HEARTBEAT) as alice:
            reader = await alice.reader(["chat"], confirm="full")
            await reader.summon("chat")
            writer = await alice.writer(["chat"], confirm="full")
            for i in range(3):
                await writer.send(b"m%d" % i)
            assert await writer.wait(WAIT)
            got = []
            async for received in reader:
                got.append(received.body)
                assert await reader.confirm(received)
                if len(got) == 3:
                    break
            assert await reader.receive(timeout=0.05) is None
            return got

    assert asyncio.run(asyncio.wait_for(main(), WAIT)) == [b"m0", b"m1", b"m2"]


# --- peermesh mtl read / write ---------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    """``cli(*args, stdin="")``: (exit code, stdout, stderr) of ``peermesh ARGS`` run here."""
    from peermesh.cli.commands import main

    for key in list(os.environ):
        if key.startswith("PEERMESH_"):
            monkeypatch.delenv(key)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def run(*args: str, stdin: str = "") -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        return code, out, err

    try:
        yield run
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_cli_write_and_read_confirmed(gateways: Any, cli: Any,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = gateways()
    common = ("-g", gateway.endpoint, "-u", "alice", "--confirm", "full")
    code, _, err = cli("mtl", "write", "jobs", "first", *common, "--password-file", "-",
                       stdin="pencil\n")
    assert code == 0 and f"wrote 1 content to jobs through {gateway.endpoint}, all stored" \
        in err
    monkeypatch.setenv("PEERMESH_MTL_PASSWORD", "pencil")
    code, _, err = cli("mtl", "write", "jobs", *common, stdin="second\nthird \u00e9\n")
    assert code == 0 and "wrote 2 contents" in err
    code, out, err = cli("mtl", "read", "jobs", *common, "--json", "--count", "3")
    assert code == 0 and f"reading jobs through {gateway.endpoint} as alice" in err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["body"] for line in lines] == ["first", "second", "third \u00e9"]
    assert lines[0]["resource"] == "jobs" and lines[0]["properties"] == {}
    # printed, then confirmed: the confirms leave as the command closes
    poll_until(lambda: gateway.store.count == 0, WAIT, "the gateway to delete what was read")


def test_cli_read_prints_as_content_comes(gateways: Any, tmp_path: Path) -> None:
    gateway = gateways()
    password = tmp_path / "pw"
    password.write_text("pencil\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PEERMESH_")},
           "PYTHONPATH": str(REPO), "PYTHONIOENCODING": "utf-8"}
    reader = subprocess.Popen(
        [sys.executable, "-m", "peermesh", "mtl", "read", "chat", "news", "-g",
         gateway.endpoint, "-u", "alice", "--password-file", str(password), "-n", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert reader.stderr is not None
        assert "reading chat, news through" in reader.stderr.readline()
        with client(gateway) as alice:
            writer = alice.writer(["chat", "news"])
            writer.send(b"hello", "chat")
            writer.send(b"\x1b[2Jbreaking", "news")
        out, err = reader.communicate(timeout=WAIT)
    finally:
        reader.kill()
        reader.wait(WAIT)
    assert reader.returncode == 0, err
    assert out.splitlines() == ["chat: hello", "news: \\x1b[2Jbreaking"]


def test_cli_client_misuse_and_failures(gateways: Any, cli: Any) -> None:
    gateway = gateways()
    code, _, err = cli("mtl", "read", "chat")
    assert code == 2 and "no gateway: give --gateway" in err
    code, _, err = cli("mtl", "read", "chat", "-g", "localhost")
    assert code == 2 and "'localhost' is not tcp://HOST:PORT" in err
    code, _, err = cli("mtl", "write", "chat", "-", "-g", gateway.endpoint, "-u", "alice",
                       "--password-file", "-", stdin="pencil\nhello\n")
    assert code == 2 and "standard input carries the messages" in err
    code, _, err = cli("mtl", "write", "chat", "x", "-g", gateway.endpoint, "-u", "alice",
                       "--password-file", "-", stdin="wrong\n")
    assert code == 1 and "error: the gateway refused alice" in err
    code, _, err = cli("mtl", "write", "chat", "x", "-g", gateway.endpoint, "-u", "bob",
                       "--password-file", "-", stdin="pw\n")
    assert code == 1 and "Connection.Writer: 403 bob may not write 'chat'" in err
    silent: zmq.Socket[Any] = zmq.Context.instance().socket(zmq.ROUTER)
    try:
        silent.bind("tcp://127.0.0.1:*")
        code, _, err = cli("mtl", "read", "chat", "-g", silent.getsockopt_string(
            zmq.LAST_ENDPOINT), "--timeout", "0.2")
        assert code == 1 and "no gateway answered" in err
    finally:
        silent.close(0)


def test_a_confirmed_writer_holds_at_most_window_contents(gateways: Any) -> None:
    gateway = gateways()
    with client(gateway, window=3) as alice:
        writer = alice.writer(["jobs"], confirm="full")
        most = 0
        for i in range(30):
            writer.send(b"%d" % i)
            most = max(most, writer.unconfirmed)
        assert most == 3 and writer.wait(WAIT)
    assert gateway.store.count == 30


def _unbound_while_idle(gateway: Any, reader: Any) -> None:
    """Wait (not calling ``reader``) until the gateway unbound the reader's link."""
    poll_until(lambda: not gateway.data.links, WAIT,
               "the gateway to unbind the link nobody answers")


def _hears(reader: Any, writer: Any, body: bytes) -> bool:
    """Send ``body`` and look for it (a content sent while the link is unbound is gone)."""
    writer.send(body)
    return any(r.body == body for r in iter(lambda: reader.receive(timeout=0.2), None))


def test_a_reader_unbound_while_idle_summons_again_on_its_next_call(gateways: Any) -> None:
    gateway = gateways()
    with client(gateway) as alice, client(gateway) as bob:
        reader = alice.reader(["chat"])
        reader.summon("chat")
        link = reader.link
        writer = bob.writer(["chat"])
        # the gateway's Pings queue up unanswered, then it unbinds the link: those Pings
        # prove nothing, the reader presents its lease again (200) and summons again
        _unbound_while_idle(gateway, reader)
        poll_until(lambda: _hears(reader, writer, b"after"), WAIT,
                   "the reader to hear the writer again")
        assert reader.link > link and reader.summoned == ["chat"]


def test_a_periodic_check_answered_200_restores_the_summons(gateways: Any) -> None:
    # the client's heartbeat is longer than the gateway's: the reader does not count itself
    # idle, its periodic Lease gets 200 (bound again): it summons again
    gateway = gateways()
    with client(gateway, heartbeat=0.5) as alice, client(gateway) as bob:
        reader = alice.reader(["chat"], confirm="full")
        reader.summon("chat")
        writer = bob.writer(["chat"], confirm="full")
        writer.send(b"before")
        assert writer.wait(WAIT)
        before = receive(reader, 1)[0]
        link = reader.link
        _unbound_while_idle(gateway, reader)
        poll_until(lambda: _hears(reader, writer, b"after"), WAIT,
                   "the reader to hear the writer again")
        assert reader.link > link and reader.summoned == ["chat"]
        assert not reader.confirm(before)     # it came on the link the gateway unbound


def test_a_dropped_connection_is_noticed_at_once(gateways: Any) -> None:
    # a heartbeat of 5 s: only the dropped connection tells the reader (within WAIT)
    first, second = gateways("a"), gateways("b")
    with client([first.endpoint, second.endpoint], heartbeat=5.0, timeout=1.0) as alice, \
            client(second) as bob:
        reader = alice.reader(["chat"])
        reader.summon("chat")
        assert alice.gateway == first.endpoint
        first.stop()
        writer = bob.writer(["chat"])
        poll_until(lambda: _hears(reader, writer, b"on the second"), WAIT,
                   "the reader to move to the second gateway")
        assert alice.gateway == second.endpoint and reader.summoned == ["chat"]


def test_closed_leases_are_forgotten(gateways: Any) -> None:
    gateway = gateways()
    with client(gateway) as alice:
        kept = alice.reader(["chat"])
        for _ in range(5):
            alice.reader(["chat"]).close()
            with alice.writer(["chat"]) as writer:
                writer.send(b"x")
        assert alice._leases == [kept]
        kept.close()
        kept.close()                      # twice: nothing more happens
        assert alice._leases == []


def test_closed_async_leases_are_forgotten(gateways: Any) -> None:
    gateway = gateways()

    async def main() -> None:
        async with AsyncClient([gateway.endpoint], "alice", "pencil",
                               heartbeat=HEARTBEAT) as alice:
            for _ in range(3):
                reader = await alice.reader(["chat"])
                await reader.close()
                writer = await alice.writer(["chat"])
                await writer.send(b"x")
                await writer.close()
            kept = await alice.reader(["chat"])
            assert alice._leases == [kept] and alice.client._leases == [kept.lease]

    asyncio.run(asyncio.wait_for(main(), WAIT))
