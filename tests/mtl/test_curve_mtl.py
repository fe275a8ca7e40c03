"""The MTL gateway on a node with CURVE keys (loopback): SCRAM and PLAIN over CURVE, the
client's ``server_key`` and ``--server-key``, and PLAIN not offered on a plain link."""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from gatewayhelp import TIMING
from peermesh import ThreadedNode
from peermesh.io.keys import generate, write_keypair
from peermesh.mtl.client import AuthenticationFailed, Client, GatewayUnavailable
from peermesh.mtl.credentials import CredentialsFile, make_user
from peermesh.mtl.gateway import Gateway

WAIT = 10.0


@pytest.fixture
def start(tmp_path: Path, free_udp_port: int) -> Iterator[Callable[..., Gateway]]:
    """``start(name, keys=True, **gateway options)``: a gateway on a node of its own."""
    credentials = CredentialsFile(tmp_path / "creds.json")
    alice = make_user("alice", "pencil", read=["*"], write=["*"])
    credentials.update(lambda users: users.update(alice=alice))
    nodes: list[ThreadedNode] = []

    def run(name: str, keys: bool = True, **options: Any) -> Gateway:
        settings: dict[str, Any] = dict(TIMING)
        if keys:
            write_keypair(tmp_path / f"{name}.key", generate())
            settings["key_file"] = str(tmp_path / f"{name}.key_secret")
        gateway = Gateway(credentials, run="always", heartbeat=0.1,
                          data_dir=tmp_path / f"data-{name}", **options)
        node = ThreadedNode(name, interface="lo", port=free_udp_port, overlays=[gateway],
                            **settings)
        nodes.append(node)
        node.start()
        return gateway

    try:
        yield run
    finally:
        for node in reversed(nodes):
            node.stop()


def server_key(gateway: Gateway) -> str:
    assert gateway.curve is not None
    return gateway.curve.public.decode()


def client(gateway: Gateway, key: Any = None, mechanism: str = "SCRAM-SHA-256",
           timeout: float = 2.0) -> Client:
    key = server_key(gateway) if key is None else key
    return Client([gateway.control_endpoint], "alice", "pencil", mechanism=mechanism,
                  heartbeat=0.1, timeout=timeout, server_key=key or None)


def round_trip(session: Client, body: bytes) -> None:
    """Content written into group "chat" comes back to a reader of it (data flow)."""
    reader = session.reader(["chat"])
    reader.summon("chat")
    session.writer(["chat"]).send(body, "chat")
    deadline = time.monotonic() + WAIT
    received = None
    while received is None and time.monotonic() < deadline:
        received = reader.receive(timeout=0.2)
    assert received is not None and received.body == body


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_sasl_over_curve(start: Callable[..., Gateway], mechanism: str) -> None:
    gateway = start("gw")
    assert gateway.authenticator.mechanisms == ("SCRAM-SHA-256", "PLAIN")  # encrypted link
    with client(gateway, mechanism=mechanism) as session:
        round_trip(session, f"over curve with {mechanism}".encode())
    keyed = {gateway.control_endpoint: server_key(gateway)}   # the form for several gateways
    with client(gateway, keyed) as session:
        session.reader(["chat"]).summon("chat")


def test_a_curve_gateway_needs_its_key(start: Callable[..., Gateway]) -> None:
    gateway = start("gw")
    with pytest.raises(GatewayUnavailable, match="no reply within 0.3 s"):
        client(gateway, key="", timeout=0.3).connect()           # a plain client
    with pytest.raises(GatewayUnavailable, match="no reply within 0.3 s"):
        client(gateway, key=generate().public, timeout=0.3).connect()   # another key
    with pytest.raises(GatewayUnavailable, match="no public key for gateway"):
        client(gateway, key={"tcp://127.0.0.1:1": server_key(gateway)}).connect()
    with pytest.raises(ValueError, match="not 40 Z85 characters"):
        client(gateway, key="short")
    with client(gateway) as session:   # still serving the right key
        session.reader(["chat"]).summon("chat")


def test_plain_only_on_an_encrypted_link_unless_allowed(
        start: Callable[..., Gateway]) -> None:
    bare = start("bare", keys=False)
    assert bare.curve is None and bare.authenticator.mechanisms == ("SCRAM-SHA-256",)
    with pytest.raises(AuthenticationFailed, match="offers SCRAM-SHA-256, not PLAIN"):
        client(bare, key="", mechanism="PLAIN").connect()
    with client(bare, key="") as session:
        round_trip(session, b"scram on a plain link")
    allowed = start("allowed", keys=False, plain=True)
    with client(allowed, key="", mechanism="PLAIN") as session:
        round_trip(session, b"plain where allowed")
    never = start("never", plain=False)
    with pytest.raises(AuthenticationFailed, match="offers SCRAM-SHA-256, not PLAIN"):
        client(never, mechanism="PLAIN").connect()


def test_cli_server_key(start: Callable[..., Gateway], tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    from peermesh.cli.commands import main

    gateway = start("gw")
    for key in list(os.environ):
        if key.startswith("PEERMESH_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("PEERMESH_MTL_PASSWORD", "pencil")

    def run(*args: str) -> tuple[int, str]:
        monkeypatch.setattr(sys, "stdin", io.StringIO(""))
        try:
            code: Optional[int] = main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
        err = capsys.readouterr().err
        assert "Traceback" not in err
        return code or 0, err

    common = ("-g", gateway.control_endpoint, "-u", "alice", "--timeout", "2")
    code, err = run("mtl", "write", "jobs", "sealed", *common, "--confirm", "full",
                    "--server-key", str(tmp_path / "gw.key"))
    assert code == 0 and "wrote 1 content to jobs" in err
    code, err = run("mtl", "write", "jobs", "x", *common, "--server-key",
                    str(tmp_path / "missing.key"))
    assert code != 0 and "missing.key" in err
