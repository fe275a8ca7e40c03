"""Interface selection by name, address and CIDR, and the netlink listing under it."""

import json
import socket
import struct
import sys

import ifaddr
import pytest
from hypothesis import given, strategies as st

from peermesh.errors import InterfaceError
from peermesh.net.interfaces import list_interfaces, select_interface
from peermesh.net.netlink import NetlinkError, ipv4_addresses, parse_dump


@pytest.mark.parametrize("choice", ["lo", "127.0.0.1", "127.0.0.0/8", "127.0.0.1/32"])
def test_loopback_by_name_address_or_cidr(choice):
    itf = select_interface(choice)
    assert itf.name == "lo" and itf.address == "127.0.0.1"
    assert itf.broadcast == "127.255.255.255"
    assert "127.0.0.9" in itf and "10.0.0.1" not in itf and "not-an-ip" not in itf


def test_environment_variable_chooses(monkeypatch):
    monkeypatch.setenv("PEERMESH_INTERFACE", "lo")
    assert select_interface().name == "lo"


def test_default_is_up_and_prefers_non_loopback(monkeypatch):
    monkeypatch.delenv("PEERMESH_INTERFACE", raising=False)
    chosen = select_interface()
    assert chosen.up
    others = [i for i in list_interfaces() if i.up and i.can_broadcast and not i.loopback]
    assert chosen.loopback == (not others)


@pytest.mark.parametrize("choice", ["nosuch0", "203.0.113.77", "198.51.100.0/24"])
def test_unknown_interface_is_a_clear_error(choice):
    with pytest.raises(InterfaceError, match="available: .*lo"):
        select_interface(choice)


# --- netlink: the Linux listing without ctypes ---------------------------

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="netlink is Linux's")


def _ifaddr_ipv4() -> list[tuple[str, str, int]]:
    return [(a.name, ip.ip, ip.network_prefix) for a in ifaddr.get_adapters()
            for ip in a.ips if isinstance(ip.ip, str)]


@linux_only
def test_netlink_lists_what_ifaddr_lists():
    assert sorted(ipv4_addresses()) == sorted(_ifaddr_ipv4())


def _message(kind: int, seq: int, body: bytes) -> bytes:
    data = struct.pack("=IHHII", 16 + len(body), kind, 0, seq, 0) + body
    return data + b"\0" * (-len(data) % 4)


def _attr(kind: int, value: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(value), kind) + value
    return data + b"\0" * (-len(data) % 4)


def _address(family: int, prefix: int, index: int, local: bytes, label: bytes = b"") -> bytes:
    body = struct.pack("=BBBBI", family, prefix, 0, 0, index) + _attr(2, local)
    return body + (_attr(3, label + b"\0") if label else b"")


def test_parse_dump_reads_addresses_and_skips_the_rest():
    data = (_message(20, 7, _address(socket.AF_INET, 24, 2, bytes([10, 0, 0, 5]), b"eth0"))
            + _message(20, 7, _address(socket.AF_INET6, 64, 2, bytes(16)))  # IPv6: skipped
            + _message(20, 8, _address(socket.AF_INET, 8, 1, bytes([127, 0, 0, 1])))  # other seq
            + _message(20, 7, _address(socket.AF_INET, 16, 2, bytes([10, 1, 0, 6]))))
    assert parse_dump(data, 7) == ([(2, "10.0.0.5", 24, "eth0"), (2, "10.1.0.6", 16, "")], False)
    assert parse_dump(_message(3, 7, b"\0" * 4), 7) == ([], True)


def test_parse_dump_reports_kernel_errors():
    with pytest.raises(NetlinkError, match="EPERM"):
        parse_dump(_message(2, 7, struct.pack("=i", -1) + b"\0" * 16), 7)


@given(st.binary(max_size=200))
def test_parse_dump_raises_only_netlink_error(data):
    try:
        found, _ = parse_dump(data, 7)
    except NetlinkError:
        return
    assert all(len(entry) == 4 for entry in found)


@given(st.binary(max_size=60))
def test_parse_dump_of_a_mangled_address_raises_only_netlink_error(tail):
    data = _message(20, 7, struct.pack("=BBBBI", socket.AF_INET, 24, 0, 0, 1) + tail)
    try:
        found, done = parse_dump(data, 7)
    except NetlinkError:
        return
    assert not done and all(index == 1 and prefix == 24 for index, _, prefix, _ in found)


@linux_only
def test_netlink_sees_secondary_addresses_in_a_namespace(lan_factory):
    """A second address on eth0 (as `ip addr add` makes) is listed, and matches ifaddr."""
    lan = lan_factory(1)
    host = lan.hosts[0]
    host.run(["ip", "addr", "add", "10.77.0.5/16", "dev", "eth0"], check=True)
    code = ("import json; from peermesh.net.netlink import ipv4_addresses; import ifaddr;"
            "print(json.dumps([sorted(ipv4_addresses()), sorted([a.name, i.ip, i.network_prefix]"
            " for a in ifaddr.get_adapters() for i in a.ips if isinstance(i.ip, str))]))")
    out = host.run_python(code, capture_output=True, text=True, check=True).stdout
    ours, theirs = json.loads(out)
    assert ours == theirs
    assert ["eth0", "10.77.0.5", 16] in ours and ["eth0", host.address, 24] in ours
