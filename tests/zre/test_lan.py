"""peermesh on a simulated LAN: every node in its own network namespace.

Each host (``tests/netlab.py``) has its own ``eth0`` on a bridge, address
10.88.K.N/24. Nodes run as separate processes inside the hosts, driven over
stdin/stdout by ``tests/lanpeers.py``; the ``peermesh`` command runs there
too. Every wait has a deadline; nothing sleeps to let things settle.

Needs root and iproute2 ``ip``; skipped with the harness's reason otherwise.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

try:
    from . import lanpeers, netlab
except ImportError:
    import lanpeers
    import netlab

Driver, DriverError, Fleet, JsonLines = (lanpeers.Driver, lanpeers.DriverError, lanpeers.Fleet,
                                        lanpeers.JsonLines)
match = lanpeers.match

pytestmark = pytest.mark.lan

MAILBOX_PORTS = range(0xC000, 0x10000)  # ZRE: ephemeral ports %C000-%FFFF

#: timeouts small enough to watch a peer go EVASIVE, SILENT and expire in ~1.5 s
FAST = {"interval": 0.2, "evasive": 0.5, "silent": 0.8, "expired": 1.5}


@pytest.fixture
def fleet(lan_factory: Callable[..., netlab.Lan]) -> Iterator[Fleet]:
    """Starts nodes in hosts; stops them (bounded) before the LAN is torn down."""
    fleet = Fleet()
    try:
        yield fleet
    finally:
        fleet.close()


def interface_setting(form: str, host: netlab.Host, lan: netlab.Lan) -> dict:
    """Driver keyword arguments that choose the host's eth0 in the way ``form`` says."""
    if form == "default":
        return {}
    if form == "env":
        return {"env": {"PEERMESH_INTERFACE": host.interface}}
    return {"interface": {"name": host.interface, "address": host.address,
                          "cidr": lan.network}[form]}


def assert_on_lan(driver: Driver, host: netlab.Host) -> None:
    """The node chose eth0 and advertises its 10.88.K.N address, never loopback."""
    ready = driver.ready
    assert ready["interface"] == "eth0", ready
    assert ready["address"] == host.address, ready
    assert ready["broadcast"] == host.broadcast, ready
    prefix = f"tcp://{host.address}:"
    assert driver.endpoint.startswith(prefix), ready
    assert int(driver.endpoint[len(prefix):]) in MAILBOX_PORTS, ready


def assert_sees(observer: Driver, peer: Driver, groups: tuple[str, ...] = (),
                since: int = 0, headers: dict | None = None, timeout: float = 5.0) -> dict:
    """``observer`` reports ENTER for ``peer`` (at its LAN endpoint) and JOIN for ``groups``."""
    enter = observer.wait(match("ENTER", peer=peer.uuid), timeout, since)
    assert enter["name"] == peer.name
    assert enter["address"] == peer.endpoint, enter
    assert "127.0.0.1" not in enter["address"]
    if headers is not None:
        assert enter["headers"] == headers
    for group in groups:
        observer.wait(match("JOIN", peer=peer.uuid, group=group), since=since)
    return enter


def mesh(nodes: list[Driver], groups: tuple[str, ...] = ()) -> None:
    for observer in nodes:
        for peer in nodes:
            if peer is not observer:
                assert_sees(observer, peer, groups)


# --------------------------------------------------------------------------
# Discovery and interface selection


@pytest.mark.parametrize("form", ["default", "name", "address", "cidr", "env"])
def test_two_hosts_discover_each_other(lan_factory, fleet, form):
    lan = lan_factory(2)
    a, b = lan.hosts
    alice = fleet.start(a, name="alice", groups=["chat"], headers={"role": "left"},
                        **interface_setting(form, a, lan))
    bob = fleet.start(b, "threaded", name="bob", groups=["chat", "ops"],
                      headers={"role": "right", "büro": "straße ☕"},
                      **interface_setting(form, b, lan))
    assert_on_lan(alice, a)
    assert_on_lan(bob, b)
    assert_sees(alice, bob, ("chat", "ops"), headers={"role": "right", "büro": "straße ☕"})
    assert_sees(bob, alice, ("chat",), headers={"role": "left"})

    (info,) = alice.call("peers")
    liveness = {key: info.pop(key) for key in ("state", "last_heard", "rtt", "roles")}
    assert info == {"peer": bob.uuid, "name": "bob", "address": bob.endpoint,
                    "headers": {"role": "right", "büro": "straße ☕"},
                    "groups": ["chat", "ops"], "leads": []}
    assert liveness["state"] == "alive" and liveness["roles"] == []
    (info,) = bob.call("peers")
    assert info["peer"] == alice.uuid and info["address"] == alice.endpoint


def test_hello_and_beacon_carry_the_lan_address(lan_factory, fleet):
    """On the wire: the beacon comes from eth0's address and the HELLO advertises it."""
    lan = lan_factory(2)
    a, b = lan.hosts
    raw = fleet.start(b, "raw", bind=b.address, broadcast=b.broadcast, port=5670)
    alice = fleet.start(a, name="alice", groups=["chat"])
    port = int(alice.endpoint.rsplit(":", 1)[1])

    beacon = raw.wait(match("BEACON", uuid=alice.uuid))
    assert beacon == {"event": "BEACON", "source": a.address, "uuid": alice.uuid, "port": port}
    hello = raw.wait(match("RAW", command="HELLO"))
    assert hello["identity"] == "01" + alice.uuid
    assert hello["endpoint"] == f"tcp://{a.address}:{port}" == alice.endpoint
    assert hello["sequence"] == 1
    assert (hello["name"], hello["groups"]) == ("alice", ["chat"])

    since = raw.mark()
    alice.stop()  # leaves with a port-0 beacon from the same address
    bye = raw.wait(match("BEACON", uuid=alice.uuid, port=0), since=since)
    assert bye["source"] == a.address


def test_three_hosts_shout_and_whisper(lan_factory, fleet):
    lan = lan_factory(3)
    nodes = [fleet.start(host, kind, name=name, groups=["chat"])
             for host, kind, name in zip(lan.hosts, ("green", "threaded", "green"),
                                         ("ann", "ben", "cyd"))]
    for node, host in zip(nodes, lan.hosts):
        assert_on_lan(node, host)
    mesh(nodes, ("chat",))

    for sender in nodes:
        sender.call("shout", group="chat", msg=f"hello from {sender.name}")
    for sender in nodes:
        for receiver in nodes:
            if receiver is not sender:
                got = receiver.wait(match("SHOUT", peer=sender.uuid, group="chat"))
                assert (got["name"], got["message"]) == (sender.name, f"hello from {sender.name}")

    for sender in nodes:
        for receiver in nodes:
            if receiver is not sender:
                sender.call("whisper", peer=receiver.uuid, msg=f"{sender.name}->{receiver.name}")
    for receiver in nodes:
        for sender in nodes:
            if receiver is not sender:
                got = receiver.wait(match("WHISPER", peer=sender.uuid))
                assert got["message"] == f"{sender.name}->{receiver.name}"

    ann, ben, cyd = nodes
    # several frames stay several frames across the wire
    ann.call("shout", group="chat", frames=["one", "two", "three"])
    got = ben.wait(match("SHOUT", peer=ann.uuid, frames=[{"text": t} for t in
                                                          ("one", "two", "three")]))
    assert got["message"] == "onetwothree"

    # LEAVE reaches everyone; later shouts go to the remaining members only
    since = {n.name: n.mark() for n in nodes}
    cyd.call("leave", group="chat")
    ann.wait(match("LEAVE", peer=cyd.uuid, group="chat"), since=since["ann"])
    ben.wait(match("LEAVE", peer=cyd.uuid, group="chat"), since=since["ben"])
    ann.call("shout", group="chat", msg="members only")
    ann.call("whisper", peer=cyd.uuid, msg="after the shout")  # same link: arrives later
    ben.wait(match("SHOUT", peer=ann.uuid, message="members only"), since=since["ben"])
    cyd.wait(match("WHISPER", peer=ann.uuid, message="after the shout"), since=since["cyd"])
    assert not cyd.find(match("SHOUT", message="members only"), since["cyd"])


def test_several_nodes_share_a_host(lan_factory, fleet):
    """Two nodes in one host and one in another: all hear each other's beacons on port 5670."""
    lan = lan_factory(2)
    a, b = lan.hosts
    nodes = [fleet.start(a, name="a1", groups=["chat"]),
             fleet.start(a, "threaded", name="a2", groups=["chat"]),
             fleet.start(b, name="b1", groups=["chat"])]
    mesh(nodes, ("chat",))
    a1, a2, b1 = nodes
    assert a1.endpoint != a2.endpoint and a1.endpoint.startswith(f"tcp://{a.address}:")
    b1.call("shout", group="chat", msg="to both")
    for receiver in (a1, a2):
        receiver.wait(match("SHOUT", peer=b1.uuid, message="to both"))


# --------------------------------------------------------------------------
# Leaving and losing peers


def test_graceful_stop_gives_exit_at_once(lan_factory, fleet):
    """A stopping node's port-0 beacon makes peers report EXIT at once (timeouts are 5/30 s)."""
    lan = lan_factory(3)
    nodes = [fleet.start(h, name=n, groups=["chat"]) for h, n in zip(lan.hosts, "xyz")]
    mesh(nodes, ("chat",))
    x, y, z = nodes
    since = {n.name: n.mark() for n in nodes}
    started = time.monotonic()
    z.begin_stop()
    for observer in (x, y):
        exit_ = observer.wait(match("EXIT", peer=z.uuid), since=since[observer.name])
        assert exit_["reason"] == "left"
        assert exit_["address"] == z.endpoint
    # well before the 5 s evasive timeout: only the port-0 beacon explains it
    assert time.monotonic() - started < 3.0, "EXIT came late: the port-0 beacon was not used"
    z.stop(since=since["z"])
    assert z.find(match("STOP"), since["z"]), "a stopped node reports STOP"
    assert [p["peer"] for p in x.call("peers")] == [y.uuid]
    # the rest of the mesh is untouched
    x.call("whisper", peer=y.uuid, msg="still here")
    y.wait(match("WHISPER", peer=x.uuid, message="still here"))


def test_cable_pull_expires_peer_and_replug_reenters(lan_factory, fleet):
    lan = lan_factory(2)
    a, b = lan.hosts
    alice = fleet.start(a, name="alice", groups=["chat"], **FAST)
    bob = fleet.start(b, "threaded", name="bob", groups=["chat"], **FAST)
    mesh([alice, bob], ("chat",))

    since = {"alice": alice.mark(), "bob": bob.mark()}
    pulled = time.monotonic()
    b.pull_cable()
    for observer, lost in ((alice, bob), (bob, alice)):
        s = since[observer.name]
        evasive = observer.wait(match("EVASIVE", peer=lost.uuid), 3.0, s)
        silent = observer.wait(match("SILENT", peer=lost.uuid), 3.0, s)
        exit_ = observer.wait(match("EXIT", peer=lost.uuid), 3.0, s)
        assert exit_["reason"] == "expired", exit_
        # not before the expired timeout (the last beacon came at most one interval before)
        assert time.monotonic() - pulled >= FAST["expired"] - FAST["interval"]
        order = [observer.events.index(e, s) for e in (evasive, silent, exit_)]
        assert order == sorted(order), "EVASIVE, then SILENT, then EXIT"
    assert alice.call("peers") == [] and bob.call("peers") == []

    since = {"alice": alice.mark(), "bob": bob.mark()}
    b.plug_cable()
    # the mailbox finds the pulled connection dead by TCP keepalive, in whole seconds (at
    # least 4 s at these timings); until then the peer's new one under the same identity waits
    assert_sees(alice, bob, ("chat",), since=since["alice"], timeout=15.0)
    assert_sees(bob, alice, ("chat",), since=since["bob"], timeout=15.0)
    alice.call("whisper", peer=bob.uuid, msg="welcome back")
    bob.wait(match("WHISPER", peer=alice.uuid, message="welcome back"), since=since["bob"])
    bob.call("shout", group="chat", msg="thanks")
    alice.wait(match("SHOUT", peer=bob.uuid, message="thanks"), since=since["alice"])


def test_unknown_interface_is_a_clear_error(lan_factory):
    lan = lan_factory(1)
    (host,) = lan.hosts
    result = host.run([sys.executable, lanpeers.SCRIPT, "green", json.dumps({"interface": "eth9"})],
                      capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "InterfaceError" in last and "'eth9'" in last, result.stderr
    assert f"eth0 ({host.address}/24)" in last, last


# --------------------------------------------------------------------------
# The peermesh command inside hosts

CLI_TIMEOUT = 30.0  # a CLI command that should take well under two seconds
QUICK = ("--interval", "0.2", "--wait", "3")  # short-lived nodes: settle after ~0.3 s


def peermesh_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "peermesh", *args]


def start_cli_run(host: netlab.Host, *args: str) -> JsonLines:
    """``peermesh run --json ARGS`` in ``host``, its output read as JSON lines.

    Returns once its beacon socket is bound in the host (the node is up).
    """
    proc = host.popen(peermesh_cli("run", "--json", *args), stdin=subprocess.DEVNULL,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      env={"PEERMESH_INTERFACE": None})
    lines = JsonLines(proc, f"peermesh run@{host.address}")
    deadline = time.monotonic() + lanpeers.START_WAIT
    while not lanpeers.udp_port_bound(proc.pid, 5670):
        if proc.poll() is not None or time.monotonic() > deadline:
            lines.fail("`peermesh run` did not bind its beacon socket")
        time.sleep(0.02)  # polling a condition, with a deadline
    return lines


def run_cli(host: netlab.Host, *args: str) -> subprocess.CompletedProcess[str]:
    return host.run(peermesh_cli(*args), capture_output=True, text=True, timeout=CLI_TIMEOUT,
                    stdin=subprocess.DEVNULL, env={"PEERMESH_INTERFACE": None})


def test_cli_shout_whisper_and_peers_between_hosts(lan_factory):
    lan = lan_factory(2)
    a, b = lan.hosts
    runner = start_cli_run(a, "--name", "alice", "--group", "chat", "--header", "role=server")
    try:
        shout = run_cli(b, "shout", *QUICK, "--interface", "eth0", "chat", "hello")
        assert shout.returncode == 0, shout.stderr
        assert "shouted to 1 peer in group 'chat'" in shout.stderr
        got = runner.wait(match("SHOUT", group="chat", message="hello"))
        assert got["frames"] == [{"text": "hello"}]
        enter = runner.wait(match("ENTER", peer=got["peer"]))
        assert enter["address"].startswith(f"tcp://{b.address}:"), enter

        whisper = run_cli(b, "whisper", *QUICK, "--interface", lan.network, "alice", "hi ☕")
        assert whisper.returncode == 0, whisper.stderr
        assert "whispered to alice" in whisper.stderr
        got = runner.wait(match("WHISPER", message="hi ☕"))
        enter = runner.wait(match("ENTER", peer=got["peer"]))
        assert enter["address"].startswith(f"tcp://{b.address}:"), enter

        peers = run_cli(b, "peers", "--json", "--interval", "0.2", "--wait", "1",
                        "--interface", b.address)
        assert peers.returncode == 0, peers.stderr
        (alice,) = json.loads(peers.stdout)
        assert alice["name"] == "alice" and alice["groups"] == ["chat"]
        assert alice["headers"] == {"role": "server"}
        assert alice["address"].startswith(f"tcp://{a.address}:"), alice

        for line in runner.events:
            assert {"event", "peer", "name", "group", "headers", "address", "frames",
                    "message"} <= set(line), line
    finally:
        runner.kill()


def test_cli_run_sigterm_leaves_with_port_zero_beacon(lan_factory, fleet):
    lan = lan_factory(2)
    a, b = lan.hosts
    runner = start_cli_run(a, "--name", "alice", "--group", "chat", "--interface", a.address)
    try:
        watcher = fleet.start(b, name="watcher", groups=["chat"])
        enter = watcher.wait(match("ENTER", name="alice"))
        assert enter["address"].startswith(f"tcp://{a.address}:"), enter
        watcher.wait(match("JOIN", peer=enter["peer"], group="chat"))
        runner.wait(match("ENTER", peer=watcher.uuid, address=watcher.endpoint))
        since = watcher.mark()
        runner.proc.terminate()
        exit_ = watcher.wait(match("EXIT", peer=enter["peer"]), since=since)
        assert exit_["reason"] == "left"
        assert runner.end() == 0, runner.stderr
        assert runner.events[-1]["event"] == "STOP"
        assert not any("Traceback" in line for line in runner.stderr), runner.stderr
    finally:
        runner.kill()


def test_cli_whisper_to_unknown_peer_fails_clearly(lan_factory, fleet):
    lan = lan_factory(2)
    a, b = lan.hosts
    fleet.start(a, name="alice")
    started = time.monotonic()
    result = run_cli(b, "whisper", "--interval", "0.2", "--wait", "1", "nobody", "hi")
    assert time.monotonic() - started < 10
    assert result.returncode == 2, result.stderr
    assert "'nobody'" in result.stderr and "within 1 s" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_driver_reports_missing_events_with_history(lan_factory, fleet):
    """The harness itself: a wait that cannot succeed fails by its deadline, with context."""
    lan = lan_factory(1)
    lonely = fleet.start(lan.hosts[0], name="lonely")
    started = time.monotonic()
    with pytest.raises(DriverError, match=r"(?s)no ENTER .* within 0.3 s.*READY"):
        lonely.wait(match("ENTER"), timeout=0.3)
    assert time.monotonic() - started < 2.0
