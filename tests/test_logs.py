"""Logs: JSON lines with node and peer fields, and a rate a terminal can take."""

from __future__ import annotations

import io
import json
import logging
import signal
from collections.abc import Iterator

import pytest

from cliprocess import Cli
from peermesh import logs


@pytest.fixture
def clean_node() -> Iterator[None]:
    yield
    logs._node.clear()


def _record(msg: str, level: int = logging.DEBUG, *args: object, **extra: object
            ) -> logging.LogRecord:
    record = logging.LogRecord("peermesh.test", level, __file__, 1, msg, args or None, None)
    record.__dict__.update(extra)
    return record


def test_json_lines_carry_node_and_peer_fields(clean_node: None) -> None:
    logs.set_node("alice", "a" * 32)
    line = logs.JsonFormatter().format(_record("peer %s entered", logging.INFO, "bob",
                                               peer="b" * 32, peer_name="bob"))
    entry = json.loads(line)
    assert entry["message"] == "peer bob entered" and entry["level"] == "INFO"
    assert (entry["node"], entry["node_uuid"]) == ("alice", "a" * 32)
    assert (entry["peer"], entry["peer_name"]) == ("b" * 32, "bob")
    assert entry["logger"] == "peermesh.test" and entry["time"].endswith("Z")
    assert "\n" not in line


def test_json_lines_keep_exceptions_on_one_line() -> None:
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        import sys
        record = _record("failed", logging.ERROR)
        record.exc_info = sys.exc_info()
    line = logs.JsonFormatter().format(record)
    assert "\n" not in line and "ValueError" in json.loads(line)["exception"]


def test_rate_limit_holds_back_a_flood_of_one_template_and_says_so() -> None:
    now = [0.0]
    limit = logs.RateLimit(burst=3, window=10.0, clock=lambda: now[0])
    passed = [limit.filter(_record("dropped short message from %r", logging.DEBUG, i))
              for i in range(10)]
    assert passed == [True] * 3 + [False] * 7
    assert limit.filter(_record("another template"))            # counted apart
    assert limit.filter(_record("limits hit", logging.WARNING))  # warnings always pass
    now[0] = 10.0
    record = _record("dropped short message from %r", logging.DEBUG, 11)
    assert limit.filter(record)
    assert record.getMessage().endswith("(7 more like this held back)")


def test_setup_writes_json_at_the_level_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    stream = io.StringIO()
    logs.setup(1, "json", stream)
    logging.getLogger("peermesh.x").debug("not shown")
    logging.getLogger("peermesh.x").info("shown %d", 1)
    (line,) = stream.getvalue().splitlines()
    assert json.loads(line)["message"] == "shown 1"


def test_a_node_logs_enter_and_exit_as_json_with_the_peer(free_udp_port: int) -> None:
    cli = Cli(free_udp_port)
    try:
        alice = cli.start("run", "--json", "--name", "alice", "-v", "--log-format", "json")
        bob = cli.start("run", "--json", "--name", "bob")
        _, bob_uuid = bob.started()

        def about_bob(verb: str) -> object:
            def match(line: str) -> bool:
                entry = json.loads(line)  # every stderr line is one JSON object
                return (entry.get("peer") == bob_uuid and verb in entry["message"]
                        and entry.get("peer_name") == "bob" and entry.get("node") == "alice")
            return match
        alice.expect_line(about_bob("entered"), "bob's ENTER logged", "err")
        assert bob.stop(signal.SIGTERM) == 0
        alice.expect_line(about_bob("left"), "bob's EXIT logged", "err")
        assert alice.stop(signal.SIGTERM) == 0
        entries = [json.loads(line) for line in alice.err]
        assert {e["level"] for e in entries} <= {"NOTE", "INFO", "WARNING", "DEBUG"}
        assert any(e["level"] == "NOTE" and "Ctrl-C to leave" in e["message"] for e in entries)
    finally:
        cli.close()
