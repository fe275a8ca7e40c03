"""ZRE UDP beacons: broadcast on the interface's subnet, and unicast to seeds.

The first beacon goes out at once, then one every ``interval``; a port-0
beacon says the node is leaving. Broadcast beacons are accepted only from the
interface's own network (so a node on loopback ignores the LAN and the other
way round); beacons sent to this host's own address (unicast, from nodes that
use it as a seed) are accepted from anywhere, because seeds are how nodes on
networks without broadcast find each other. A node always listens, so any
node can serve as a seed.

A port-0 beacon is passed on with the address it came from: the node heeds
it only from the peer's own address, so a forged one cannot cut a peer off.
A flood of datagrams is read in batches of ``_BATCH``; between two, the
listener waits until the hub is idle (``gevent.idle``), so that everything
else ready, the mailbox first, runs before the next batch. (``gevent.sleep(0)``
would not do: it lets other greenlets run but not the hub poll for I/O, so a
mailbox message would wait for tens of milliseconds behind a flood.)
"""

from __future__ import annotations

import itertools
import logging
import socket
from typing import Optional, Sequence

import gevent

from ..errors import ProtocolError
from ..wire import zre
from . import PeerSink

__all__ = ["BeaconDiscovery", "parse_seed"]

log = logging.getLogger(__name__)

_IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)  # Linux's value; Python 3.12 names it
_BATCH = 16  # datagrams read before the listener lets the rest of the hub run


def parse_seed(text: str, default_port: int) -> tuple[str, int]:
    """``host[:port]`` as ``(ipv4, port)``; ValueError with the reason otherwise."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = text, str(default_port)
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"seed {text!r}: port {port_text!r} is not a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"seed {text!r}: port must be 1..65535")
    try:
        address = socket.gethostbyname(host)
    except OSError:
        raise ValueError(f"seed {text!r}: cannot resolve host {host!r}") from None
    return address, port


class BeaconDiscovery:
    """Sends and hears ZRE beacons on the node's beacon port."""

    def __init__(self, broadcast: bool = True, seeds: Sequence[tuple[str, int]] = ()) -> None:
        self.broadcast = broadcast
        self.seeds = list(seeds)
        self._node: Optional[PeerSink] = None
        self._socket: Optional[socket.socket] = None
        self._greenlets: list[gevent.Greenlet] = []

    def start(self, node: PeerSink) -> None:
        self._node = node
        self._socket = node.transport.beacon_socket(node.config.port)
        self._send(node.mailbox_port)
        self._greenlets = [gevent.spawn(self._sender), gevent.spawn(self._listener)]

    def stop(self) -> None:
        if self._socket is None:
            return
        try:
            self._send(0)
        finally:
            gevent.killall(self._greenlets)
            self._socket.close()
            self._socket = None

    def _targets(self) -> list[tuple[str, int]]:
        assert self._node is not None and self._node.interface is not None
        targets = [(self._node.interface.broadcast, self._node.config.port)] if self.broadcast else []
        return targets + self.seeds

    def _send(self, port: int) -> None:
        node = self._node
        assert node is not None and self._socket is not None
        data = zre.encode_beacon(zre.Beacon(node.uuid.bytes, port, node.public_key))
        for target in self._targets():
            try:
                self._socket.sendto(data, target)
            except OSError as exc:
                log.debug("cannot send beacon to %s:%d: %s", target[0], target[1], exc)

    def _sender(self) -> None:
        node = self._node
        assert node is not None
        while True:
            node.transport.sleep(node.config.interval)
            self._send(node.mailbox_port)

    def _listener(self) -> None:
        node = self._node
        assert node is not None and self._socket is not None and node.interface is not None
        own = node.uuid.bytes
        interface = node.interface
        sock = self._socket
        sock.setsockopt(socket.IPPROTO_IP, _IP_PKTINFO, 1)
        ancillary = socket.CMSG_SPACE(12)
        broadcast = socket.inet_aton(interface.broadcast)
        version = 1 if node.public_key is None else 3  # a node with a key hears only keys
        for count in itertools.count(1):
            if not count % _BATCH:
                gevent.idle()  # a flood of datagrams: everything else ready runs first
            data, cmsgs, _, (address, _) = sock.recvmsg(64, ancillary)
            unicast = _unicast(cmsgs, broadcast)
            try:
                beacon = zre.decode_beacon_cached(data, version)
            except ProtocolError as exc:
                log.debug("dropped datagram from %s: %s", address, exc.reason)
                continue
            if beacon.uuid == own:
                continue
            if not unicast and address not in interface:
                log.debug("ignored beacon from %s, outside %s", address, interface.network)
                continue
            uuid = zre.uuid_of(beacon.uuid)
            if beacon.port == 0:
                node.peer_left(uuid, address, beacon.key)
            else:
                node.peer_appeared(uuid, f"tcp://{address}:{beacon.port}", beacon.key)


def _unicast(cmsgs: list[tuple[int, int, bytes]], broadcast: bytes) -> bool:
    """True when IP_PKTINFO says the datagram was addressed to a host, not a broadcast."""
    for level, kind, data in cmsgs:
        if level == socket.IPPROTO_IP and kind == _IP_PKTINFO and len(data) >= 12:
            destination = data[8:12]  # struct in_pktinfo: ifindex, spec_dst, addr
            return destination not in (broadcast, b"\xff\xff\xff\xff")
    return False
