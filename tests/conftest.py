"""Shared pytest fixtures for the peermesh tests.

Sections: simulated LAN (network namespaces, see ``netlab.py``), then
loopback ports. Append new fixtures in their own section below.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

try:  # tests/ as a package
    from . import netlab
except ImportError:  # tests/ on sys.path (pytest's default "prepend" import mode)
    import netlab

if TYPE_CHECKING:
    from cliprocess import Cli


# --------------------------------------------------------------------------
# Simulated LAN: several hosts in network namespaces (needs root and `ip`)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that use ``lan_factory`` get the ``lan`` marker (``-m "not lan"``)."""
    for item in items:
        if "lan_factory" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.lan)


@pytest.fixture
def lan_factory(request: pytest.FixtureRequest) -> Callable[..., netlab.Lan]:
    """``lan_factory(hosts=2, **kw) -> netlab.Lan``, already started.

    Skips the test when namespaces cannot be created here. Every Lan is
    closed (processes ended, namespaces deleted) by the fixture finaliser,
    also when the test fails or is interrupted.
    """
    reason = netlab.lan_available()
    if reason is not None:
        pytest.skip(reason)

    def make(hosts: int = 2, **kw: object) -> netlab.Lan:
        lan = netlab.Lan(hosts, **kw)  # type: ignore[arg-type]
        request.addfinalizer(lan.close)  # registered before anything exists
        return lan.start()

    return make


# --------------------------------------------------------------------------
# Loopback ports, so single-host tests do not collide on 5670


def _free_port(kind: socket.SocketKind) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def free_udp_port() -> int:
    """A UDP port on 127.0.0.1 that was free a moment ago."""
    return _free_port(socket.SOCK_DGRAM)


@pytest.fixture
def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    return _free_port(socket.SOCK_STREAM)


# --------------------------------------------------------------------------
# The node's two ZeroMQ paths: the C extension's batches, and pyzmq alone


@pytest.fixture(params=["native", "pyzmq"])
def zmq_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with the C extension's batched I/O, then again with pyzmq alone.

    Nodes pick the path when they create their sockets, so the whole test runs
    on one. The native run skips, with the reason, where the extension is not
    available (it is built at install when a C compiler is present).
    """
    from peermesh.io import zmqbatch

    if request.param == "native":
        if zmqbatch.native is None:
            pytest.skip(f"C extension unavailable: {zmqbatch.why_not}")
    else:
        monkeypatch.setattr(zmqbatch, "native", None)
    return str(request.param)


# --------------------------------------------------------------------------
# Signal handlers: a command run in-process installs its own


@pytest.fixture(autouse=True)
def _signal_handlers_restored() -> Iterator[None]:
    """SIGINT and SIGTERM handled as before each test (``cli.main`` run in-process
    makes them raise ``Interrupted``, which would outlive the test)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        if signal.getsignal(sig) is not handler and handler is not None:
            signal.signal(sig, handler)


# --------------------------------------------------------------------------
# The ``peermesh`` command in child processes (see ``cliprocess.py``)


@pytest.fixture
def cli(free_udp_port: int) -> Iterator["Cli"]:
    """A ``cliprocess.Cli`` on a free loopback port; every process it started is killed
    afterwards. (Test folders that need more of it define a ``cli`` of their own.)"""
    from cliprocess import Cli

    runner = Cli(free_udp_port)
    try:
        yield runner
    finally:
        runner.close()
