"""``peermesh flux ...`` as real processes on loopback: members, RPC, events, ping, tree, errors.

Members are ``peermesh flux run`` processes (``--interface lo``, a free beacon
port); the one-shot commands join them as leaves through ``--parent`` or
through the mesh. Every wait has a deadline; processes are killed in
finalisers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cliprocess import PEERMESH, Cli, CliProcess, _report

ENDPOINT = re.compile(r"member at (tcp://127\.0\.0\.1:\d+)")

#: a handlers module for ``flux run --handlers``: plain, streaming and string answers
SERVICES = '''
import gevent


def register(flux):
    def echo(request):
        return {"rank": flux.rank, "got": request.json() if request.payload else None}

    def count(request):
        def run():
            for i in range(request.json()["count"]):
                if request.cancelled:
                    return
                request.respond({"i": i})
                gevent.sleep(0.01)
            request.end()
        gevent.spawn(run)

    flux.register("cli.echo", echo)
    flux.register("cli.count", count)
    flux.register("cli.text", lambda request: "plain words")
'''


@pytest.fixture
def cli(free_udp_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    """A ``Cli`` on a free loopback port that can import ``fluxcli_services``."""
    (tmp_path / "fluxcli_services.py").write_text(textwrap.dedent(SERVICES))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{Path.cwd()}")
    runner = Cli(free_udp_port)
    try:
        yield runner
    finally:
        runner.close()


def member(cli: Cli, *args: str) -> tuple[CliProcess, str]:
    """A ``flux run`` process once it is online: (process, its endpoint)."""
    process = cli.start("flux", "run", "--json", *args)
    line = process.expect_line(lambda s: ENDPOINT.search(s) is not None, "endpoint", "err")
    match = ENDPOINT.search(line)
    assert match is not None
    process.expect_event(event="online")
    return process, match.group(1)


def flux(cli: Cli, *args: str, parent: str = "") -> Any:
    """A one-shot ``peermesh flux`` command run to its end."""
    return cli.call("flux", *args, *(("--parent", parent) if parent else ()))


def test_members_tree_rpc_stream_and_ping_through_a_parent(cli: Cli) -> None:
    root, endpoint = member(cli, "--root", "--topology", "kary:2",
                            "--handlers", "fluxcli_services")
    one, _ = member(cli, "--parent", endpoint, "--topology", "kary:2")
    root.expect_event(event="child-attached", rank=1)

    result = flux(cli, "tree", "--json", parent=endpoint)
    assert result.returncode == 0, _report(result)
    rows = {row["rank"]: row for row in json.loads(result.stdout)}
    mine = next(rank for rank, row in rows.items() if row.get("this_command"))
    assert rows[0]["parent"] is None and rows[1]["parent"] == 0
    assert set(rows) == {0, 1, mine} and mine > 1
    assert all(row["state"] == "online" for row in rows.values())
    assert rows[0]["topology"] == "kary:2"

    result = flux(cli, "tree", parent=endpoint)        # the table, indented by depth
    assert result.returncode == 0, _report(result)
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["RANK", "PARENT", "STATE", "CHILDREN"]
    assert lines[1].split()[:3] == ["0", "-", "online"] and lines[2].startswith("  1 ")
    assert "(this command)" in result.stdout

    result = flux(cli, "rpc", "cli.echo", '{"x": [1, "two"]}', "--rank", "0", parent=endpoint)
    assert result.returncode == 0, _report(result)
    assert json.loads(result.stdout) == {"rank": 0, "got": {"x": [1, "two"]}}

    result = flux(cli, "rpc", "cli.count", '{"count": 3}', "--stream", "--json",
                  parent=endpoint)
    assert result.returncode == 0, _report(result)
    assert [json.loads(line) for line in result.stdout.splitlines()] == \
        [{"topic": "cli.count", "payload": {"i": i}} for i in range(3)]

    result = flux(cli, "rpc", "cli.text", parent=endpoint)   # ANY: up the tree to rank 0
    assert (result.returncode, result.stdout) == (0, "plain words\n"), _report(result)

    result = flux(cli, "ping", "1", "--count", "2", "--json", parent=endpoint)
    assert result.returncode == 0, _report(result)
    report = json.loads(result.stdout)
    assert [(p["rank"], p["seq"]) for p in report["pings"]] == [(1, 0), (1, 1)]
    assert report["summary"]["answered"] == 2 and report["unreachable"] == []
    assert all(p["ms"] > 0 for p in report["pings"])

    result = flux(cli, "ping", "all", parent=endpoint)  # every member but the command itself
    assert result.returncode == 0, _report(result)
    assert re.match(r"rank 0: seq=0 time=[\d.]+ ms\nrank 1: seq=0 time=[\d.]+ ms\n"
                    r"2 answered, 0 unreachable: min/mean/max = ", result.stdout), result.stdout

    claimed = cli.start("flux", "run", "--json", "--parent", endpoint, "--topology", "kary:2",
                        "--rank", "40")
    claimed.expect_event(event="online", rank=40)
    result = flux(cli, "rpc", "overlay.info", "--rank", "40", parent=endpoint)
    info = json.loads(result.stdout)
    assert info["rank"] == 40 and info["parent"] in (0, 1), _report(result)  # 19, 9, 4 vacant

    stream = cli.start("flux", "rpc", "cli.count", '{"count": 100000}', "--stream",
                       "--parent", endpoint)
    stream.expect_line(lambda s: s == '{"i": 0}', "first answer")
    assert stream.stop(signal.SIGINT) == 130, stream.describe()
    assert stream.err == ["peermesh: interrupted: waiting for the answer to cli.count"], \
        stream.describe()

    assert root.stop(signal.SIGTERM) == 0 and one.stop(signal.SIGINT) == 0


def test_pub_and_sub_with_sequence_numbers(cli: Cli) -> None:
    _, endpoint = member(cli, "--root")
    sub = cli.start("flux", "sub", "ev.", "--count", "2", "--parent", endpoint)
    sub.expect_line(lambda s: "subscribed to 'ev.'" in s, "subscribed", "err")
    for args in (("other.x",), ("ev.one",), ("ev.two", '{"n": 2}')):
        result = flux(cli, "pub", *args, "--json", parent=endpoint)
        assert result.returncode == 0, _report(result)
        assert json.loads(result.stdout)["topic"] == args[0]
    assert sub.expect_line(lambda s: True, "first event") == "2 ev.one"
    assert sub.expect_line(lambda s: True, "second event") == '3 ev.two {"n": 2}'
    assert sub.popen.wait(10) == 0, sub.describe()

    follower = cli.start("flux", "sub", "", "--json", "--parent", endpoint)
    follower.expect_line(lambda s: "subscribed to ''" in s, "subscribed", "err")
    done = subprocess.run([*PEERMESH, "flux", "pub", "any.thing", "--interface", "lo"],
                          env={**os.environ, "PEERMESH_FLUX_PARENTS": f" {endpoint} ,"},
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.stdout == "4 any.thing\n", _report(done)     # joined through the variable
    assert follower.expect_event(topic="any.thing") == {"seq": 4, "topic": "any.thing",
                                                        "payload": None}
    assert follower.stop(signal.SIGINT) == 0      # following ends normally on Ctrl-C


def test_members_and_commands_find_each_other_through_the_mesh(cli: Cli) -> None:
    first, _ = member(cli, "--priority", "5")
    second = cli.start("flux", "run", "--json")
    second.expect_event(event="online")
    result = flux(cli, "tree", "--json")
    assert result.returncode == 0, _report(result)
    rows = json.loads(result.stdout)
    assert rows[0]["rank"] == 0 and len(rows) == 3, rows
    result = flux(cli, "rpc", "overlay.info", "--rank", "1")
    assert result.returncode == 0 and json.loads(result.stdout)["parent"] == 0, _report(result)
    assert second.stop(signal.SIGTERM) == 0 and first.stop(signal.SIGTERM) == 0


@pytest.mark.parametrize("args, message", [
    (("rpc", "a.b", "{nope"), "JSON argument '{nope' is not JSON"),
    (("rpc", "a.b", "[1, 2]"), "JSON argument must be an object"),
    (("pub", "a.b", "7"), "JSON argument must be an object"),
    (("rpc", "a.b", "--rank", "-1"), "'-1' is not a rank"),
    (("ping", "first"), "'first' is not a rank"),
    (("rpc", "a.b", "--parent", "127.0.0.1:5"), "--parent '127.0.0.1:5' is not tcp://HOST:PORT"),
    (("run", "--root", "--parent", "tcp://127.0.0.1:5"), "--root and --parent exclude each other"),
    (("run", "--root", "--topology", "ring"), "topology 'ring' is not kary:K"),
    (("run", "--root", "--handlers", "no_such_module_here"),
     "cannot import handlers module 'no_such_module_here'"),
    (("tree", "--wait", "0.3"), "no member of Flux instance 'flux' found on the mesh"),
])
def test_usage_errors_are_named(cli: Cli, args: tuple[str, ...], message: str) -> None:
    result = flux(cli, *args)
    assert result.returncode == 2, _report(result)
    assert message in result.stderr, _report(result)


def test_error_answers_are_messages(cli: Cli) -> None:
    _, endpoint = member(cli, "--root")
    result = flux(cli, "rpc", "no.such", parent=endpoint)
    assert result.returncode == 1, _report(result)
    assert result.stderr.strip() == ("peermesh: error: no.such: No service matching no.such is "
                                     "registered (ENOSYS: no member serves it)")

    result = flux(cli, "tree", "--json", parent=endpoint)   # its rank is vacant once it ends
    vacant = next(r["rank"] for r in json.loads(result.stdout) if r.get("this_command"))
    result = flux(cli, "rpc", "broker.ping", "--rank", str(vacant), "--json", parent=endpoint)
    assert result.returncode == 1, _report(result)
    answer = json.loads(result.stdout)
    assert (answer["errnum"], answer["error"]) == (113, "EHOSTUNREACH")
    assert "(EHOSTUNREACH: that rank cannot be reached)" in result.stderr
    result = flux(cli, "ping", str(vacant), parent=endpoint)
    assert result.returncode == 1 and "0 answered, 1 unreachable" in result.stdout, \
        _report(result)

    result = flux(cli, "rpc", "broker.ping", "--rank", "999", parent=endpoint)
    assert result.returncode == 2, _report(result)
    assert re.search(r"rank 999 is out of range: the instance has ranks 0\.\.\d+$",
                     result.stderr.strip()), _report(result)

    result = flux(cli, "rpc", "broker.ping", "--wait", "1", parent="tcp://127.0.0.1:9")
    assert result.returncode == 1, _report(result)
    assert "could not join Flux instance 'flux' through tcp://127.0.0.1:9 within 1 s" \
        in result.stderr, _report(result)


def test_a_tree_row_keeps_only_what_a_member_may_say() -> None:
    from peermesh.flux.commands import _tree_row

    hostile = {"rank": 99, "parent": 7, "state": {"x": 1}, "children": [4, "5", -1, True, 6],
               "torpid": "all", "size": [1], "seq": 3, "topology": "kary:2", "extra": "x" * 99}
    assert _tree_row(3, 1, hostile) == {
        "rank": 3, "parent": 1, "state": "{'x': 1}", "children": [4, 6], "torpid": [],
        "size": None, "seq": 3, "topology": "kary:2"}
