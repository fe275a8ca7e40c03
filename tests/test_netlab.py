"""Tests of the simulated-LAN harness (tests/netlab.py) and the conftest fixtures.

Every network wait has a deadline of a few seconds; conditions are polled,
never waited for with a fixed sleep.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import time
from collections.abc import Callable

import pytest

try:
    from . import netlab
except ImportError:
    import netlab

TEST_PORT = 45670  # any port: every namespace has its own port space
WAIT = 5.0  # seconds allowed for anything that should happen on the LAN

# Prints "READY" once bound, then "GOT <payload> <source address>" per datagram,
# until `duration` seconds have passed.
UDP_RECEIVER = r"""
import socket, sys, time
port, duration = int(sys.argv[1]), float(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port))
print("READY", flush=True)
deadline = time.monotonic() + duration
while (left := deadline - time.monotonic()) > 0:
    s.settimeout(left)
    try:
        data, (host, _) = s.recvfrom(2048)
    except socket.timeout:
        break
    print("GOT", data.decode(), host, flush=True)
"""

# argv: port payload destination...
UDP_SENDER = r"""
import socket, sys
port, payload, *destinations = sys.argv[1:]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
for destination in destinations:
    s.sendto(payload.encode(), (destination, int(port)))
"""

TCP_SERVER = r"""
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
server.settimeout(5)
print("READY", flush=True)
conn, (peer, _) = server.accept()
conn.settimeout(5)
conn.sendall(conn.recv(1024).upper())
print("PEER", peer, flush=True)
"""

TCP_CLIENT = r"""
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as c:
    c.sendall(b"hello")
    print(c.recv(1024).decode())
"""


class Lines:
    """Line reader over a child's stdout pipe, with deadlines."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.buf = b""
        self.lines: list[str] = []
        self.eof = False

    def _read(self, timeout: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], max(timeout, 0))
        if ready:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.eof = True
            *complete, self.buf = (self.buf + chunk).split(b"\n")
            self.lines += [line.decode() for line in complete]

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = WAIT) -> str:
        """The first line (read so far or arriving within timeout) matching predicate."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if predicate(line):
                    return line
            seen = len(self.lines)
            left = deadline - time.monotonic()
            if left <= 0 or self.eof:
                raise AssertionError(f"no matching line within {timeout} s; got {self.lines}")
            self._read(left)


def start_udp_receiver(host: netlab.Host, duration: float = 20.0) -> Lines:
    proc = host.popen_python(UDP_RECEIVER, str(TEST_PORT), str(duration), stdout=subprocess.PIPE)
    lines = Lines(proc)
    lines.wait_for(lambda line: line == "READY")
    return lines


def send_udp(host: netlab.Host, payload: str, *destinations: str) -> None:
    host.run_python(UDP_SENDER, str(TEST_PORT), payload, *destinations, check=True, timeout=WAIT)


def got(payload: str, source: netlab.Host) -> Callable[[str], bool]:
    return lambda line: line == f"GOT {payload} {source.address}"


def netns_list() -> set[str]:
    out = subprocess.run([netlab.IP, "netns", "list"], capture_output=True, text=True,
                         check=True, timeout=10).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def root_links() -> str:
    return subprocess.run([netlab.IP, "-o", "link"], capture_output=True, text=True,
                          check=True, timeout=10).stdout


# --------------------------------------------------------------------------


def test_layout(lan_factory: Callable[..., netlab.Lan]) -> None:
    lan = lan_factory(3)
    assert [h.address for h in lan.hosts] == [f"{lan.prefix}.{10 + i}" for i in range(3)]
    assert 100 <= int(lan.prefix.split(".")[2]) <= 250
    assert set(lan.namespaces) == {lan.switch, *(h.name for h in lan.hosts)}
    assert set(lan.namespaces) <= netns_list()
    for host in lan.hosts:
        assert host.interface == "eth0" and host.broadcast == f"{lan.prefix}.255"
        addr = host.run([netlab.IP, "-4", "-o", "addr", "show", "dev", "eth0"],
                        capture_output=True, text=True, check=True).stdout
        assert f"inet {host.address}/24 brd {host.broadcast}" in addr
        route = host.run([netlab.IP, "route"], capture_output=True, text=True, check=True).stdout
        assert "default dev eth0" in route
        lo = host.run([netlab.IP, "-o", "link", "show", "lo"], capture_output=True, text=True,
                      check=True).stdout
        assert "LOWER_UP" in lo
    # the switch has no address at all (no IPv4, no IPv6 link-local)
    switch_addrs = subprocess.run([netlab.IP, "-n", lan.switch, "-o", "addr"],
                                  capture_output=True, text=True, check=True).stdout
    assert "inet" not in switch_addrs
    # nothing of ours in the root namespace
    assert lan.tag not in root_links()
    # subprocesses find the project without installation
    probe = lan.hosts[0].run_python("import peermesh, sys; print(list(peermesh.__path__)[0])",
                                    capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == os.path.join(netlab.REPO_ROOT, "peermesh")


def test_udp_broadcast_reaches_other_hosts(lan_factory: Callable[..., netlab.Lan]) -> None:
    lan = lan_factory(3)
    rx0, sender, rx2 = lan.hosts
    receivers = [start_udp_receiver(rx0), start_udp_receiver(rx2)]
    send_udp(sender, "subnet", lan.broadcast)
    send_udp(sender, "limited", "255.255.255.255")  # needs the default route
    for lines in receivers:
        lines.wait_for(got("subnet", sender))
        lines.wait_for(got("limited", sender))


def test_unicast_tcp_between_hosts(lan_factory: Callable[..., netlab.Lan]) -> None:
    lan = lan_factory(1)
    server_host = lan.hosts[0]
    client_host = lan.add_host()  # a late joiner is a full member of the LAN
    assert client_host.address == f"{lan.prefix}.11"
    server = server_host.popen_python(TCP_SERVER, server_host.address, str(TEST_PORT),
                                      stdout=subprocess.PIPE)
    lines = Lines(server)
    lines.wait_for(lambda line: line == "READY")
    reply = client_host.run_python(TCP_CLIENT, server_host.address, str(TEST_PORT),
                                   capture_output=True, text=True, timeout=WAIT)
    assert reply.returncode == 0, reply.stderr
    assert reply.stdout.strip() == "HELLO"
    lines.wait_for(lambda line: line == f"PEER {client_host.address}")
    assert server.wait(timeout=WAIT) == 0


def test_pull_cable_stops_traffic(lan_factory: Callable[..., netlab.Lan]) -> None:
    lan = lan_factory(2)
    pulled, other = lan.hosts
    at_pulled, at_other = start_udp_receiver(pulled), start_udp_receiver(other)

    send_udp(other, "before", lan.broadcast)
    at_pulled.wait_for(got("before", other))

    pulled.pull_cable()
    assert not pulled.plugged
    carrier = pulled.run(["cat", "/sys/class/net/eth0/carrier"], capture_output=True, text=True)
    assert carrier.stdout.strip() == "0"
    for _ in range(3):
        send_udp(other, "during", lan.broadcast)
        send_udp(pulled, "during", lan.broadcast)  # sendto still succeeds, silently
    at_pulled.wait_for(got("during", pulled))  # a host still hears itself

    pulled.plug_cable()
    assert pulled.plugged
    # Poll until traffic flows again both ways. Datagrams on this path arrive
    # in order, so once "after" is in, any "during" would have been seen too.
    for sender, lines in ((other, at_pulled), (pulled, at_other)):
        deadline = time.monotonic() + WAIT
        while True:
            send_udp(sender, "after", lan.broadcast)
            try:
                lines.wait_for(got("after", sender), timeout=0.2)
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
    assert f"GOT during {other.address}" not in at_pulled.lines
    assert f"GOT during {pulled.address}" not in at_other.lines


def test_link_root_makes_this_namespace_one_more_host() -> None:
    reason = netlab.lan_available()
    if reason is not None:
        pytest.skip(reason)
    with pytest.raises(RuntimeError):
        with netlab.Lan(1) as lan:
            address = lan.link_root()
            assert address == f"{lan.prefix}.1" and lan.root_link is not None
            assert f"inet {address}/24" in subprocess.run(
                [netlab.IP, "-o", "-4", "addr", "show", "dev", lan.root_link],
                capture_output=True, text=True, check=True, timeout=10).stdout
            with socket.socket() as server:
                server.bind((address, 0))
                server.listen()
                host = lan.hosts[0]
                reply = host.run_python(
                    "import socket, sys\n"
                    "socket.create_connection((sys.argv[1], int(sys.argv[2])), 5).close()",
                    address, str(server.getsockname()[1]), capture_output=True, text=True,
                    timeout=WAIT)
                assert reply.returncode == 0, reply.stderr
                server.settimeout(WAIT)
                conn, peer = server.accept()
                conn.close()
                assert peer[0] == host.address
            raise RuntimeError("cleanup on failure")
    assert lan.tag not in root_links()   # the root end went with the switch


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("exc", [None, RuntimeError, KeyboardInterrupt])
def test_lan_cleans_up(exc: type[BaseException] | None) -> None:
    reason = netlab.lan_available()
    if reason is not None:
        pytest.skip(reason)
    expect = pytest.raises(exc) if exc else contextlib.nullcontext()
    with expect:
        with netlab.Lan(2) as lan:
            names = lan.namespaces
            assert len(names) == 3 and set(names) <= netns_list()
            sleeper = lan.hosts[0].popen(["sleep", "60"])
            # a daemon that escaped the process group: found by its namespace
            spawner = lan.hosts[1].popen_python(
                "import subprocess\n"
                "p = subprocess.Popen(['sleep', '60'], start_new_session=True,\n"
                "                     stdout=subprocess.DEVNULL)\n"
                "print(p.pid)", stdout=subprocess.PIPE, text=True)
            out, _ = spawner.communicate(timeout=WAIT)
            escaped = int(out)
            if exc is not None:
                raise exc("boom")
    assert not set(names) & netns_list()
    assert lan.namespaces == ()
    assert lan.tag not in root_links()
    assert sleeper.poll() is not None
    deadline = time.monotonic() + WAIT
    while not _gone(escaped):
        assert time.monotonic() < deadline, f"pid {escaped} still running"
        time.sleep(0.02)
    lan.close()  # idempotent


def test_free_ports(free_udp_port: int, free_tcp_port: int) -> None:
    for kind, port in ((socket.SOCK_DGRAM, free_udp_port), (socket.SOCK_STREAM, free_tcp_port)):
        assert 0 < port < 65536
        with socket.socket(socket.AF_INET, kind) as sock:
            sock.bind(("127.0.0.1", port))
