"""Fixtures for the Flux tests: nodes in child processes (``fluxchild.py``) on loopback.

Every wait is a bounded poll of a condition; children are closed (stdin)
and killed if need be in the finaliser.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional, TypeVar

import childprocs
import gevent
import pytest
import waiting

from peermesh.flux import FluxOverlay, FluxSettings

HERE = Path(__file__).resolve().parent
T = TypeVar("T")


def wait_until(check: Callable[[], Optional[T]], timeout: float, what: str) -> T:
    """Poll ``check()`` on the hub until it returns something true; fail after ``timeout``."""
    return waiting.poll_until(check, timeout, what, sleep=gevent.sleep, step=0.01)


class FluxChild(childprocs.JsonChild):
    """One ``fluxchild.py`` process and the JSON lines it printed."""

    ready_timeout = 20.0

    def __init__(self, config: dict[str, Any]) -> None:
        env = dict(os.environ, PYTHONPATH=str(HERE.parent.parent))
        super().__init__(subprocess.Popen([sys.executable, str(HERE / "fluxchild.py"),
                                           json.dumps(config)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, cwd=str(HERE), env=env),
                         "flux child")

    @property
    def endpoint(self) -> str:
        return str(self.ready["endpoint"])


@pytest.fixture
def flux_children() -> Iterator[Callable[..., FluxChild]]:
    """``flux_children(root=True)`` / ``flux_children(parents=[...])``: a ready child."""
    yield from childprocs.ready_children(lambda **config: FluxChild(config))


@pytest.fixture(params=[True, False], ids=["c-path", "python-path"])
def both_paths(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Run the test with the common hops routed in C (``flux_take``, when the extension
    has it) and with every message through ``FluxCore.receive``."""
    monkeypatch.setattr(FluxOverlay, "fast", request.param)
    return bool(request.param)


@pytest.fixture
def instance() -> Iterator[tuple[FluxOverlay, FluxOverlay]]:
    """Rank 0 and rank 1 (kary:2, fast heartbeats) on real sockets, rank 1 online."""
    fast = FluxSettings(heartbeat=0.1, torpid=0.3, lost=0.6, hello_timeout=0.5)
    root = FluxOverlay(root=True, topology="kary:2", settings=fast, address="127.0.0.1").start()
    one = FluxOverlay(parents=[root.endpoint], topology="kary:2", settings=fast,
                      address="127.0.0.1").start()
    try:
        assert one.wait_online(10)
        yield root, one
    finally:
        one.stop()
        root.stop()


@pytest.fixture
def refusing() -> Iterator[str]:
    """The endpoint of a ROUTER that answers every message with CONTROL DISCONNECT, as
    a flux-core broker answers a peer it does not know (a thread; closed at the end)."""
    import threading

    import zmq

    from peermesh.wire.flux import Control, ControlType, encode

    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def answer() -> None:
        while not stop.is_set():
            if router.poll(50):
                identity, *_ = router.recv_multipart()
                router.send_multipart([identity, *encode(Control(ControlType.DISCONNECT))])

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(5)
        router.close()
