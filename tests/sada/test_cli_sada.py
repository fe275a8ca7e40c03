"""``peermesh serve``, ``peermesh call`` and ``peermesh services`` as real processes on lo.

Every process uses ``--interface lo`` and a free beacon port; servers are
killed in finalisers. Waits have deadlines; nothing sleeps to settle.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import START_WAIT, child_env

try:
    import lanpeers
except ImportError:  # pragma: no cover
    from .. import lanpeers  # type: ignore[no-redef]

PEERMESH = [sys.executable, "-m", "peermesh"]
RUN_TIMEOUT = 30.0


class Cli:
    """``peermesh`` commands sharing one loopback beacon port."""

    def __init__(self, port: int, tmp_path: Path) -> None:
        self.net = ["--interface", "lo", "--port", str(port), "--interval", "0.05"]
        self.env = child_env()
        self.env["PYTHONPATH"] = f"{tmp_path}:{self.env['PYTHONPATH']}"
        self.env["PYTHONIOENCODING"] = "utf-8"
        self.servers: list[lanpeers.JsonLines] = []

    def serve(self, *args: str) -> lanpeers.JsonLines:
        """``peermesh serve``; returns once it says it is serving."""
        proc = subprocess.Popen([*PEERMESH, "serve", *self.net, *args], env=self.env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        lines = lanpeers.JsonLines(proc, f"serve {' '.join(args)}")
        self.servers.append(lines)
        deadline = time.monotonic() + START_WAIT
        while not any(" serving " in line for line in lines.stderr):
            if proc.poll() is not None or time.monotonic() > deadline:
                lines.end(5)
                lines.fail("`peermesh serve` did not start serving")
            time.sleep(0.01)  # polling a condition, with a deadline
        return lines

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*PEERMESH, *args[:1], *self.net, *args[1:]], env=self.env,
                              capture_output=True, text=True, timeout=RUN_TIMEOUT,
                              stdin=subprocess.DEVNULL)

    def run_all(self, *commands: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
        """Several commands at once (each its own process); results in order."""
        with ThreadPoolExecutor(len(commands)) as pool:
            return list(pool.map(lambda args: self.run(*args), commands))

    def close(self) -> None:
        for server in self.servers:
            server.kill()


@pytest.fixture
def cli(free_udp_port: int, tmp_path: Path) -> Iterator[Cli]:
    c = Cli(free_udp_port, tmp_path)
    try:
        yield c
    finally:
        c.close()


def test_serve_call_and_services(cli: Cli) -> None:
    server = cli.serve("--name", "srv1")
    (ok, info, failed, wrong_version, bad_json, listing, table) = cli.run_all(
        ("call", "echo", "echo", '{"greeting": "hé", "n": [1, 2]}'),
        ("call", "--version", "1", "echo", "info"),
        ("call", "echo", "fail", '"boom"'),
        ("call", "--timeout", "0.5", "--version", "2", "echo", "echo"),
        ("call", "echo", "echo", "{not json"),
        ("services", "--json", "--wait", "0.5"),
        ("services", "--wait", "0.5"))
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"greeting": "hé", "n": [1, 2]}
    assert info.returncode == 0 and json.loads(info.stdout)["server"] == "srv1"
    assert failed.returncode == 1
    assert "status 500: RuntimeError: boom" in failed.stderr
    assert wrong_version.returncode == 2
    assert "in a version compatible with '2' (offered: 1.0)" in wrong_version.stderr
    assert bad_json.returncode == 2 and "PAYLOAD is not JSON" in bad_json.stderr
    assert listing.returncode == 0, listing.stderr
    (row,) = json.loads(listing.stdout)
    assert (row["service"], row["version"]) == ("echo", "1.0")
    assert [s["address"] for s in row["servers"]] == ["127.0.0.1"]
    assert [s["name"] for s in row["servers"]] == ["srv1"]
    assert table.stdout.splitlines()[0].split() == ["SERVICE", "VERSION", "SERVERS"]
    assert table.stdout.splitlines()[1].split() == ["echo", "1.0", "srv1@127.0.0.1"]
    for result in (ok, info, failed, wrong_version, bad_json, listing, table):
        assert "Traceback" not in result.stderr, result.stderr

    server.proc.send_signal(signal.SIGTERM)
    assert server.end(10) == 0
    assert not any("Traceback" in line for line in server.stderr), server.stderr


HANDLERS = '''
from peermesh.sada import Service, Reply

calc = Service("calc", "1.2")

@calc.action("add", category="math")
def add(numbers):
    return sum(numbers)

def register(server):
    @server.handler("greet", "hello", version="2.0")
    def hello(name):
        return Reply(f"hello {name}", status=201)
'''


def test_serve_handlers_from_a_module(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "myhandlers.py").write_text(textwrap.dedent(HANDLERS))
    (tmp_path / "nothing.py").write_text("x = 1\n")
    (tmp_path / "broken.py").write_text("x = (\n")
    (tmp_path / "failing.py").write_text("def register(server):\n    raise KeyError('k')\n")
    cli.serve("--handlers", "myhandlers", "--no-echo")
    add, hello, no_echo, missing, nothing, broken, failing, uncategorised = cli.run_all(
        ("call", "--version", "1.0", "--category", "math", "calc", "add", "[1, 2, 3]"),
        ("call", "greet", "hello", '"you"'),
        ("call", "--timeout", "0.3", "echo", "echo"),
        ("serve", "--handlers", "missing_module"),
        ("serve", "--handlers", "nothing"),
        ("serve", "--handlers", "broken"), ("serve", "--handlers", "failing"),
        ("call", "calc", "add", "[1]"))  # a 405 that names the category the action is in
    assert add.returncode == 0, add.stderr
    assert json.loads(add.stdout) == 6
    assert (hello.returncode, json.loads(hello.stdout)) == (0, "hello you")
    assert no_echo.returncode == 2 and "no server offers service 'echo'" in no_echo.stderr
    assert uncategorised.returncode == 1
    assert ("status 405: service 'calc' 1.2 has no action 'add'; it has 'add' in category "
            "'math'") in uncategorised.stderr
    for bad, message in ((missing, "cannot import handlers module"),
                         (nothing, "has no Service objects"),
                         (broken, "'broken': SyntaxError: '(' was never closed"),
                         (failing, "register(server) raised KeyError: 'k'")):
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr


def test_serve_and_call_without_the_mesh(cli: Cli, free_tcp_port: int) -> None:
    """``serve --channel`` points a server at a channel bound by ``call --bind``."""
    endpoint = f"tcp://127.0.0.1:{free_tcp_port}"
    other_mesh = cli.net[:3] + [str(int(cli.net[3]) + 1)] + cli.net[4:]
    proc = subprocess.Popen([*PEERMESH, "serve", *other_mesh, "--channel", endpoint, "--name",
                             "direct"], env=cli.env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    server = lanpeers.JsonLines(proc, "serve --channel")
    cli.servers.append(server)
    reply, bad = cli.run_all(("call", "--bind", endpoint, "echo", "info"),
                             ("call", "--bind", "tcp://*:5055", "echo", "echo"))
    assert reply.returncode == 0, reply.stderr
    assert json.loads(reply.stdout)["server"] == "direct"
    assert bad.returncode == 2 and "public endpoint" in bad.stderr
