"""Choosing the network interface a node beacons and listens on.

An interface can be named by its name (``eth0``, ``lo``), by one of its IPv4
addresses (``10.0.0.5``) or by a network in CIDR form (``10.0.0.0/24``). With
no choice, the first interface that is up, not loopback and has an IPv4
broadcast address is used; a host with none of those falls back to loopback,
where beacons go to 127.255.255.255 so several nodes on one host still mesh.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Optional

from ..errors import InterfaceError
from .netlink import ipv4_addresses

__all__ = ["Interface", "list_interfaces", "select_interface"]

log = logging.getLogger(__name__)

_IFF_UP = 0x1
_IFF_BROADCAST = 0x2
_IFF_LOOPBACK = 0x8


@dataclass(frozen=True, slots=True)
class Interface:
    """One IPv4 address of one network interface."""

    name: str
    address: str
    network: ipaddress.IPv4Network
    up: bool = True
    can_broadcast: bool = True
    #: the network's mask and address as integers (every beacon is checked against them)
    _mask: int = field(init=False, repr=False, compare=False)
    _base: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_mask", int(self.network.netmask))
        object.__setattr__(self, "_base", int(self.network.network_address))

    @property
    def loopback(self) -> bool:
        """True for 127.0.0.0/8."""
        return self.network.is_loopback

    @property
    def broadcast(self) -> str:
        """Where beacons go: the subnet's broadcast address (127.255.255.255 on loopback)."""
        if self.network.prefixlen >= 31:
            return "255.255.255.255"
        return str(self.network.broadcast_address)

    def __contains__(self, address: str) -> bool:
        """True when ``address`` (an IPv4 string) lies in this interface's network."""
        try:
            value = int.from_bytes(socket.inet_aton(address), "big")
        except (OSError, TypeError):
            return False
        return value & self._mask == self._base


def _flags(name: str) -> int:
    try:
        with open(f"/sys/class/net/{name}/flags") as f:
            return int(f.read().strip(), 16)
    except (OSError, ValueError):
        return _IFF_UP | _IFF_BROADCAST


def list_interfaces() -> list[Interface]:
    """Every IPv4 address of every interface, in the system's order."""
    result = []
    for name, address, prefix in _addresses():
        flags = _flags(name)
        network = ipaddress.IPv4Network(f"{address}/{prefix}", strict=False)
        result.append(Interface(name, address, network, bool(flags & _IFF_UP),
                                bool(flags & _IFF_BROADCAST) or network.is_loopback))
    return result


def _addresses() -> list[tuple[str, str, int]]:
    try:
        return ipv4_addresses()  # Linux: netlink, standard library only
    except OSError as exc:
        log.debug("netlink: %s; listing interfaces with ifaddr", exc)
    import ifaddr  # elsewhere; imported on first use, as it loads ctypes

    return [(adapter.name, ip.ip, ip.network_prefix) for adapter in ifaddr.get_adapters()
            for ip in adapter.ips if isinstance(ip.ip, str)]


def select_interface(choice: Optional[str] = None) -> Interface:
    """The interface for ``choice`` (name, IPv4 address or CIDR), or the default.

    ``choice`` falls back to ``$PEERMESH_INTERFACE``. Raises ``InterfaceError``
    with the list of what exists when nothing matches.
    """
    choice = choice or os.environ.get("PEERMESH_INTERFACE") or None
    interfaces = list_interfaces()
    if choice is None:
        for itf in interfaces:
            if itf.up and itf.can_broadcast and not itf.loopback:
                return itf
        for itf in interfaces:
            if itf.loopback:
                log.info("no non-loopback IPv4 interface is up; using loopback %s", itf.name)
                return itf
        raise InterfaceError("no IPv4 interface found")
    match = _match(choice, interfaces)
    if match is None:
        known = ", ".join(f"{i.name} ({i.address}/{i.network.prefixlen})" for i in interfaces)
        raise InterfaceError(f"no IPv4 interface matches {choice!r}; available: {known or 'none'}")
    if not match.up:
        raise InterfaceError(f"interface {match.name} is down")
    return match


def _match(choice: str, interfaces: list[Interface]) -> Optional[Interface]:
    for itf in interfaces:
        if itf.name == choice or itf.address == choice:
            return itf
    try:
        network = ipaddress.IPv4Network(choice, strict=False)
    except ValueError:
        return None
    for itf in interfaces:
        if ipaddress.IPv4Address(itf.address) in network:
            return itf
    return None
