"""The agent's socket is private whatever the umask, and floods of connections do not end it.

The descriptor flood runs the agent in a child process whose descriptor limit
is lowered (``RLIMIT_NOFILE``), as a bounded version of 1,100 half-open
connections against the usual limit of 1,024.
"""

from __future__ import annotations

import os
import resource
import socket
import stat
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

from peermesh.agent import server as agent_module
from peermesh.agent.server import AgentClient, AgentPathError
from peermesh.config import NodeConfig
from peermesh.errors import PeermeshError
from peermesh.zre.node import Node

from childprocs import terminate
from cliprocess import PEERMESH, WAIT, CliProcess, _env
from waiting import poll_until

NOBODY = 65534
LIMIT = 160          # descriptors of the flooded agent: the node needs ~20, and 64 spare
FLOOD = 300          # half-open connections: more than LIMIT


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _serve(path: str, port: int) -> tuple[Node, agent_module.AgentClaim, agent_module.AgentServer]:
    node = Node(config=NodeConfig(interface="lo", port=port))
    node.start()
    claim = agent_module.claim_path(path)
    return node, claim, agent_module.AgentServer(node, claim).start()


def test_socket_and_directory_are_private_whatever_the_umask(
        tmp_path: Path, free_udp_port: int, umask_000: None) -> None:
    directory = tmp_path / "run" / "peermesh"
    node, claim, server = _serve(str(directory / "agent.sock"), free_udp_port)
    try:
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert stat.S_IMODE(os.stat(claim.path).st_mode) == 0o600
    finally:
        server.close()
        node.stop()
        claim.release()


@pytest.mark.parametrize("mode", [0o777, 0o750, 0o701])
def test_a_directory_open_to_others_is_refused(tmp_path: Path, mode: int,
                                               umask_000: None) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(mode)
    with pytest.raises(AgentPathError) as caught:
        agent_module.claim_path(str(directory / "agent.sock"))
    message = str(caught.value)
    assert f"mode {mode:04o}" in message and "mode 0700" in message and str(directory) in message
    assert not (directory / "agent.sock").exists()


def test_a_link_instead_of_a_directory_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(AgentPathError, match="link or file"):
        agent_module.claim_path(str(tmp_path / "link" / "agent.sock"))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_directory_of_another_user_is_refused_and_nobody_reaches_the_socket(
        tmp_path: Path, free_udp_port: int) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(AgentPathError, match=f"owner uid {NOBODY}"):
        agent_module.claim_path(str(theirs / "agent.sock"))
    # the attack as it was: user nobody connecting to the agent's socket
    tmp_path.chmod(0o755)    # nobody may walk to the directory, not into it
    node, claim, server = _serve(str(tmp_path / "mine" / "agent.sock"), free_udp_port)
    try:
        probe = ("import socket, sys\n"
                 "s = socket.socket(socket.AF_UNIX)\n"
                 "try:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n"
                 "    sys.exit(13)\n")
        result = subprocess.run(["python3", "-c", probe, claim.path], user=NOBODY,
                                group=NOBODY, timeout=WAIT, capture_output=True)
        assert result.returncode == 13, result.stderr
    finally:
        server.close()
        node.stop()
        claim.release()


def _limited(soft: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, soft))


def test_half_open_connections_past_the_descriptor_limit_do_not_end_the_agent(
        tmp_path: Path, free_udp_port: int) -> None:
    """A child agent allowed LIMIT descriptors; FLOOD connections that never say hello. The
    agent goes on, and its node still takes a new peer while the flood is held."""
    path = str(tmp_path / "agent.sock")
    net = ["--interface", "lo", "--port", str(free_udp_port), "--interval", "0.1"]
    agent = subprocess.Popen([*PEERMESH, "agent", "--agent", path, "--name", "held", *net],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env=_env(), start_new_session=True,
                             preexec_fn=lambda: _limited(LIMIT))
    flood: list[socket.socket] = []
    newcomer = None
    try:
        _wait(lambda: os.path.exists(path) and _answers(path), "the agent to answer")
        flood.extend(_half_open(path, FLOOD))
        newcomer = CliProcess(["run", "--name", "newcomer", *net])   # the node must connect
        # the agent takes connections in order: one behind the flood answered (served or
        # "busy") means it went through the flood
        _wait(lambda: agent.poll() is not None or _answers(path, busy_too=True),
              "the agent to go through the flood")
        assert agent.poll() is None, agent.stderr.read().decode() if agent.stderr else ""
        newcomer.expect_line(lambda line: "ENTER" in line and " held " in line,
                             "newcomer to meet the agent's node during the flood")
        for sock in flood:
            sock.close()
        flood.clear()
        _wait(lambda: _answers(path, "newcomer"), "the agent to serve again")
        assert agent.poll() is None and os.path.exists(path)
    finally:
        for sock in flood:
            sock.close()
        if newcomer is not None:
            newcomer.kill()
        terminate(agent, WAIT)


def _half_open(path: str, count: int, within: float = 5.0) -> list[socket.socket]:
    """Up to ``count`` connections to ``path`` that never send a byte (connecting again
    while the listen backlog is full, for up to ``within`` seconds)."""
    import time

    made: list[socket.socket] = []
    deadline = time.monotonic() + within
    while len(made) < count and time.monotonic() < deadline:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(path)
        except OSError:     # the backlog is full (EAGAIN): wait for the agent to take some
            sock.close()
            time.sleep(0.01)
            continue
        made.append(sock)
    return made


def _answers(path: str, peer: str = "", busy_too: bool = False) -> bool:
    """True if the agent at ``path`` serves a client (and knows ``peer``); with
    ``busy_too``, also if it refuses one for having too many."""
    try:
        with AgentClient.connect(path, timeout=1.0) as client:
            return not peer or peer in [p["name"] for p in client.call("peers")]
    except PeermeshError as exc:
        return busy_too and "clients already" in str(exc)


def _wait(predicate: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    poll_until(predicate, timeout, what, step=0.05)
