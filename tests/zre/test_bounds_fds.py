"""Descriptor exhaustion: idle TCP connections to a node's mailbox must not starve it.

1,100 idle connections made a node at a 1,024-descriptor limit spin at ~100%
CPU (libzmq retries a failing ``accept`` at once, for ever) and refuse new
peers. Here, the same shape made small: a node in a child process with a
256-descriptor limit (so at most 96 mailbox connections), 300 idle
connections from this process, then a real newcomer.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest

from peermesh.wire import zre

try:  # tests/ as a package
    from ..rawpeer import RawPeer
    from ..waiting import poll_until
except ImportError:  # tests/ on sys.path (pytest's default "prepend" import mode)
    from rawpeer import RawPeer
    from waiting import poll_until

LIMIT = 256  # the child's RLIMIT_NOFILE
CAP = (LIMIT - 64) // 2  # the mailbox's connections: half the descriptors beyond a reserve
IDLE = 300
WAIT = 10.0

CHILD = textwrap.dedent("""
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (%d, %d))  # hard too: a node raises soft to hard
    from peermesh import ThreadedNode
    node = ThreadedNode("fds", interface="lo", discovery=(), port=%d).start()
    print(json.dumps({"endpoint": node.endpoint}), flush=True)
    for line in sys.stdin:  # one line asks for the stats
        print(json.dumps(node.stats()), flush=True)
    node.stop()
""")


class Child:
    """The node in its own process, asked for its stats over stdin/stdout."""

    def __init__(self, beacon_port: int) -> None:
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        self.process = subprocess.Popen([sys.executable, "-c",
                                         CHILD % (LIMIT, LIMIT, beacon_port)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env=env)
        self.endpoint = self._read()["endpoint"]

    def _read(self) -> Any:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"the child ended (status {self.process.poll()})"
        return json.loads(line)

    def stats(self) -> dict[str, int]:
        assert self.process.stdin is not None
        self.process.stdin.write("stats\n")
        self.process.stdin.flush()
        return self._read()

    def descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def child(free_udp_port: int) -> Iterator[Child]:
    node = Child(free_udp_port)
    yield node
    node.close()


def test_idle_connections_are_shed_and_a_newcomer_gets_in(child: Child) -> None:
    host, port = child.endpoint[6:].rsplit(":", 1)
    idle = []
    try:
        for _ in range(IDLE):  # not waiting: the listen backlog may be full for a while
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex((host, int(port)))
            idle.append(sock)
        with RawPeer(name="newcomer") as newcomer:
            newcomer.connect(child.endpoint)
            newcomer.hello()
            assert newcomer.expect(zre.Hello, timeout=WAIT).sequence == 1  # it got in
        assert child.descriptors() < LIMIT - 16, "the node ran (nearly) out of descriptors"
        stats = poll_until(lambda: (s := child.stats())["connections_shed"] >= IDLE - CAP - 100
                           and s, WAIT, "the node to shed idle connections")
        assert stats["connections"] <= CAP + 100, stats  # (a burst may be in flight)
        assert stats["peers"] == 1, stats
    finally:
        for sock in idle:
            sock.close()
