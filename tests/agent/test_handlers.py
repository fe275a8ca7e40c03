"""Event handlers: the ``--handler`` syntax, what a command gets, and the bounds (a slow
command, a failing one, 1,000 events in a burst), with real processes; then the agent
running a handler on a real ENTER and EXIT."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import gevent
import pytest

from peermesh.agent.handlers import (HandlerRunner, HandlerSpec, handler_environment,
                                     parse_handler)
from peermesh.events import Event, EventType

from childprocs import alive as _alive
from cliprocess import PEERMESH, WAIT, CliProcess, _env
from waiting import poll_until


def _event(kind: EventType = EventType.ENTER, name: str = "bob", **fields: Any) -> Event:
    return Event(kind, fields.pop("peer", uuid.uuid4()), name, **fields)


def _drained(runner: HandlerRunner, timeout: float = WAIT) -> dict[str, Any]:
    """The runner's stats once nothing is queued or running."""
    def idle() -> Any:
        stats = runner.stats()
        return stats if not stats["queued"] and not stats["running"] else None
    return poll_until(idle, timeout, "the handlers to finish", sleep=gevent.sleep)


# --------------------------------------------------------------------------
# Syntax


@pytest.mark.parametrize("text, command, selects", [
    ("echo hi", "echo hi", None),
    ("echo a=b", "echo a=b", None),                     # a space before the '=': a command
    ("ENTER,EXIT=/usr/local/bin/update-hosts", "/usr/local/bin/update-hosts",
     {("ENTER", None), ("EXIT", None)}),
    ("shout:alerts,leave=notify", "notify", {("SHOUT", "alerts"), ("LEAVE", None)}),
    ("LEADER:web=reload", "reload", {("LEADER", "web")}),
    ("*=A=1 cmd", "A=1 cmd", None),                     # a command starting with NAME=
])
def test_parse_handler(text: str, command: str, selects: Any) -> None:
    spec = parse_handler(text)
    assert spec.command == command
    assert spec.selects == (None if selects is None else frozenset(selects))


@pytest.mark.parametrize("text, says", [
    ("FOO=bar", "unknown event 'FOO'"),
    ("ENTER:g=x", "ENTER events have no group"),
    ("ENTER=", "no command"),
    ("", "needs a command"),
])
def test_parse_handler_refuses(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_handler(text)


def test_selection() -> None:
    spec = parse_handler("SHOUT:alerts,EXIT=x")
    assert spec.matches("SHOUT", "alerts") and spec.matches("EXIT", None)
    assert not spec.matches("SHOUT", "chat") and not spec.matches("ENTER", None)
    every = HandlerSpec("x")
    assert every.matches("LEADER", "g") and every.matches("WHISPER", None)
    assert not every.matches("STOP", None)


def test_environment_from_remote_strings_is_clean() -> None:
    peer = uuid.uuid4()
    env = handler_environment(_event(EventType.SHOUT, "b\0ob", peer=peer, group="g",
                                      headers={"role": "db"}, address="tcp://1.2.3.4:5",
                                      frames=(b"a", b"b")), "me", "ab" * 16)
    assert env["PEERMESH_PEER_NAME"] == "bob"
    assert env["PEERMESH_PEER_UUID"] == peer.hex
    assert env["PEERMESH_GROUP"] == "g" and env["PEERMESH_FRAMES"] == "2"
    assert env["PEERMESH_PEER_HEADERS"] == '{"role": "db"}'
    assert env["PEERMESH_REASON"] == ""
    huge = handler_environment(_event(headers={"x": "y" * 100_000}, name="n" * 100_000))
    assert huge["PEERMESH_PEER_HEADERS"] == ""
    assert len(huge["PEERMESH_PEER_NAME"]) == 16384


# --------------------------------------------------------------------------
# Runs


def test_command_gets_the_event_and_the_payload(tmp_path: Path) -> None:
    out = tmp_path / "out"
    runner = HandlerRunner([parse_handler(
        f'SHOUT:chat=printf "%s|%s|%s|%s|" "$PEERMESH_EVENT" "$PEERMESH_PEER_NAME" '
        f'"$PEERMESH_GROUP" "$PEERMESH_NODE_NAME" > {out}; cat >> {out}')],
        node_name="alice").start()
    try:
        assert runner.submit(_event(EventType.SHOUT, "bob", group="other",
                                    frames=(b"no",))) == 0
        assert runner.submit(_event(EventType.SHOUT, "bob", group="chat",
                                    frames=(b"hello ", b"world"))) == 1
        stats = _drained(runner)
    finally:
        runner.close()
    assert out.read_text() == "SHOUT|bob|chat|alice|hello world"
    assert stats["started"] == stats["succeeded"] == 1


def test_failing_command_is_counted_and_its_output_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "peermesh.agent.handlers")
    runner = HandlerRunner([parse_handler('echo "cannot reach $PEERMESH_PEER_NAME" >&2; '
                                          'test "$PEERMESH_PEER_NAME" = good')]).start()
    try:
        runner.submit(_event(name="bad"))
        runner.submit(_event(name="good"))
        stats = _drained(runner)
    finally:
        runner.close()
    assert (stats["failed"], stats["succeeded"]) == (1, 1)
    text = caplog.text
    assert "cannot reach bad" in text and "cannot reach good" in text
    assert "exited with status 1" in text


def test_slow_command_is_ended_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    done = tmp_path / "done"
    runner = HandlerRunner([parse_handler(
        f'ENTER=sleep 60 & echo $! > {pidfile}; wait'), parse_handler(f"EXIT=touch {done}")],
        timeout=3.0).start()
    try:
        runner.submit(_event(EventType.ENTER))
        runner.submit(_event(EventType.EXIT))    # another handler: not held up
        poll_until(lambda: runner.stats()["succeeded"] == 1, WAIT, "the EXIT handler",
                   sleep=gevent.sleep)
        assert done.exists()
        assert runner.stats()["timed_out"] == 0   # the slow one still runs
        stats = _drained(runner)
    finally:
        runner.close()
    assert stats["timed_out"] == 1 and stats["succeeded"] == 1
    child = int(pidfile.read_text())
    poll_until(lambda: not _alive(child), WAIT, "the handler's child to end",
               sleep=gevent.sleep)


@pytest.mark.slow
def test_burst_of_1000_events_within_the_queue(tmp_path: Path) -> None:
    out = tmp_path / "out"
    runner = HandlerRunner([parse_handler(f'echo "$PEERMESH_PEER_NAME" >> {out}')]).start()
    try:
        for i in range(1000):
            runner.submit(_event(name=f"p{i}"))
        # submit never waits: nothing ran yet, everything is queued
        assert runner.stats()["queued"] == 1000 and runner.stats()["started"] == 0
        stats = _drained(runner, 120)
    finally:
        runner.close()
    assert (stats["succeeded"], stats["dropped"]) == (1000, 0)
    assert out.read_text().split() == [f"p{i}" for i in range(1000)]   # in order


def test_burst_beyond_the_queue_is_dropped_and_counted(tmp_path: Path) -> None:
    out = tmp_path / "out"
    runner = HandlerRunner([parse_handler(f'echo "$PEERMESH_PEER_NAME" >> {out}')],
                           queue=10, concurrency=2).start()
    try:
        taken = sum(runner.submit(_event(name=f"p{i}")) for i in range(1000))
        assert taken == 10
        assert runner.stats()["dropped"] == 990
        stats = _drained(runner)
    finally:
        runner.close()
    assert stats["succeeded"] == 10
    assert sorted(out.read_text().split()) == sorted(f"p{i}" for i in range(10))


def test_close_ends_running_commands(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    runner = HandlerRunner([parse_handler(f"echo $$ > {pidfile}; exec sleep 60")]).start()
    runner.submit(_event())
    poll_until(lambda: pidfile.exists() and pidfile.read_text().strip(), WAIT,
               "the handler to start", sleep=gevent.sleep)
    runner.close()
    assert not _alive(int(pidfile.read_text()))


# --------------------------------------------------------------------------
# In the agent


def test_agent_runs_handlers_on_enter_and_exit(free_udp_port: int, tmp_path: Path) -> None:
    import json
    import signal
    import subprocess
    import sys

    out = tmp_path / "events"
    peers_file = tmp_path / "peers"
    sock = str(tmp_path / "agent.sock")
    net = ["--interface", "lo", "--port", str(free_udp_port), "--interval", "0.1"]
    agent = CliProcess(["agent", "--agent", sock, *net, "--handler",
                        f'ENTER,EXIT=echo "$PEERMESH_EVENT $PEERMESH_PEER_NAME" >> {out}',
                        "--handler", "JOIN=exit 4", "--handler",
                        f"ENTER={sys.executable} -m peermesh peers --json > {peers_file}.new "
                        f"&& mv {peers_file}.new {peers_file}"])
    peer = None
    try:
        agent.expect_line(lambda s: "agent at" in s, "agent start-up line", "err")
        peer = CliProcess(["run", "--name", "bob", "--group", "chat", *net])
        poll_until(lambda: out.exists() and "ENTER bob" in out.read_text(), WAIT,
                   "the ENTER handler")
        # a command in a handler reaches this agent (PEERMESH_AGENT), which knows bob
        poll_until(peers_file.exists, WAIT, "the handler that asks the agent")
        assert [p["name"] for p in json.loads(peers_file.read_text())] == ["bob"]
        assert peer.stop(signal.SIGTERM) == 0
        poll_until(lambda: "EXIT bob" in out.read_text(), WAIT, "the EXIT handler")
        status = subprocess.run([*PEERMESH, "status", "--agent", sock, "--json"],
                                capture_output=True, env=_env(), timeout=WAIT, text=True)
        handlers = json.loads(status.stdout)["hooks"]["handlers"]
        assert handlers["succeeded"] == 3 and handlers["failed"] == 1
        human = subprocess.run([*PEERMESH, "status", "--agent", sock], capture_output=True,
                               env=_env(), timeout=WAIT, text=True).stdout
        assert "succeeded=3 failed=1" in human
    finally:
        if peer is not None:
            peer.kill()
        agent.kill()
    assert out.read_text().splitlines() == ["ENTER bob", "EXIT bob"]


def test_agent_refuses_a_bad_handler_in_one_line() -> None:
    import subprocess

    result = subprocess.run([*PEERMESH, "agent", "--interface", "lo", "--handler", "ENTRE=x"],
                            capture_output=True, env=_env(), timeout=WAIT, text=True)
    assert result.returncode == 2
    assert "unknown event 'ENTRE'" in result.stderr and "Traceback" not in result.stderr
