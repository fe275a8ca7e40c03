"""Fixtures for the Safir-Darbaan tests: loopback channels and servers, child processes.

Everything stays on 127.0.0.1 (beacons, when a test needs the mesh, go to a
free non-default UDP port on ``lo``). Timings are short (ping interval 0.1 s)
so liveness decisions take a fraction of a second. Waits are bounded: a
condition polled with a deadline, or a blocking wait with a timeout. Child
processes run in their own session and are killed in finalisers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import gevent
import pytest

from peermesh.sada import Channel, Server, echo_service

try:
    import childprocs
    import lanpeers
except ImportError:  # pragma: no cover - tests/ is on sys.path under pytest
    from .. import childprocs, lanpeers  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CHILD = str(HERE / "sadachild.py")
PING = 0.1          # channel ping interval in these tests
WAIT = 5.0          # seconds for anything that normally takes milliseconds
START_WAIT = 15.0   # seconds for a child interpreter to start


def wait_until(predicate: Callable[[], Any], timeout: float = WAIT, what: str = "") -> Any:
    """Poll ``predicate`` (cooperatively) until it is truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")
        gevent.sleep(0.005)


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERMESH_")}
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *parts])
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Child(lanpeers.Commanded):
    """A ``sadachild.py`` process: READY line first, JSON commands on stdin."""

    def __init__(self, proc: subprocess.Popen, label: str) -> None:
        super().__init__(proc, label)
        try:
            self.ready = self.wait(lanpeers.match("READY"), START_WAIT)
        except BaseException:
            self.kill()
            raise

    def kill9(self) -> None:
        """SIGKILL, and wait (bounded) until it is gone."""
        childprocs.kill9(self.proc)

    def close(self) -> None:
        """End of input stops the child; kill it if that takes long."""
        childprocs.stop(self.proc)


def start_child(role: str, popen: Optional[Callable[..., Any]] = None, **cfg: Any) -> Child:
    """A ``sadachild.py ROLE`` process (``popen``: e.g. a netlab host's, for namespaces)."""
    argv = [sys.executable, CHILD, role, json.dumps(cfg)]
    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if popen is None:
        proc = subprocess.Popen(argv, env=child_env(), start_new_session=True, **pipes)
    else:
        proc = popen(argv, env={k: None for k in os.environ if k.startswith("PEERMESH_")},
                     **pipes)
    return Child(proc, f"{role}:{cfg.get('name', '?')}")


@pytest.fixture
def children(request: pytest.FixtureRequest) -> Callable[..., Child]:
    """``children(role, **cfg)``: a child process, closed (or killed) at the end."""
    started: list[Child] = []

    def make(role: str, **cfg: Any) -> Child:
        child = start_child(role, **cfg)
        started.append(child)
        return child

    def finish() -> None:
        for child in reversed(started):
            try:
                child.close()
            finally:
                child.kill()

    request.addfinalizer(finish)
    return make


class Loopback:
    """Channels and servers in this process on 127.0.0.1, all stopped at the end."""

    def __init__(self) -> None:
        self.channels: list[Channel] = []
        self.servers: list[Server] = []

    def channel(self, **kw: Any) -> Channel:
        kw.setdefault("address", "127.0.0.1")
        kw.setdefault("ping_interval", PING)
        channel = Channel(**kw).start()
        self.channels.append(channel)
        return channel

    def server(self, *channels: Channel, label: str = "s", services: Any = None,
               **kw: Any) -> Server:
        if services is None:
            services = [echo_service(label)]
        server = Server(channels=[c.endpoint for c in channels], services=services,
                        **kw).start()
        self.servers.append(server)
        return server

    def close(self) -> None:
        for server in self.servers:
            server.stop(0)
        for channel in self.channels:
            channel.stop()


@pytest.fixture
def loop() -> Iterator[Loopback]:
    """In-process channels and servers on loopback (stopped at the end)."""
    lb = Loopback()
    try:
        yield lb
    finally:
        lb.close()


@pytest.fixture(params=["c", "python"])
def native_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The usual requests, REPs and REQs taken by the C extension (a channel's
    ``sada_submit`` and ``sada_take``, a server's ``sada_jobs``) or by Python alone (as
    without the extension): tests using it run both ways."""
    from peermesh.sada import routing, serving
    if request.param == "python":
        monkeypatch.setattr(routing, "_take_in_c", None)
        monkeypatch.setattr(routing, "_submit_in_c", None)
        monkeypatch.setattr(serving, "_jobs_in_c", None)
    elif None in (routing._take_in_c, routing._submit_in_c, serving._jobs_in_c):
        pytest.skip("the C extension (sada_take, sada_submit, sada_jobs) is not built")
    return str(request.param)
