"""The local agent and the commands that go through it, as real processes on loopback.

Every node uses ``--interface lo`` and a free UDP beacon port; every agent
listens on a socket under the test's ``tmp_path``. Output is read line by
line with deadlines, every process is killed by a finaliser, and polling
loops are bounded. Timing is measured and printed (``-s``), never asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import msgpack
import pytest

from peermesh import __version__
from peermesh.agent import server as agent_module
from peermesh.cli import commands as cli
from peermesh.cli.fastpath import plain_agent_args
from peermesh.agent.server import AgentClient, AgentError, AgentPathError, AgentRunning

from cliprocess import PEERMESH, WAIT, CliProcess, _env, _report


def _wait_for(check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Poll ``check`` until it returns something true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            pytest.fail(f"{what} not within {timeout} s")
        time.sleep(0.02)


class Mesh:
    """Agents and nodes on one loopback beacon port, with one default agent socket."""

    def __init__(self, port: int, tmp_path: Path) -> None:
        self.port = port
        self.net = ["--interface", "lo", "--port", str(port), "--interval", "0.1"]
        self.sock = str(tmp_path / "agent.sock")
        self.processes: list[CliProcess] = []

    def start(self, *args: str) -> CliProcess:
        """A long-running command, killed at the end of the test."""
        process = CliProcess([*args, *self.net])
        self.processes.append(process)
        return process

    def agent(self, *args: str, path: Optional[str] = None) -> CliProcess:
        """An agent that has started listening (its start-up line seen)."""
        path = path or self.sock
        process = self.start("agent", "--agent", path, *args)
        process.expect_line(lambda s: f"agent at {path} (pid {process.popen.pid})" in s,
                            "agent start-up line", "err")
        return process

    def call(self, *args: str, agent: bool = True, net: Optional[bool] = None,
             timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        """A short-lived command run to completion, pointed at the mesh's agent socket.

        Node options are added unless ``net`` is False; by default not for the
        commands that only talk to an agent (they take no node options).
        """
        if net is None:
            net = args[0] not in ("join", "leave", "status")
        argv = [*PEERMESH, *args, *(["--agent", self.sock] if agent else []),
                *(self.net if net else [])]
        result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                env=_env(), timeout=timeout, encoding="utf-8",
                                errors="replace")
        assert "Traceback" not in result.stderr, result.stderr
        return result

    def client(self, path: Optional[str] = None) -> AgentClient:
        return AgentClient.connect(path or self.sock)

    def peer_names(self) -> list[str]:
        with self.client() as client:
            return [p["name"] for p in client.call("peers")]

    def close(self) -> None:
        for process in self.processes:
            process.kill()


@pytest.fixture
def mesh(free_udp_port: int, tmp_path: Path) -> Iterator[Mesh]:
    runner = Mesh(free_udp_port, tmp_path)
    try:
        yield runner
    finally:
        runner.close()


def _lines(process: CliProcess, stream: str = "err") -> str:
    return "\n".join(process.err if stream == "err" else process.out)


# --------------------------------------------------------------------------
# Paths and help


def test_default_agent_path() -> None:
    path = agent_module.default_agent_path
    assert path({"PEERMESH_AGENT": "/srv/a.sock", "XDG_RUNTIME_DIR": "/run/user/7"}) == \
        "/srv/a.sock"
    assert path({"XDG_RUNTIME_DIR": "/run/user/7"}) == "/run/user/7/peermesh/agent.sock"
    assert path({"XDG_RUNTIME_DIR": "relative"}, uid=7) == "/tmp/peermesh-7/agent.sock"
    assert path({}, uid=42) == "/tmp/peermesh-42/agent.sock"
    with pytest.raises(ValueError, match="longer than a Unix socket allows"):
        agent_module.resolve_path("/tmp/" + "x" * 200)


def test_private_tmp_directory(tmp_path: Path) -> None:
    directory = tmp_path / f"peermesh-{os.getuid()}"
    sock = str(directory / "agent.sock")
    claim = agent_module.claim_path(sock)
    try:
        assert directory.stat().st_mode & 0o777 == 0o700
        assert (directory / "agent.sock.lock").read_text().strip() == str(os.getpid())
        with pytest.raises(AgentRunning, match="an agent is already running at"):
            agent_module.claim_path(sock)  # the lock is held (flock is per open file)
    finally:
        claim.release()
    assert not (directory / "agent.sock.lock").exists()
    directory.chmod(0o755)  # e.g. made by someone else: not private
    with pytest.raises(AgentPathError, match="is not a private directory"):
        agent_module.claim_path(sock)


@pytest.mark.parametrize("command", ["agent", "join", "leave", "events", "status"])
def test_help(command: str) -> None:
    result = subprocess.run([*PEERMESH, command, "--help"], capture_output=True, env=_env(),
                            encoding="utf-8", timeout=20)
    assert result.returncode == 0, _report(result)
    text = result.stdout
    assert text.startswith(f"usage: peermesh {command}")
    assert "examples:" in text and "exit codes:" in text and "--agent PATH" in text
    assert "$XDG_RUNTIME_DIR/peermesh/agent.sock" in text
    assert ("--no-agent" in text) == (command == "events")
    assert ("--interface" in text) == (command in ("agent", "events"))


# --------------------------------------------------------------------------
# Round trips


def test_round_trips_through_the_agent(mesh: Mesh) -> None:
    bob = mesh.start("run", "--json", "--name", "bob", "--group", "chat")
    _, bob_uuid = bob.started()
    alice = mesh.agent("--name", "alice", "--group", "chat", "--header", "role=agent")
    _wait_for(lambda: mesh.peer_names() == ["bob"], "bob known to the agent")
    alice_uuid = bob.expect_event(event="ENTER", name="alice")["peer"]

    timings: dict[str, float] = {}

    def timed(name: str, *args: str) -> subprocess.CompletedProcess[str]:
        start = time.perf_counter()
        result = mesh.call(*args)
        timings[name] = time.perf_counter() - start
        return result

    result = timed("peers", "peers", "--json")
    assert result.returncode == 0, _report(result)
    (entry,) = json.loads(result.stdout)
    assert entry["peer"] == bob_uuid and entry["name"] == "bob" and entry["groups"] == ["chat"]
    assert entry["address"].startswith("tcp://127.0.0.1:")
    assert entry["state"] == "alive" and entry["broker"] is False and entry["roles"] == []
    assert entry["last_heard"] >= 0 and (entry["rtt"] is None or entry["rtt"] > 0)
    result = mesh.call("peers")
    assert result.returncode == 0, _report(result)
    assert result.stdout.splitlines()[1].split()[:2] == [bob_uuid, "bob"]
    result = mesh.call("peers", "--json", "--status", "silent")
    assert result.returncode == 0, _report(result)
    assert json.loads(result.stdout) == []

    result = timed("status", "status", "--json")
    assert result.returncode == 0, _report(result)
    info = json.loads(result.stdout)
    assert info["name"] == "alice" and info["uuid"] == alice_uuid
    assert info["headers"] == {"role": "agent"} and info["groups"] == ["chat"]
    assert info["port"] == mesh.port and info["interface"]["address"] == "127.0.0.1"
    assert info["pid"] == alice.popen.pid and info["path"] == mesh.sock
    result = mesh.call("status")
    assert result.returncode == 0, _report(result)
    rows = dict(line.split(None, 1) for line in result.stdout.splitlines())
    assert set(rows) == {"agent", "node", "interface", "groups", "headers", "peers",
                         "subscribers", "limits"}  # the words of --json
    assert rows["subscribers"] == "0" and rows["peers"] == "1"
    assert rows["limits"] == "none" and info["stats"]["peers"] == 1

    result = timed("shout", "shout", "chat", "hello wörld")
    assert result.returncode == 0, _report(result)
    assert result.stderr == "peermesh: shouted to 1 peer in group 'chat'\n"
    shout = bob.expect_event(event="SHOUT", peer=alice_uuid)
    assert shout["name"] == "alice" and shout["message"] == "hello wörld"

    result = timed("whisper", "whisper", "bob", "hi bob")
    assert result.returncode == 0, _report(result)
    assert result.stderr == f"peermesh: whispered to bob ({bob_uuid})\n"
    assert bob.expect_event(event="WHISPER", peer=alice_uuid)["message"] == "hi bob"
    result = mesh.call("whisper", bob_uuid[:6], "by prefix")
    assert result.returncode == 0, _report(result)
    assert bob.expect_event(event="WHISPER", peer=alice_uuid)["message"] == "by prefix"

    result = timed("join", "join", "news")
    assert result.returncode == 0, _report(result)
    assert result.stderr == "peermesh: alice joined group 'news'; groups: chat, news\n"
    bob.expect_event(event="JOIN", peer=alice_uuid, group="news")
    result = mesh.call("join", "news")
    assert result.returncode == 0 and "already in group 'news'" in result.stderr
    result = timed("leave", "leave", "news")
    assert result.returncode == 0, _report(result)
    assert result.stderr == "peermesh: alice left group 'news'; groups: chat\n"
    bob.expect_event(event="LEAVE", peer=alice_uuid, group="news")
    result = mesh.call("leave", "news")
    assert result.returncode == 0 and "not in group 'news'" in result.stderr

    for args in (["whisper", "", "hi"], ["shout", " ", "hi"], ["join", ""]):
        result = mesh.call(*args)  # refused as without the agent: a usage error
        assert result.returncode == 2, _report(result)
        assert "must not be empty" in result.stderr
    result = mesh.call("whisper", "nobody", "hello?", "--wait", "0.3")
    assert result.returncode == 2, _report(result)
    assert result.stderr.splitlines()[-1] == \
        "peermesh: error: no peer matching 'nobody' appeared within 0.3 s"
    result = mesh.call("shout", "ghosts", "boo", "--wait", "0.3")
    assert result.returncode == 2, _report(result)
    assert "no peer in group 'ghosts' appeared within 0.3 s" in result.stderr

    # Everything went through the agent: bob never saw another node.
    entered = {e["name"] for e in map(json.loads, bob.out) if e["event"] == "ENTER"}
    assert entered == {"alice"}

    # How long a command takes through the agent: the request alone, and the process.
    with mesh.client() as client:
        samples = []
        for _ in range(50):
            start = time.perf_counter()
            client.call("peers")
            samples.append(time.perf_counter() - start)
    start = time.perf_counter()
    subprocess.run([*PEERMESH, "--version"], capture_output=True, env=_env(), timeout=20)
    baseline = time.perf_counter() - start
    print(f"\nthrough the agent: request median {statistics.median(samples) * 1e3:.2f} ms, "
          f"max {max(samples) * 1e3:.2f} ms; whole commands "
          + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in timings.items())
          + f"; `peermesh --version` {baseline * 1e3:.0f} ms")


def test_whisper_through_the_agent_refuses_an_ambiguous_name(mesh: Mesh) -> None:
    twins = [mesh.start("run", "--json", "--name", "twin") for _ in range(2)]
    uuids = [twin.started()[1] for twin in twins]
    mesh.agent("--name", "alice")
    _wait_for(lambda: mesh.peer_names() == ["twin", "twin"], "both twins known to the agent")
    result = mesh.call("whisper", "twin", "which one?")
    assert result.returncode == 2, _report(result)
    assert "peermesh: error: 'twin' matches several peers" in result.stderr
    assert all(uuid in result.stderr for uuid in uuids)


def test_events_follow_the_agent(mesh: Mesh) -> None:
    alice = mesh.agent("--name", "alice")
    follower = mesh.start("events", "--json", "--agent", mesh.sock)
    follower.expect_line(lambda s: s.startswith("peermesh: following events of alice ("),
                         "following line", "err")
    human = mesh.start("events", "--agent", mesh.sock)
    human.expect_line(lambda s: "following events of alice" in s, "following line", "err")
    with mesh.client() as client:
        assert client.info["subscribers"] == 2

    result = mesh.call("whisper", "alice", "psst", "--no-agent", "--name", "carol", agent=False)
    assert result.returncode == 0, _report(result)
    carol = follower.expect_event(event="ENTER", name="carol")["peer"]
    whisper = follower.expect_event(event="WHISPER", peer=carol)
    assert whisper["message"] == "psst" and whisper["frames"] == [{"text": "psst"}]
    assert follower.expect_event(event="EXIT", peer=carol)["reason"] == "left"
    human.expect_line(lambda s: " WHISPER carol (" in s and s.endswith(" psst"),
                      "human-readable WHISPER line")

    assert human.stop(signal.SIGINT) == 0, human.describe()  # Ctrl-C ends following: exit 0

    assert alice.stop(signal.SIGTERM) == 0, alice.describe()
    assert not os.path.exists(mesh.sock) and not os.path.exists(mesh.sock + ".lock")
    follower.expect_line(lambda s: s == f"peermesh: error: the agent at {mesh.sock} stopped: "
                                        "its node left the mesh", "end of the stream", "err")
    assert follower.popen.wait(WAIT) == 1


def test_a_subscriber_that_goes_away_is_forgotten(mesh: Mesh) -> None:
    mesh.agent("--name", "alice")
    follower = mesh.client()
    follower.subscribe()
    with mesh.client() as client:
        assert client.call("info")["subscribers"] == 1
        follower.close()  # no goodbye: the agent notices on its next send (a heartbeat)
        _wait_for(lambda: client.call("info")["subscribers"] == 0, "subscription dropped")


def test_long_frames_and_a_client_without_pyzmq(mesh: Mesh) -> None:
    note = "n" * 70000  # a HELLO header that makes the info reply longer than one read
    alice = mesh.agent("--name", "alice", "--header", f"note={note}")
    with mesh.client() as client:
        assert client.info["headers"] == {"note": note} and client.info["name"] == "alice"
        with pytest.raises(AgentError) as caught:  # a long request frame, parsed by the agent
            client.call("join", {"group": "g" * 300})
        assert caught.value.code == "bad-args"
        assert client.call("join", {"group": "news"})["changed"] is True
    # A command through the agent loads neither pyzmq nor gevent nor the node.
    probe = ("import sys; from peermesh.cli.commands import main; code = main(sys.argv[1:]); "
             "print(sorted(m for m in ('zmq', 'gevent', 'peermesh.zre.node', 'peermesh.config') "
             "if m in sys.modules)); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", probe, "status", "--json", "--agent",
                             mesh.sock], capture_output=True, env=_env(), encoding="utf-8",
                            timeout=20)
    assert result.returncode == 0, _report(result)
    info_line, loaded = result.stdout.splitlines()
    assert json.loads(info_line)["pid"] == alice.popen.pid
    assert loaded == "[]"


_LOADED = ("argparse", "zmq", "gevent", "peermesh.zre.node", "peermesh.config",
           "peermesh.argtypes")


def test_plain_commands_skip_argparse(mesh: Mesh) -> None:
    """peers / shout / whisper in their plain form go to the agent without argparse."""
    bob = mesh.start("run", "--json", "--name", "bob", "--group", "chat")
    _, bob_uuid = bob.started()
    mesh.agent("--name", "alice", "--group", "chat")
    _wait_for(lambda: mesh.peer_names() == ["bob"], "bob known to the agent")
    probe = ("import sys; from peermesh.cli.commands import main; code = main(sys.argv[1:]); "
             f"print(sorted(m for m in {_LOADED!r} if m in sys.modules)); sys.exit(code)")

    # Were the agent lost, the fallback node must stay on loopback too.
    env = dict(_env(), PEERMESH_INTERFACE="lo", PEERMESH_PORT=str(mesh.port))

    def plain(*argv: str) -> list[str]:
        result = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True,
                                env=env, encoding="utf-8", timeout=20)
        assert result.returncode == 0 and "Traceback" not in result.stderr, _report(result)
        *out, loaded = result.stdout.splitlines()
        assert loaded == "[]", (argv, loaded)
        return out

    (line,) = plain("peers", "--json", "--agent", mesh.sock)
    assert [p["peer"] for p in json.loads(line)] == [bob_uuid]
    plain("shout", "chat", "plain shout", f"--agent={mesh.sock}")
    assert bob.expect_event(event="SHOUT", name="alice")["message"] == "plain shout"
    plain("whisper", "--agent", mesh.sock, "bob", "plain whisper")
    assert bob.expect_event(event="WHISPER", name="alice")["message"] == "plain whisper"


@pytest.mark.parametrize("argv", [
    ["peers"], ["peers", "--json"], ["peers", "--agent", "/tmp/x.sock", "--json"],
    ["shout", "chat", "hi"], ["shout", "--agent=/tmp/x.sock", "chat", "hi there"],
    ["whisper", "bob", "hi", "--agent", "/tmp/x.sock"],
])
def test_the_plain_form_reads_like_argparse(argv: list[str]) -> None:
    plain = plain_agent_args(argv)
    parsed = cli.build_parser(command_modules=False, only=argv[0]).parse_args(argv)
    assert plain is not None
    for key, value in vars(plain).items():
        assert getattr(parsed, key) == value, key
    assert {k for k in vars(parsed) if k in ("target", "message")} <= set(vars(plain))


@pytest.mark.parametrize("argv", [
    [], ["run"], ["status"], ["join", "news"], ["peers", "--wait", "1"], ["peers", "-w1"],
    ["peers", "extra"], ["shout", "chat"], ["shout", "chat", "hi", "--json"],
    ["shout", "chat", "-5"], ["whisper", "bob", "hi", "--agent"],
    ["whisper", "bob", "hi", "--agent="], ["peers", "--ag", "/tmp/x"],
    ["peers", "--interface", "lo"], ["whisper", "bob", "hi", "--", "x"], ["peers", "--help"],
])
def test_anything_else_goes_through_argparse(argv: list[str]) -> None:
    assert plain_agent_args(argv) is None


def test_a_plain_command_asks_a_silent_agent_once(tmp_path: Path, free_udp_port: int) -> None:
    """The plain path's probe is reused by argparse's path: one wait, not two."""
    path = str(tmp_path / "silent.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    server.settimeout(0.2)
    connections: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:  # accept everything, answer nothing
        while not done.is_set():
            try:
                connections.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    env = dict(_env(), PEERMESH_INTERFACE="lo", PEERMESH_PORT=str(free_udp_port))
    try:
        result = subprocess.run([*PEERMESH, "peers", "--json", "--agent", path],
                                capture_output=True, env=env, encoding="utf-8", timeout=30)
    finally:
        done.set()
        thread.join(WAIT)
        server.close()
        for conn in connections:
            conn.close()
    assert result.returncode == 0, _report(result)
    assert json.loads(result.stdout) == []
    assert "does not answer within 1 s; using a node of its own" in result.stderr
    assert len(connections) == 1


@contextlib.contextmanager
def _serve_once(path: str, reply: Optional[bytes]) -> Iterator[None]:
    """A Unix socket at ``path`` that accepts one connection, sends ``reply`` and closes it
    (None: sends nothing and keeps it open)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    server.settimeout(WAIT)
    accepted: list[socket.socket] = []

    def serve() -> None:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        accepted.append(conn)
        if reply is not None:
            conn.sendall(reply)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.close()
        thread.join(WAIT)
        for conn in accepted:
            conn.close()


@pytest.mark.parametrize("reply, message", [
    (None, "does not answer within 0.3 s"),
    (b"HTTP/1.0 400 Bad Request\r\n\r\n" + bytes(64), "answers, but not like a peermesh agent"),
    (b"", "answers, but not like a peermesh agent"),  # closes at once
])
def test_the_client_refuses_what_is_not_an_agent(tmp_path: Path, reply: Optional[bytes],
                                                 message: str) -> None:
    path = str(tmp_path / "agent.sock")
    with _serve_once(path, reply):
        start = time.monotonic()
        with pytest.raises(agent_module.NoAgent, match=message):
            AgentClient.connect(path, timeout=0.3)
        assert time.monotonic() - start < WAIT


def test_the_client_on_a_stale_or_missing_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "agent.sock")
    with pytest.raises(agent_module.NoAgent, match="no agent running at"):
        AgentClient.connect(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(path)  # the file stays; nobody listens
    with pytest.raises(agent_module.NoAgent, match="no agent running at"):
        AgentClient.connect(path)


# --------------------------------------------------------------------------
# Bad input: stale sockets, a second agent, garbage requests


def test_stale_socket_of_a_killed_agent_is_replaced(mesh: Mesh) -> None:
    first = mesh.agent("--name", "first")
    first.popen.send_signal(signal.SIGKILL)
    first.popen.wait(WAIT)
    assert Path(mesh.sock).is_socket()  # left behind

    result = mesh.call("status")
    assert result.returncode == 1, _report(result)
    assert result.stderr == (f"peermesh: error: no agent running at {mesh.sock}; start one "
                             "with `peermesh agent`\n")
    result = mesh.call("peers", "--json", "--wait", "0.2")  # falls back at once
    assert result.returncode == 0, _report(result)
    assert json.loads(result.stdout) == []

    second = mesh.agent("--name", "second")
    assert f"peermesh: removed the socket file of a dead agent at {mesh.sock}" in second.err
    with mesh.client() as client:
        assert client.info["name"] == "second" and client.info["pid"] == second.popen.pid


def test_a_second_agent_on_the_same_socket_refuses(mesh: Mesh, tmp_path: Path) -> None:
    first = mesh.agent("--name", "first")
    inode = os.stat(mesh.sock).st_ino
    result = mesh.call("agent", "--name", "second", timeout=WAIT)
    assert result.returncode == 1, _report(result)
    assert result.stderr == (f"peermesh: error: an agent is already running at {mesh.sock} "
                             f"(pid {first.popen.pid})\n")
    assert result.stdout == ""
    assert os.stat(mesh.sock).st_ino == inode
    with mesh.client() as client:
        assert client.info["pid"] == first.popen.pid

    not_a_socket = tmp_path / "file.sock"
    not_a_socket.write_text("keep me")
    result = mesh.call("agent", "--agent", str(not_a_socket), agent=False, timeout=WAIT)
    assert result.returncode == 1, _report(result)
    assert "exists and is not a socket" in result.stderr
    assert not_a_socket.read_text() == "keep me"


def test_an_agent_that_does_not_answer(mesh: Mesh) -> None:
    stuck = mesh.agent("--name", "stuck")
    stuck.popen.send_signal(signal.SIGSTOP)
    try:
        start = time.monotonic()
        result = mesh.call("peers", "--json", "--wait", "0.2", timeout=WAIT)
        assert result.returncode == 0, _report(result)
        assert json.loads(result.stdout) == []
        assert (f"peermesh: the agent at {mesh.sock} does not answer within 1 s; using a "
                "node of its own") in result.stderr
        result = mesh.call("agent", "--name", "second", timeout=WAIT)
        assert result.returncode == 1, _report(result)
        assert result.stderr == (f"peermesh: error: an agent is already running at {mesh.sock} "
                                 f"(pid {stuck.popen.pid}; it holds the lock but does not "
                                 "answer)\n")
        result = mesh.call("join", "news", timeout=WAIT)
        assert result.returncode == 1, _report(result)
        assert "does not answer within 1 s" in result.stderr
        print(f"\nthree commands against a stopped agent: {time.monotonic() - start:.1f} s")
    finally:
        stuck.popen.send_signal(signal.SIGCONT)
    with mesh.client() as client:  # and it serves again
        assert client.info["name"] == "stuck"


def test_without_an_agent(mesh: Mesh) -> None:
    bob = mesh.start("run", "--json", "--name", "bob", "--group", "chat")
    _, bob_uuid = bob.started()

    result = mesh.call("peers", "--json", "--wait", "1")
    assert result.returncode == 0, _report(result)
    assert [p["peer"] for p in json.loads(result.stdout)] == [bob_uuid]
    result = mesh.call("shout", "chat", "from dave", "--name", "dave")
    assert result.returncode == 0, _report(result)
    assert bob.expect_event(event="SHOUT", name="dave")["message"] == "from dave"

    for command in (["join", "news"], ["leave", "news"], ["status"]):
        result = mesh.call(*command)
        assert result.returncode == 1, _report(result)
        assert result.stderr == (f"peermesh: error: no agent running at {mesh.sock}; start "
                                 "one with `peermesh agent`\n")

    events = mesh.start("events", "--json", "--agent", mesh.sock, "--name", "erin")
    events.expect_line(lambda s: s == f"peermesh: no agent running at {mesh.sock}; following "
                                      "the events of a node of its own", "fallback note", "err")
    events.started()
    events.expect_event(event="ENTER", peer=bob_uuid)
    bob.expect_event(event="ENTER", name="erin")


def test_options_naming_another_mesh_bypass_the_agent(mesh: Mesh, free_tcp_port: int) -> None:
    mesh.agent("--name", "alice")
    bob = mesh.start("run", "--json", "--name", "bob")
    bob.started()
    _wait_for(lambda: mesh.peer_names() == ["bob"], "bob known to the agent")
    # free_tcp_port: some other port number, where no node beacons
    result = mesh.call("peers", "--json", "--wait", "0.3", "--interface", "lo",
                       "--port", str(free_tcp_port), net=False)
    assert result.returncode == 0, _report(result)
    assert json.loads(result.stdout) == []
    assert "no peers found within 0.3 s" in result.stderr  # a node of its own looked


class RawClient:
    """A plain Unix socket speaking the agent's frames, for requests no real client sends."""

    def __init__(self, path: str, hello: Any = {"hello": agent_module.PROTOCOL}) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(WAIT)
        self.sock.connect(path)
        self.buffer = b""
        if hello is not None:
            self.send(msgpack.packb(hello))

    def send(self, body: bytes) -> None:
        self.sock.sendall(len(body).to_bytes(4, "big") + body)

    def recv(self) -> Optional[dict]:
        """The next frame, unpacked; None when the agent closed the connection."""
        while True:
            if len(self.buffer) >= 4:
                size = int.from_bytes(self.buffer[:4], "big")
                if len(self.buffer) >= 4 + size:
                    body, self.buffer = self.buffer[4:4 + size], self.buffer[4 + size:]
                    return msgpack.unpackb(body, raw=False)
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


def test_bad_requests_get_errors_and_the_agent_keeps_serving(mesh: Mesh) -> None:
    alice = mesh.agent("--name", "alice")
    raw = RawClient(mesh.sock)
    pack = msgpack.packb
    try:
        hello = raw.recv()
        assert hello == {"hello": agent_module.PROTOCOL, "pid": alice.popen.pid,
                         "version": __version__}

        def error(body: bytes) -> tuple[str, str]:
            raw.send(body)
            reply = raw.recv()
            assert reply is not None and reply["ok"] is False, reply
            return reply["code"], reply["error"]

        assert error(b"\xc1garbage\x00\xff")[0] == "bad-request"
        assert error(b"")[0] == "bad-request"
        assert error(b"\xc0") == ("bad-request", "request must be a map {op, args}")  # nil
        assert error(b"\x91" * 5000 + b"\xc0")[0] == "bad-request"   # nested past msgpack's stack
        assert error(b"\x91" * 1000 + b"\xc0")[0] == "bad-request"   # nested within it
        assert error(pack([1, 2, 3]))[0] == "bad-request"
        assert error(pack({"op": 5}))[0] == "bad-request"
        assert error(pack({"op": "peers", "args": "all"}))[0] == "bad-request"
        code, message = error(pack({"op": "format-disk"}))
        assert code == "unknown-op" and "known: contest, events, groups, info" in message
        assert error(pack({"op": "whisper", "args": {"peer": 5, "message": "x"}}))[0] == \
            "bad-args"
        assert error(pack({"op": "whisper", "args": {"peer": "x"}}))[0] == "bad-args"
        assert error(pack({"op": "shout", "args": {"group": "g", "message": 7}}))[0] == \
            "bad-args"
        assert error(pack({"op": "peers", "args": {"wait": -1}}))[0] == "bad-args"
        assert error(pack({"op": "join", "args": {"group": "x" * 300}}))[0] == "bad-args"
        assert error(pack({"op": "events", "args": {"types": "ENTER"}}))[0] == "bad-args"
        raw.send(pack({"op": "ping", "id": "abc"}))
        reply = raw.recv()
        assert reply is not None and reply["ok"] is True and reply["id"] == "abc"
        assert reply["result"]["pid"] == alice.popen.pid
    finally:
        raw.close()

    # A frame over the limit: answered, then the connection is closed
    raw = RawClient(mesh.sock)
    try:
        assert raw.recv()["hello"] == agent_module.PROTOCOL
        limit = 64 * 1024 * 1024 + agent_module.REQUEST_OVERHEAD  # max_message's default
        raw.sock.sendall((limit + 1).to_bytes(4, "big") + b"x" * 1024)
        reply = raw.recv()
        assert reply is not None and reply["code"] == "bad-request"
        assert reply["error"] == f"a frame of {limit + 1} octets is over the limit of {limit}"
        assert raw.recv() is None
    finally:
        raw.close()

    # No handshake first: refused; not even the agent's frames: closed
    raw = RawClient(mesh.sock, hello={"op": "ping"})
    try:
        reply = raw.recv()
        assert reply is not None and reply["code"] == "bad-request"
        assert "the first message must be the handshake" in reply["error"]
        assert raw.recv() is None
    finally:
        raw.close()
    # A nil handshake: refused with an answer, not read as the end of the stream
    raw = RawClient(mesh.sock, hello=None)
    try:
        raw.send(b"\xc0")
        reply = raw.recv()
        assert reply is not None and reply["code"] == "bad-request"
        assert raw.recv() is None
    finally:
        raw.close()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as garbage:
        garbage.connect(mesh.sock)
        garbage.sendall(b"GET / HTTP/1.0\r\n\r\n" + os.urandom(512))

    with mesh.client() as client:
        assert client.call("groups") == {"joined": [], "known": [], "leaders": {}}
        with pytest.raises(AgentError) as caught:
            client.call("whisper", {"peer": "nobody", "message": b"x"})
        assert caught.value.code == "not-found"
    result = mesh.call("status")
    assert result.returncode == 0, _report(result)


def test_a_protocol_mismatch_is_a_clear_error_on_both_sides(mesh: Mesh, tmp_path: Path) -> None:
    alice = mesh.agent("--name", "alice")
    newer = agent_module.PROTOCOL + 1
    raw = RawClient(mesh.sock, hello={"hello": newer})
    try:
        reply = raw.recv()
        assert reply is not None and reply["hello"] == agent_module.PROTOCOL
        assert reply["error"] == (f"agent speaks protocol {agent_module.PROTOCOL}, this client "
                                  f"{newer}: restart the agent")
        assert raw.recv() is None
    finally:
        raw.close()
    alice.expect_line(lambda s: f"agent speaks protocol {agent_module.PROTOCOL}, this client "
                                f"{newer}: restart the agent" in s, "the agent's warning", "err")

    # The client's side: an agent that answers with another protocol number
    older = str(tmp_path / "older.sock")
    hello = msgpack.packb({"hello": 0, "pid": 4242, "version": "0.0.1",
                           "error": "agent speaks protocol 0, this client 1: restart the agent"})
    with _serve_once(older, len(hello).to_bytes(4, "big") + hello):
        with pytest.raises(agent_module.AgentMismatch) as caught:
            AgentClient.connect(older, timeout=WAIT)
    assert str(caught.value) == (f"the agent at {older} (pid 4242) speaks protocol 0, this "
                                 f"client {agent_module.PROTOCOL}: restart the agent")
    # An agent from before the handshake (ZeroMQ): its greeting starts with 0xFF
    zmtp = str(tmp_path / "zmtp.sock")
    with _serve_once(zmtp, b"\xff" + bytes(8) + b"\x7f\x03\x00NULL" + bytes(48)):
        with pytest.raises(agent_module.AgentMismatch, match="speaks protocol 0, this client"):
            AgentClient.connect(zmtp, timeout=WAIT)
    # The command line: exit 1 with the advice, no node of its own
    older = str(tmp_path / "older-cli.sock")
    with _serve_once(older, len(hello).to_bytes(4, "big") + hello):
        result = mesh.call("peers", "--agent", older, agent=False)
    assert result.returncode == 1, _report(result)
    assert result.stderr.splitlines()[-1] == (
        f"peermesh: error: the agent at {older} (pid 4242) speaks protocol 0, this client "
        f"{agent_module.PROTOCOL}: restart the agent")


def test_connections_are_bounded(mesh: Mesh) -> None:
    mesh.agent("--name", "alice")
    clients = []
    try:
        for _ in range(agent_module.MAX_CONNECTIONS):
            raw = RawClient(mesh.sock)
            assert raw.recv()["hello"] == agent_module.PROTOCOL
            clients.append(raw)
        with pytest.raises(agent_module.NoAgent) as caught:
            AgentClient.connect(mesh.sock, timeout=WAIT)
        assert str(caught.value) == (f"the agent at {mesh.sock} refused the connection: the "
                                     f"agent serves {agent_module.MAX_CONNECTIONS} clients "
                                     "already")
        clients.pop().close()
        _wait_for(lambda: _connects(mesh.sock), "a free connection slot")
    finally:
        for raw in clients:
            raw.close()


def _connects(path: str) -> bool:
    try:
        AgentClient.connect(path, timeout=WAIT).close()
        return True
    except agent_module.NoAgent:
        return False


def test_a_client_that_never_sends_its_handshake_is_closed(
        tmp_path: Path, free_udp_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Half-open connections do not pile up: no handshake within the bound, no connection."""
    import gevent
    import gevent.socket

    from peermesh.config import NodeConfig
    from peermesh.zre.node import Node

    monkeypatch.setattr(agent_module, "HANDSHAKE_TIMEOUT", 0.2)
    node = Node(config=NodeConfig(interface="lo", port=free_udp_port))
    node.start()
    claim = agent_module.claim_path(str(tmp_path / "agent.sock"))
    server = agent_module.AgentServer(node, claim).start()
    silent = gevent.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        silent.connect(claim.path)
        with gevent.Timeout(WAIT):
            assert silent.recv(1) == b""  # closed by the agent, nothing sent
        assert server.subscribers == 0 and not server._connections
    finally:
        silent.close()
        server.close()
        node.stop()
        claim.release()


def test_zyre_election_through_the_agent_and_the_cli(mesh: Mesh) -> None:
    # An agent that contests "ops" and a `run` that only takes part: both report LEADER;
    # the agent's `leader` op names the winner, `peers` marks it with *, `events` prints it.
    bob = mesh.start("run", "--json", "--name", "bob", "--group", "ops")
    _, bob_uuid = bob.started()
    alice = mesh.agent("--name", "alice", "--group", "ops", "--contest", "ops")
    follower = mesh.start("events", "--json", "--agent", mesh.sock)
    follower.expect_line(lambda s: "following events of alice" in s, "following line", "err")
    human = mesh.start("events", "--agent", mesh.sock)
    human.expect_line(lambda s: "following events of alice" in s, "following line", "err")
    with mesh.client() as client:
        alice_uuid = client.info["uuid"]
        # contesting again starts a new election now that both followers listen
        assert client.call("contest", {"group": "ops"})["contested"] == ["ops"]
    leader = bob.expect_event(event="LEADER", group="ops", peer=alice_uuid)
    assert leader["name"] == "alice"
    assert follower.expect_event(event="LEADER", group="ops", peer=alice_uuid)["name"] == "alice"
    human.expect_line(lambda s: " LEADER  alice (" in s and s.endswith("[ops]"),
                      "human-readable LEADER line")
    with mesh.client() as client:
        answer = _wait_for(lambda: client.call("leader", {"group": "ops"})["leader"],
                           "the agent's leader of ops")
        assert answer == alice_uuid
        assert client.call("leader", {"group": "ops"})["self"] is True
        assert client.call("groups")["leaders"] == {"ops": alice_uuid}
    # bob leads nothing: no * in the agent's peers; alice's own win is in `groups`
    result = mesh.call("peers", "--json")
    assert result.returncode == 0, _report(result)
    (entry,) = json.loads(result.stdout)
    assert entry["peer"] == bob_uuid and entry["leads"] == []
    assert alice.popen.poll() is None


def test_a_peer_that_leads_is_marked_in_peers(mesh: Mesh) -> None:
    bob = mesh.start("run", "--json", "--name", "bob", "--group", "ops", "--contest", "ops")
    _, bob_uuid = bob.started()
    mesh.agent("--name", "alice", "--group", "ops")
    bob.expect_event(event="LEADER", group="ops", peer=bob_uuid)
    # alice joined after bob: bob's contest started the election when alice's JOIN came

    def marked() -> bool:
        result = mesh.call("peers")
        return result.returncode == 0 and "ops*" in result.stdout
    _wait_for(marked, "bob marked as the leader of ops")
    result = json.loads(mesh.call("peers", "--json").stdout)
    assert result[0]["leads"] == ["ops"]
