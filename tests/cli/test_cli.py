"""The ``peermesh`` command, run as real processes on loopback.

Every node is started with ``--interface lo`` and a free UDP beacon port, so
nothing reaches a real network. Output is read line by line with deadlines;
every process is killed by a finaliser, also when a test fails.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import time
from typing import Any, Optional
from uuid import UUID

import pytest

from cliprocess import Cli, _report



# --------------------------------------------------------------------------
# Help


@pytest.mark.parametrize("command", [None, "run", "peers", "shout", "whisper"])
def test_help(cli: Cli, command: Optional[str]) -> None:
    result = cli.call(*([command] if command else []), "--help", net=False)
    assert result.returncode == 0, _report(result)
    text = result.stdout
    assert text.startswith(f"usage: peermesh{' ' + command if command else ''}")
    assert "examples:" in text and "exit codes:" in text
    if command is None:
        assert all(name in text for name in ("run", "peers", "shout", "whisper"))
        return
    for option in ("--interface", "--port", "--interval", "--evasive", "--expired", "--name",
                   "--header", "--group", "--config", "--verbose", "default: 5670",
                   "--seed HOST[:PORT]", "--discovery SOURCES", "--mdns", "$PEERMESH_SEEDS",
                   "$PEERMESH_DISCOVERY"):
        assert option in text, option
    if command in ("run", "peers"):
        assert "--json" in text
    if command != "run":
        assert "--wait" in text


# --------------------------------------------------------------------------
# run, shout, whisper, peers


def test_run_json_sees_shout_and_whispers(cli: Cli) -> None:
    alice = cli.start("run", "--json", "--name", "alice", "--group", "chat")
    _, alice_uuid = alice.started()

    result = cli.call("shout", "chat", "hello wörld", "--name", "bob", "--group", "chat",
                      "--header", "role=shouter", "--wait", "5")
    assert result.returncode == 0, _report(result)
    assert "shouted to 1 peer in group 'chat'" in result.stderr

    enter = alice.expect_event(event="ENTER", name="bob")
    bob = enter["peer"]
    assert re.fullmatch(r"[0-9a-f]{32}", bob)
    assert enter["headers"] == {"role": "shouter"}
    assert enter["address"].startswith("tcp://127.0.0.1:")
    alice.expect_event(event="JOIN", peer=bob, name="bob", group="chat")
    shout = alice.expect_event(event="SHOUT", peer=bob)
    assert shout["name"] == "bob" and shout["group"] == "chat"
    assert shout["message"] == "hello wörld"
    assert shout["frames"] == [{"text": "hello wörld"}]
    assert alice.expect_event(event="EXIT", peer=bob)["reason"] == "left"
    about_bob = [event["event"] for event in map(json.loads, alice.out) if event["peer"] == bob]
    assert about_bob == ["ENTER", "JOIN", "SHOUT", "EXIT"]

    dashed = str(UUID(alice_uuid))
    for target, sender in (("alice", "carol"), (alice_uuid[:8], "dave"), (dashed, "erin")):
        result = cli.call("whisper", target, f"hi from {sender}", "--name", sender)
        assert result.returncode == 0, _report(result)
        assert f"whispered to alice ({alice_uuid})" in result.stderr
        whisper = alice.expect_event(event="WHISPER", name=sender)
        assert whisper["message"] == f"hi from {sender}"
        assert whisper["group"] is None
        assert re.fullmatch(r"[0-9a-f]{32}", whisper["peer"])
        alice.expect_event(event="EXIT", peer=whisper["peer"], reason="left")


def test_peers_lists_headers_and_groups(cli: Cli) -> None:
    zoe = cli.start("run", "--json", "--name", "Zoë", "--group", "chat", "--group", "ümlaut",
                    "--header", "city=Zürich", "--header", "formula=a=b")
    _, zoe_uuid = zoe.started()

    result = cli.call("peers", "--json", "--wait", "1")
    assert result.returncode == 0, _report(result)
    peers = json.loads(result.stdout)
    assert isinstance(peers, list)
    (entry,) = [p for p in peers if p["peer"] == zoe_uuid]
    assert entry["name"] == "Zoë"
    assert entry["headers"] == {"city": "Zürich", "formula": "a=b"}
    assert entry["groups"] == ["chat", "ümlaut"]
    assert entry["address"].startswith("tcp://127.0.0.1:")
    assert entry["state"] == "alive" and entry["roles"] == [] and entry["broker"] is False
    assert 0 <= entry["last_heard"] < 30

    result = cli.call("peers", "--wait", "0.5")
    assert result.returncode == 0, _report(result)
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["UUID", "NAME", "ADDRESS", "STATE", "HEARD", "RTT", "GROUPS",
                              "ROLES", "BROKER", "HEADERS"]
    (row,) = [r for r in rows if r.startswith(zoe_uuid)]
    fields = row.split()
    assert fields[:4] == [zoe_uuid, "Zoë", entry["address"], "alive"]
    assert fields[6:] == ["chat,ümlaut", "-", "-", "city=Zürich", "formula=a=b"]

    result = cli.call("peers", "--json", "--wait", "0.5", "--status", "evasive")
    assert result.returncode == 0, _report(result)
    assert zoe_uuid not in result.stdout


def test_whisper_refuses_an_ambiguous_name(cli: Cli) -> None:
    twins = [cli.start("run", "--json", "--name", "twin") for _ in range(2)]
    uuids = [twin.started()[1] for twin in twins]
    result = cli.call("whisper", "twin", "which one?", "--wait", "5")
    assert result.returncode == 2, _report(result)
    assert "peermesh: error: 'twin' matches several peers" in result.stderr
    assert all(uuid[:8] in result.stderr for uuid in uuids)


def test_nothing_found(cli: Cli) -> None:
    result = cli.call("whisper", "nobody", "hello?", "--wait", "0.5")
    assert result.returncode == 2, _report(result)
    assert result.stderr.strip().splitlines()[-1] == \
        "peermesh: error: no peer matching 'nobody' appeared within 0.5 s"

    result = cli.call("shout", "ghosts", "boo", "--wait", "0.3")
    assert result.returncode == 2, _report(result)
    assert "no peer in group 'ghosts' appeared within 0.3 s" in result.stderr

    result = cli.call("peers", "--json", "--wait", "0.3")
    assert result.returncode == 0, _report(result)
    assert json.loads(result.stdout) == []
    assert "no peers found" in result.stderr


def test_peers_without_an_agent_says_which_interface_it_looks_on(cli: Cli, tmp_path: Any) -> None:
    result = cli.call("peers", "--wait", "0.2", "--agent", str(tmp_path / "none.sock"))
    assert result.returncode == 0, _report(result)
    assert result.stderr.splitlines() == [
        f"peermesh: no agent: looking for peers on lo (127.0.0.1, beacon port {cli.port}) "
        "for 0.2 s", "peermesh: no peers found within 0.2 s"]


# --------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(("args", "message"), [
    (["run", "--interface", "nosuch0"], "no IPv4 interface matches 'nosuch0'"),
    (["run", "--interface", "lo", "--header", "novalue"], "header 'novalue' is not KEY=VALUE"),
    (["run", "--interface", "lo", "--port", "70000"], "port must be 1..65535"),
    (["run", "--interface", "lo", "--interval", "0"], "must be a positive number"),
    (["peers", "--interface", "lo", "--config", "/nonexistent/peermesh.toml"],
     "cannot read config file"),
    (["whisper", "--interface", "lo", "alice"], "required: MESSAGE"),
    (["run", "--interface", ""], "argument --interface/-i: must not be empty"),
    (["run", "--interface", "lo", "--group", ""], "argument --group/-g: must not be empty"),
    (["run", "--interface", "lo", "--name", "caf\udce9"],
     "argument --name/-n: b'caf\\xe9' is not UTF-8 text"),
    (["whisper", "--interface", "lo", "\udcff", "hi"], "argument PEER: b'\\xff' is not UTF-8"),
    (["run", "--interface", "lo", "--discovery", "beacon,smoke"],
     "unknown discovery source(s) smoke; choose from beacon, mdns"),
    (["run", "--interface", "lo", "--seed", "127.0.0.1:http"], "port 'http' is not a number"),
])
def test_usage_errors(free_udp_port: int, args: list[str], message: str) -> None:
    if "--port" not in args:
        args = [*args, "--port", str(free_udp_port)]
    result = Cli(free_udp_port).call(*args, net=False)
    assert result.returncode == 2, _report(result)
    assert message in result.stderr
    assert "peermesh" in result.stderr and "error:" in result.stderr
    assert result.stdout == ""


def test_beacon_port_taken_is_a_runtime_error(free_udp_port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as blocker:
        blocker.bind(("127.0.0.1", free_udp_port))  # no SO_REUSEADDR: the node cannot share
        result = Cli(free_udp_port).call("run", "--interface", "lo", "--port",
                                          str(free_udp_port), net=False)
    assert result.returncode == 1, _report(result)
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"peermesh: error: cannot start the node (UDP beacon port "
                           f"{free_udp_port})")


def test_a_mistyped_option_shows_the_commands_usage_line(free_udp_port: int) -> None:
    result = Cli(free_udp_port).call("run", "--intreface", "lo", net=False)
    assert result.returncode == 2, _report(result)
    assert result.stderr.startswith("usage: peermesh run ")
    assert "peermesh run: error: unrecognized arguments: --intreface lo" in result.stderr


@pytest.mark.parametrize("command", [
    ["flux", "run", "--tree-port"],
    ["mtl", "gateway", "--control-port"],
])
def test_a_tcp_port_in_use_is_a_runtime_error_as_help_says(
        free_udp_port: int, free_tcp_port: int, tmp_path: Any, command: list[str]) -> None:
    extra = ["--data-dir", str(tmp_path), "--credentials", str(tmp_path / "c.json")] \
        if command[0] == "mtl" else []
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", free_tcp_port))
        blocker.listen()
        result = Cli(free_udp_port).call(*command, str(free_tcp_port), *extra)
    assert result.returncode == 1, _report(result)
    assert f"peermesh: error: cannot bind tcp://127.0.0.1:{free_tcp_port}: the address " \
        "is in use" in result.stderr


def test_a_key_file_open_to_others_is_a_bad_config(cli: Cli, tmp_path: Any) -> None:
    made = cli.call("keygen", str(tmp_path / "node.key"), net=False)
    assert made.returncode == 0, _report(made)
    secret = tmp_path / "node.key_secret"
    secret.chmod(0o644)
    result = cli.call("run", "--key-file", str(secret))
    assert result.returncode == 2, _report(result)
    (line,) = result.stderr.strip().splitlines()
    assert line == f"peermesh: error: secret key file {secret} is open to others (mode " \
        f"0644); run: chmod 600 {secret}"


def test_keygen_errors_say_error(cli: Cli, tmp_path: Any) -> None:
    assert cli.call("keygen", str(tmp_path / "node.key"), net=False).returncode == 0
    result = cli.call("keygen", str(tmp_path / "node.key"), net=False)
    assert result.returncode == 1, _report(result)
    assert result.stderr.startswith("peermesh: error: ")
    result = cli.call("keygen", str(tmp_path / "no" / "such" / "dir" / "node.key"), net=False)
    assert result.returncode == 1, _report(result)
    assert result.stderr.startswith("peermesh: error: ")


def test_bad_config_value(cli: Cli, tmp_path: Any) -> None:
    config = tmp_path / "node.toml"
    config.write_text('[node]\nname = "from-file"\ncolour = "blue"\n')
    result = cli.call("peers", "--config", str(config), "--wait", "0.1")
    assert result.returncode == 2, _report(result)
    assert "unknown key(s) colour" in result.stderr


# --------------------------------------------------------------------------
# Signals


def test_sigterm_and_sigint_leave_cleanly(cli: Cli) -> None:
    observer = cli.start("run", "--json", "--name", "observer")
    by_term = cli.start("run", "--name", "by-term")  # human-readable output
    by_int = cli.start("run", "--json", "--name", "by-int")
    for process in (observer, by_term, by_int):
        process.started()
    by_term.expect_line(
        lambda s: re.search(r"ENTER +observer \([0-9a-f]{8}\) tcp://127\.0\.0\.1:\d+", s)
        is not None, "human-readable ENTER line")
    by_int.expect_event(event="ENTER", name="observer")
    term_uuid = observer.expect_event(event="ENTER", name="by-term")["peer"]
    int_uuid = observer.expect_event(event="ENTER", name="by-int")["peer"]

    for process, signum, uuid in ((by_term, signal.SIGTERM, term_uuid),
                                  (by_int, signal.SIGINT, int_uuid)):
        sent = time.monotonic()
        assert process.stop(signum) == 0, process.describe()
        exit_event = observer.expect_event(event="EXIT", peer=uuid, timeout=3.0)
        assert exit_event["reason"] == "left"  # the port-0 beacon, not a timeout
        assert time.monotonic() - sent < 3.0
        assert not any("Traceback" in line or "Error" in line for line in process.err), \
            process.describe()
        assert len(process.err) == 1  # only the start-up line
    assert by_term.out[-1].endswith("STOP")
    assert json.loads(by_int.out[-1])["event"] == "STOP"


@pytest.mark.parametrize("args, signum", [
    (["peers", "--no-agent", "--wait", "60"], signal.SIGINT),
    (["whisper", "nobody", "hi", "--no-agent", "--wait", "60"], signal.SIGTERM),
    (["shout", "nobody", "hi", "--no-agent", "--wait", "60"], signal.SIGINT),
    (["call", "nosuchservice", "act", "--timeout", "60"], signal.SIGTERM),
    (["services", "--wait", "60"], signal.SIGINT),
])
def test_a_waiting_command_stops_on_a_signal_and_exits_130(cli: Cli, args: list[str],
                                                           signum: int) -> None:
    process = cli.start(*args, "-v")
    process.expect_line(lambda s: "beacons on port" in s, "the node's start-up log line", "err")
    assert process.stop(signum) == 130, process.describe()  # long before the 60 s wait
    assert "peermesh: interrupted" in process.err, process.describe()
    assert not any("Traceback" in line for line in process.err), process.describe()


def test_config_mistakes_are_usage_errors_not_the_default_lan(cli: Cli, tmp_path: Any) -> None:
    typo = tmp_path / "typo.toml"
    typo.write_text('[nodes]\ninterface = "lo"\n')
    loose = tmp_path / "loose.toml"
    loose.write_text('interface = "lo"\n[node]\nname = "x"\n')
    for path, message in ((typo, "unknown table(s) [nodes]; known: [node], [nfp]"),
                          (loose, "key(s) outside any table: interface")):
        result = cli.call("run", "--config", str(path), net=False)
        assert result.returncode == 2, _report(result)
        assert message in result.stderr and result.stdout == ""


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_seeds_without_broadcast_from_flags_and_variables(free_udp_port: int) -> None:
    """Two beacon ports, nothing broadcast: the seed alone brings the peers together."""
    import subprocess

    from cliprocess import PEERMESH, CliProcess, _env

    host = CliProcess(["run", "--json", "--name", "seedhost", "--interface", "lo",
                       "--port", str(free_udp_port), "--interval", "0.1",
                       "--discovery", "none"])
    try:
        _, host_uuid = host.started()
        other = str(_free_udp_port())
        result = Cli(free_udp_port).call(
            "peers", "--no-agent", "--json", "--wait", "1.5", "--interface", "lo", "--port",
            other, "--interval", "0.1", "--discovery", "none", "--seed",
            f"127.0.0.1:{free_udp_port}", net=False)
        assert result.returncode == 0, _report(result)
        assert [p["peer"] for p in json.loads(result.stdout)] == [host_uuid]
        env = dict(_env(), PEERMESH_DISCOVERY="none",
                   PEERMESH_SEEDS=f"127.0.0.1:{free_udp_port}")
        result = subprocess.run(
            [*PEERMESH, "peers", "--no-agent", "--json", "--wait", "1.5", "--interface", "lo",
             "--port", other, "--interval", "0.1"], capture_output=True, env=env,
            encoding="utf-8", timeout=20)
        assert result.returncode == 0, _report(result)
        assert [p["peer"] for p in json.loads(result.stdout)] == [host_uuid]
        # --discovery none really broadcasts nothing: a node on the host's port hears no one
        result = Cli(free_udp_port).call("peers", "--no-agent", "--json", "--wait", "0.5",
                                         "--discovery", "none")
        assert result.returncode == 0 and json.loads(result.stdout) == [], _report(result)
    finally:
        host.kill()


def test_discovery_options_build_the_config() -> None:
    from peermesh.cli.commands import build_config, build_parser

    def config(*argv: str) -> Any:
        return build_config(build_parser(command_modules=False).parse_args(["run", *argv]))

    assert config().discovery == ("beacon",) and config().seeds == ()
    assert config("--discovery", "none").discovery == ()
    assert config("--mdns").discovery == ("beacon", "mdns")
    assert config("--discovery", "mdns", "--mdns").discovery == ("mdns",)
    assert config("--seed", "10.0.0.1", "--seed", "10.0.0.2:5999").seeds == \
        ("10.0.0.1", "10.0.0.2:5999")


def test_an_overlay_command_loads_only_the_module_that_adds_it() -> None:
    import argparse
    import subprocess
    import sys

    from peermesh.cli.parser import BUILTIN, COMMAND_MODULES, COMMANDS_OF, build_parser

    def commands(parser: argparse.ArgumentParser) -> set[str]:
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return set(sub.choices)

    # the table names every overlay command, each under the module that adds it
    assert commands(build_parser()) == set(BUILTIN) | set(COMMANDS_OF)
    assert set(COMMANDS_OF.values()) == set(COMMAND_MODULES)
    for name, module in COMMANDS_OF.items():
        assert commands(build_parser(only=name)) == {
            n for n, m in COMMANDS_OF.items() if m == module}, name
    # running one loads no other overlay's commands
    probe = ("import sys, runpy; sys.argv = ['peermesh', 'job', '--help']\n"
             "try:\n    runpy.run_module('peermesh', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.endswith('.commands')), file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True,
                            encoding="utf-8", timeout=30)
    assert "usage: peermesh job" in result.stdout, _report(result)
    loaded = result.stderr.strip().splitlines()[-1]
    assert "peermesh.nfp.commands" in loaded and "peermesh.sada.commands" not in loaded \
        and "peermesh.flux.commands" not in loaded, loaded


def test_simulate_lists_only_the_options_it_uses() -> None:
    from cliprocess import PEERMESH, _env
    import subprocess

    result = subprocess.run([*PEERMESH, "simulate", "--help"], capture_output=True,
                            env=_env(), encoding="utf-8", timeout=20)
    assert result.returncode == 0, _report(result)
    for option in ("--nodes", "--interval", "--evasive", "--expired", "--seed SEED"):
        assert option in result.stdout, option
    for option in ("--interface", "--port", "--name", "--header", "--group", "--discovery",
                   "--mdns", "--config"):
        assert option not in result.stdout, option


def test_simulate_stops_on_a_signal_without_killing_a_node_greenlet() -> None:
    from cliprocess import CliProcess

    process = CliProcess(["simulate", "--nodes", "20", "--duration", "100000",
                          "--interval", "0.5"])
    try:
        process.expect_line(lambda s: s.startswith("t="), "a progress line", "err")
        assert process.stop(signal.SIGTERM) == 130, process.describe()
        assert process.err[-1] == "peermesh: interrupted", process.describe()
        assert not any("failed with" in line or "Traceback" in line for line in process.err), \
            process.describe()
    finally:
        process.kill()
