"""Helpers of the CURVE node tests: keys on disk, loopback nodes with keys, raw CURVE peers."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional
from uuid import UUID

import pytest
import zmq
import zmq.utils.monitor

from peermesh import Event, EventType, NodeConfig, ThreadedNode
from peermesh.io.keys import Keypair, generate, write_keypair
from peermesh.wire import zre

TIMEOUT = 10.0
INTERVAL = 0.1


class KeyRing:
    """Named keypairs written under one directory, and allowlist directories."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.keys: dict[str, Keypair] = {}

    def make(self, name: str) -> Keypair:
        keypair = self.keys[name] = generate()
        write_keypair(self.root / f"{name}.key", keypair, {"name": name})
        return keypair

    def secret(self, name: str) -> str:
        if name not in self.keys:
            self.make(name)
        return str(self.root / f"{name}.key_secret")

    def public(self, name: str) -> bytes:
        if name not in self.keys:
            self.make(name)
        return self.keys[name].public

    def allow(self, directory: str, *names: str) -> str:
        """Directory ``root/directory`` holding the public certificates of ``names``."""
        path = self.root / directory
        path.mkdir(exist_ok=True)
        for name in names:
            self.public(name)
            shutil.copy(self.root / f"{name}.key", path / f"{name}.key")
        return str(path)


def match(kind: EventType, peer: Optional[UUID] = None) -> Callable[[Event], bool]:
    def predicate(event: Event) -> bool:
        return event.type is kind and (peer is None or event.peer == peer)
    predicate.__name__ = f"{kind.name} {peer}"
    return predicate


def wait_for(node: Any, predicate: Callable[[Event], bool], timeout: float = TIMEOUT,
             seen: Optional[list[Event]] = None) -> Event:
    """The first event matching ``predicate``; every event read is appended to ``seen``."""
    deadline = time.monotonic() + timeout
    read: list[Event] = [] if seen is None else seen
    while True:
        remaining = deadline - time.monotonic()
        event = node.recv(remaining) if remaining > 0 else None
        if event is None:
            pytest.fail(f"{node.name}: nothing matched {predicate.__name__} within {timeout}s; "
                        f"saw {read[-20:]}")
        read.append(event)
        if predicate(event):
            return event


def drain(node: Any) -> list[Event]:
    """The events queued now, without waiting."""
    events = []
    while (event := node.recv(0)) is not None:
        events.append(event)
    return events


def hear_beacons(port: int, senders: Iterable[UUID], times: int = 3,
                 timeout: float = TIMEOUT) -> None:
    """Wait until every one of ``senders`` has beaconed ``times`` more times on ``port``
    (so every node on the port has had as many chances to hear it)."""
    counts = {uuid.bytes: 0 for uuid in senders}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("", port))
        deadline = time.monotonic() + timeout
        while min(counts.values()) < times:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"beacons heard: {counts}"
            sock.settimeout(remaining)
            data = sock.recv(64)
            if len(data) in (22, 54) and data[4:20] in counts:
                counts[data[4:20]] += 1


def raw_dealer(keypair: Keypair, server_key: bytes, endpoint: str,
               identity: bytes) -> zmq.Socket:
    """A blocking CURVE DEALER as any program with ``keypair`` could make it."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, 5000)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.curve_secretkey = keypair.secret
    sock.curve_publickey = keypair.public
    sock.curve_serverkey = server_key
    sock.connect(endpoint)
    return sock


def handshake(keypair: Keypair, server_key: bytes, endpoint: str,
              timeout: float = TIMEOUT) -> bool:
    """Whether a CURVE client with ``keypair`` completes its handshake with ``endpoint``
    (False: the server's ZAP handler refused the key)."""
    sock = raw_dealer(keypair, server_key, endpoint, b"\x01" + bytes(16))
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED
                                      | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    try:
        if not monitor.poll(timeout * 1000):
            pytest.fail(f"no handshake with {endpoint} within {timeout}s")
        event = zmq.utils.monitor.recv_monitor_message(monitor)
        return event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close()


def hello(endpoint: str, headers: dict[str, str], name: str = "raw") -> list[bytes]:
    return zre.encode(zre.Hello(1, endpoint, (), 0, name, headers))


class Nodes:
    """Loopback ThreadedNodes on one beacon port, stopped at the end of the test."""

    def __init__(self, port: int, ring: KeyRing) -> None:
        self.port = port
        self.ring = ring
        self.nodes: list[ThreadedNode] = []

    def start(self, name: str, *, key: bool = True, allow: Optional[Iterable[str]] = None,
              **settings: Any) -> ThreadedNode:
        """Node ``name``: with its key unless ``key`` is False; ``allow``: the names whose
        keys it admits (directory ``allow-NAME-NAME...``, shared by nodes that admit the same
        names), None: any key."""
        if key:
            settings["key_file"] = self.ring.secret(name)
            if allow is not None:
                names = sorted(allow)
                settings["allowed_keys"] = self.ring.allow("allow-" + "-".join(names), *names)
        node = ThreadedNode(name, config=NodeConfig(), interface="lo", port=self.port,
                            interval=INTERVAL, **settings)
        self.nodes.append(node)
        return node.start()

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop(timeout=0.5)
