"""``peermesh flux ...`` as real processes on loopback: members, RPC, events, ping, tree, errors.

Members are ``peermesh flux run`` processes (``--interface lo``, a free beacon
port); the one-shot commands are rankless clients of a member found through
``--parent`` or through the mesh. Every wait has a deadline; processes are killed in
finalisers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
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
    one, one_endpoint = member(cli, "--parent", endpoint, "--topology", "kary:2")
    root.expect_event(event="child-attached", rank=1)

    result = flux(cli, "tree", "--json", parent=endpoint)
    assert result.returncode == 0, _report(result)
    rows = {row["rank"]: row for row in json.loads(result.stdout)}
    assert rows[0]["parent"] is None and rows[1]["parent"] == 0
    assert set(rows) == {0, 1}                         # the command took no rank
    assert all(row["state"] == "online" for row in rows.values())
    assert rows[0]["topology"] == "kary:2" and rows[0]["clients"] == 1

    result = flux(cli, "tree", parent=endpoint)        # the table, indented by depth
    assert result.returncode == 0, _report(result)
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["RANK", "PARENT", "STATE", "CHILDREN"]
    assert lines[1].split()[:3] == ["0", "-", "online"] and lines[2].startswith("  1 ")
    assert len(lines) == 3

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

    # flux ping's options and output: -c count, -i interval, -p pad, -u userid, header line
    result = flux(cli, "ping", "-c", "2", "-i", "0.01", "-p", "3", "-u", "1", parent=endpoint)
    assert result.returncode == 0, _report(result)
    lines = result.stdout.splitlines()
    assert lines[0] == "flux-ping 1!broker" and len(lines) == 3, result.stdout
    for seq, line in enumerate(lines[1:]):
        assert re.fullmatch(rf"1!broker\.ping pad=3 userid=\d+ rolemask=0x[0-9a-f]+ "
                            rf"seq={seq} time=[\d.]+ ms \([0-9a-f]{{8}}!\^!(\^!)?[0-9a-f]{{8}}\)",
                            line), line
    result = flux(cli, "ping", "-c", "1", "any", parent=endpoint)
    assert result.returncode == 0 and result.stdout.splitlines()[0] == "flux-ping any!broker"
    assert re.match(r"\d!broker\.ping pad=0 seq=0 time=", result.stdout.splitlines()[1])
    result = flux(cli, "ping", "-c", "1", "0!nosuch", parent=endpoint)
    assert result.returncode == 1 and "0!nosuch.ping: " in result.stderr, _report(result)

    result = flux(cli, "ping", "all", "--summary", parent=endpoint)  # the command is none
    assert result.returncode == 0, _report(result)
    assert re.match(r"flux-ping all!broker\n0!broker\.ping pad=0 seq=0 time=[\d.]+ ms \(.*\)\n"
                    r"1!broker\.ping pad=0 seq=0 time=[\d.]+ ms \(.*\)\n"
                    r"2 answered, 0 unreachable: min/mean/max = ", result.stdout), result.stdout

    result = flux(cli, "rpc", "peermesh.info", "--rank", "0", parent=endpoint)
    assert json.loads(result.stdout)["size"] == 2, _report(result)  # for all those commands

    claimed = cli.start("flux", "run", "--json", "--parent", endpoint, "--topology", "kary:2",
                        "--rank", "30")
    claimed.expect_event(event="online", rank=30)
    # through rank 1, which knows the size it joined (2): the range is rank 0's
    result = flux(cli, "rpc", "peermesh.info", "--rank", "30", parent=one_endpoint)
    info = json.loads(result.stdout)
    assert info["rank"] == 30 and info["parent"] == 0, _report(result)  # 14, 6, 2 vacant

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
    assert sub.expect_line(lambda s: True, "first event") == "ev.one\t"
    assert sub.expect_line(lambda s: True, "second event") == 'ev.two\t{"n": 2}'
    assert sub.popen.wait(10) == 0, sub.describe()

    follower = cli.start("flux", "sub", "", "--json", "--parent", endpoint)
    follower.expect_line(lambda s: "subscribed to ''" in s, "subscribed", "err")
    done = subprocess.run([*PEERMESH, "flux", "pub", "-s", "any.thing", "--interface", "lo"],
                          env={**os.environ, "PEERMESH_FLUX_PARENTS": f" {endpoint} ,"},
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.stdout == "seq=4\n", _report(done)     # joined through the variable
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
    assert [row["rank"] for row in rows] == [0, 1] and rows[0]["clients"] == 1, rows
    result = flux(cli, "rpc", "peermesh.info", "--rank", "1")
    assert result.returncode == 0 and json.loads(result.stdout)["parent"] == 0, _report(result)
    assert second.stop(signal.SIGTERM) == 0 and first.stop(signal.SIGTERM) == 0


def test_commands_take_only_members_inside_the_peer_networks(cli: Cli) -> None:
    """A one-shot command leaves out members whose endpoint is outside --peer-network."""
    process, _ = member(cli)
    result = flux(cli, "tree", "--wait", "1", "--peer-network", "10.0.0.0/8")
    assert result.returncode == 2, _report(result)
    assert "no member of Flux instance 'flux' found on the mesh" in result.stderr, \
        _report(result)
    result = flux(cli, "tree", "--json", "--peer-network", "127.0.0.0/8")
    assert result.returncode == 0 and len(json.loads(result.stdout)) == 1, _report(result)
    assert process.stop(signal.SIGTERM) == 0


@pytest.mark.parametrize("args, message", [
    (("tree", "--peer-network", "10.0.0.0/33"), "'10.0.0.0/33' is not a network"),
    (("rpc", "a.b", "{nope"), "JSON argument '{nope' is not JSON"),
    (("rpc", "a.b", "[1, 2]"), "JSON argument must be an object"),
    (("pub", "a.b", "7"), "JSON argument must be an object"),
    (("rpc", "a.b", "--rank", "-1"), "'-1' is not a rank"),
    (("ping", "1!a.b"), "a service is one word"),
    (("ping", "x!broker"), "invalid nodeid: 'x'"),
    (("ping", "-b", "1"), "--batch needs --count"),
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

    gone, _ = member(cli, "--parent", endpoint)      # rank 1, vacant once it has left
    assert gone.stop(signal.SIGTERM) == 0
    vacant = 1
    result = flux(cli, "rpc", "broker.ping", "--rank", str(vacant), "--json", parent=endpoint)
    assert result.returncode == 1, _report(result)
    answer = json.loads(result.stdout)
    assert (answer["errnum"], answer["error"]) == (113, "EHOSTUNREACH")
    assert "(EHOSTUNREACH: that rank cannot be reached)" in result.stderr
    result = flux(cli, "ping", str(vacant), "--summary", parent=endpoint)
    assert result.returncode == 1 and "0 answered, 1 unreachable" in result.stdout, \
        _report(result)

    result = flux(cli, "rpc", "broker.ping", "--rank", "999", parent=endpoint)
    assert result.returncode == 2, _report(result)
    assert re.search(r"rank 999 is out of range: the instance has ranks 0\.\.\d+$",
                     result.stderr.strip()), _report(result)

    result = flux(cli, "rpc", "broker.ping", "--wait", "1", parent="tcp://127.0.0.1:9")
    assert result.returncode == 1, _report(result)
    assert "could not connect to Flux instance 'flux' through tcp://127.0.0.1:9 within 1 s" \
        in result.stderr, _report(result)


def test_a_tree_row_keeps_only_what_a_member_may_say() -> None:
    from peermesh.flux.commands import _tree_row

    hostile = {"rank": 99, "parent": 7, "state": {"x": 1}, "children": [4, "5", -1, True, 6],
               "torpid": "all", "size": [1], "seq": 3, "topology": "kary:2", "extra": "x" * 99}
    assert _tree_row(3, 1, hostile) == {
        "rank": 3, "parent": 1, "state": "{'x': 1}", "children": [4, 6], "torpid": [],
        "size": None, "seq": 3, "topology": "kary:2", "clients": None}


def test_building_the_parser_does_not_import_the_overlay() -> None:
    code = textwrap.dedent("""
        import sys
        from peermesh.cli.commands import build_parser
        build_parser()
        loaded = sorted(m for m in ("peermesh.flux.overlay", "peermesh.flux.core",
                                    "peermesh.flux.handle") if m in sys.modules)
        from peermesh.flux import FluxOverlay, FluxSettings
        import peermesh.flux
        print(loaded, FluxOverlay.__name__, FluxSettings.__name__,
              sorted(peermesh.flux.__all__) == sorted(set(peermesh.flux.__all__)))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(Path.cwd())})
    assert done.stdout.split() == ["[]", "FluxOverlay", "FluxSettings", "True"], \
        _report(done)


def test_a_root_restarted_at_its_endpoint_is_rejoined(cli: Cli, free_tcp_port: int) -> None:
    root, endpoint = member(cli, "--root", "--tree-port", str(free_tcp_port))
    assert endpoint == f"tcp://127.0.0.1:{free_tcp_port}"
    one, _ = member(cli, "--parent", endpoint)                      # rank 1
    result = flux(cli, "run", "--root", "--endpoint", endpoint)     # taken: a message
    assert result.returncode == 1, _report(result)                  # a runtime failure
    assert f"cannot bind {endpoint}: the address is in use" in result.stderr, _report(result)

    assert root.stop(signal.SIGTERM) == 0
    one.expect_event(event="parent-lost")
    again, _ = member(cli, "--root", "--endpoint", endpoint)
    # (a join sent while the old root was closing is tried again after hello_timeout, 5 s)
    again.expect_event(timeout=30, event="child-attached", rank=1)
    one.expect_event(timeout=30, event="online", rank=1)            # its rank kept
    result = flux(cli, "rpc", "peermesh.info", "--rank", "1", parent=endpoint)
    assert json.loads(result.stdout)["parent"] == 0, _report(result)
    assert one.stop(signal.SIGTERM) == 0 and again.stop(signal.SIGTERM) == 0


@pytest.mark.parametrize("args, message", [
    (("--endpoint", "127.0.0.1:5"), "cannot bind 127.0.0.1:5: not TRANSPORT://ADDRESS"),
    (("--endpoint", "tcp://127.0.0.1:1", "--tree-port", "2"),
     "--endpoint and --tree-port exclude each other"),
    (("--tree-port", "70000"), "'70000' is not a port (1-65535)"),
])
def test_a_run_endpoint_that_cannot_be_used_is_named(cli: Cli, args: tuple[str, ...],
                                                     message: str) -> None:
    result = flux(cli, "run", "--root", *args)
    assert result.returncode == 2, _report(result)
    assert message in result.stderr, _report(result)


def test_ping_all_lists_a_killed_rank_and_a_joining_member_takes_the_roots_kary(
        cli: Cli) -> None:
    root, endpoint = member(cli, "--root", "--topology", "kary:2")
    process = cli.start("flux", "run", "--json", "--parent", endpoint)  # default kary:32
    line = process.expect_line(lambda s: ENDPOINT.search(s) is not None, "endpoint", "err")
    assert "kary:32" not in line and "(the topology of rank 0)" in line, line
    assert process.expect_event(event="online")["detail"]["topology"] == "kary:2"
    other, _ = member(cli, "--parent", endpoint)
    process.kill()                                   # kill -9: it says no goodbye
    root.expect_event(event="child-lost", rank=1)
    result = flux(cli, "ping", "all", "--json", parent=endpoint)
    assert result.returncode == 1, _report(result)
    report = json.loads(result.stdout)
    assert [p["rank"] for p in report["pings"]] == [0, 2]
    assert [u["rank"] for u in report["unreachable"]] == [1]
    assert root.stop(signal.SIGTERM) == 0 and other.stop(signal.SIGINT) == 0
