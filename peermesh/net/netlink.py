"""IPv4 addresses of this host's interfaces, read from the Linux kernel over netlink.

One ``RTM_GETADDR`` dump on a ``NETLINK_ROUTE`` socket lists every IPv4
address (secondary ones included) with its prefix length and interface.
It needs only the standard library, where the portable route (``ifaddr``)
loads ``ctypes`` and costs about a megabyte of memory in every node.
``parse_dump`` is the sans-io half; ``ipv4_addresses`` does the I/O.
"""

from __future__ import annotations

import errno
import socket
import struct
from typing import Iterator, Optional

from ..errors import PeermeshError

__all__ = ["ipv4_addresses", "parse_dump", "NetlinkError"]

_NLMSG = struct.Struct("=IHHII")      # length, type, flags, sequence, port id
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefix length, flags, scope, interface index
_RTATTR = struct.Struct("=HH")        # length, type
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_RTM_NEWADDR, _RTM_GETADDR = 20, 22
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_IFA_ADDRESS, _IFA_LOCAL, _IFA_LABEL = 1, 2, 3


class NetlinkError(PeermeshError, OSError):
    """The kernel refused the request or answered something unreadable."""


def _align(n: int) -> int:
    return (n + 3) & ~3


def _attributes(data: bytes, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    while start + _RTATTR.size <= end:
        length, kind = _RTATTR.unpack_from(data, start)
        if length < _RTATTR.size or start + length > end:
            raise NetlinkError("truncated netlink attribute")
        yield kind, data[start + _RTATTR.size:start + length]
        start += _align(length)


def parse_dump(data: bytes, sequence: int) -> tuple[list[tuple[int, str, int, str]], bool]:
    """Addresses in one datagram of an ``RTM_GETADDR`` dump, and whether the dump ended.

    Each address is ``(interface index, IPv4 address, prefix length, label)``.
    Messages for other sequence numbers are skipped.
    """
    found, offset, done = [], 0, False
    while offset + _NLMSG.size <= len(data):
        length, kind, _flags, seq, _pid = _NLMSG.unpack_from(data, offset)
        if length < _NLMSG.size or offset + length > len(data):
            raise NetlinkError("truncated netlink message")
        body, end = offset + _NLMSG.size, offset + length
        offset += _align(length)
        if seq != sequence:
            continue
        if kind == _NLMSG_DONE:
            done = True
            break
        if kind == _NLMSG_ERROR:
            code = -struct.unpack_from("=i", data, body)[0] if end - body >= 4 else 0
            raise NetlinkError(code, f"netlink: {errno.errorcode.get(code, code)}")
        if kind != _RTM_NEWADDR or end - body < _IFADDRMSG.size:
            continue
        family, prefix, _f, _scope, index = _IFADDRMSG.unpack_from(data, body)
        if family != socket.AF_INET:
            continue
        attrs = dict(_attributes(data, body + _IFADDRMSG.size, end))
        raw = attrs.get(_IFA_LOCAL) or attrs.get(_IFA_ADDRESS)
        if raw is None or len(raw) != 4:
            continue
        label = attrs.get(_IFA_LABEL, b"").split(b"\0", 1)[0].decode("utf-8", "replace")
        found.append((index, socket.inet_ntoa(raw), prefix, label))
    return found, done


def ipv4_addresses(timeout: float = 2.0) -> list[tuple[str, str, int]]:
    """``(interface name, IPv4 address, prefix length)`` for every address, in the kernel's order.

    Raises ``NetlinkError`` (an ``OSError``) where netlink is unavailable.
    """
    sequence = 1
    request = _NLMSG.pack(_NLMSG.size + _IFADDRMSG.size, _RTM_GETADDR,
                          _NLM_F_REQUEST | _NLM_F_DUMP, sequence, 0)
    request += _IFADDRMSG.pack(socket.AF_INET, 0, 0, 0, 0)
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    except (AttributeError, OSError) as exc:  # not Linux, or no netlink here
        raise NetlinkError(f"netlink unavailable: {exc}") from None
    with sock:
        sock.settimeout(timeout)
        sock.sendto(request, (0, 0))
        result: list[tuple[str, str, int]] = []
        done = False
        while not done:
            found, done = parse_dump(sock.recv(65536), sequence)
            for index, address, prefix, label in found:
                result.append((_name(index) or label.split(":", 1)[0], address, prefix))
    return result


def _name(index: int) -> Optional[str]:
    try:
        return socket.if_indextoname(index)
    except OSError:
        return None
