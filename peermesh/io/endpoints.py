"""Where sockets listen: one bind policy for every peermesh socket.

A socket binds either to an ephemeral port on a host or interface address
(``bind_ephemeral``: a random free port in %C000-%FFFF, the range ZRE asks
for mailboxes and Zyre uses) or to an endpoint the user gave (``bind``:
``tcp://HOST:PORT`` with a port in 1-65535, ``ipc://PATH`` or
``inproc://NAME``). Whatever cannot be bound - a port out of range, a host
that does not resolve to a local address, an endpoint in use or an ipc path
that cannot be made - raises ``BindError`` naming the endpoint and the reason,
before anything else starts. Both return the endpoint libzmq reports as bound
(``LAST_ENDPOINT``), which is the one to advertise.

Where a socket may connect when a peer names the endpoint (a HELLO header):
``peer_endpoint`` is the one rule every overlay applies, ``tcp://IP:PORT``
inside given networks, never ``ipc://`` or a host name.
"""

from __future__ import annotations

import errno
import ipaddress
import random
import time
from typing import Callable, Iterable, Optional, Sequence, Union

import gevent
import zmq

from ..errors import PeermeshError

__all__ = ["BindError", "Network", "as_networks", "bind", "bind_ephemeral", "check_endpoint",
           "peer_endpoint"]

#: ports ``bind_ephemeral`` picks from (ZRE: "a random port in the dynamic range")
EPHEMERAL_PORTS = range(0xC000, 0x10000)
#: seconds a given endpoint still in use is tried again: libzmq closes a listener in the
#: background, so an endpoint closed a moment ago in the same process is briefly busy
BUSY_WAIT = 1.0

#: longest endpoint a peer may name, octets of text
MAX_PEER_ENDPOINT = 255
#: a network in which endpoints peers name may be
Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

#: called with the endpoint just before each bind attempt (e.g. to set a routing id)
Prepare = Callable[[str], None]


class BindError(PeermeshError, ValueError):
    """A socket cannot listen at an endpoint; the message names it and says why.

    Also a ``ValueError``: the endpoint (or address) given cannot be used.
    ``in_use``: the endpoint is valid but something else holds it now (a
    runtime failure, exit code 1 on the command line, not a usage error).
    """

    def __init__(self, message: str, in_use: bool = False) -> None:
        super().__init__(message)
        self.in_use = in_use


def check_endpoint(endpoint: str) -> None:
    """Raise ``BindError`` unless ``endpoint`` is ``tcp://HOST:PORT`` (1-65535),
    ``ipc://PATH`` or ``inproc://NAME``."""
    if not isinstance(endpoint, str):
        raise BindError(f"endpoint {endpoint!r} is not a string")
    transport, sep, rest = endpoint.partition("://")
    if not sep or not rest:
        raise BindError(f"cannot bind {endpoint}: not TRANSPORT://ADDRESS "
                        "(tcp://HOST:PORT, ipc://PATH or inproc://NAME)")
    if transport in ("ipc", "inproc"):
        return
    if transport != "tcp":
        raise BindError(f"cannot bind {endpoint}: transport {transport!r} is not "
                        "tcp, ipc or inproc")
    host, sep, port = rest.rpartition(":")
    if not sep or not host:
        raise BindError(f"cannot bind {endpoint}: not tcp://HOST:PORT")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise BindError(f"cannot bind {endpoint}: port {port!r} is not in 1-65535")


def peer_endpoint(endpoint: str, networks: Sequence[Network]) -> Optional[str]:
    """``endpoint`` if a peer may name it for this node to connect to, else None.

    Only ``tcp://IP:PORT`` with a literal address (no name to resolve) and a
    port in 1-65535, the address in one of ``networks``: never ``ipc://``,
    which would point this node at a local socket such as the agent's.
    """
    if len(endpoint) > MAX_PEER_ENDPOINT or not endpoint.startswith("tcp://"):
        return None
    host, sep, port = endpoint[6:].rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        return None
    try:
        address = ipaddress.ip_address(host[1:-1] if host.startswith("[") else host)
    except ValueError:
        return None
    if address.is_unspecified or address.is_multicast:
        return None
    if not any(address in network for network in networks):
        return None
    return endpoint


def as_networks(values: Iterable[str]) -> list[Network]:
    """Networks in CIDR form (``10.0.0.0/24``; a bare address is one host), checked:
    ``ValueError`` naming the first that is not one."""
    if isinstance(values, str):
        raise ValueError(f"networks must be a list, not the str {values!r}")
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value, strict=False))
        except (ValueError, TypeError):
            raise ValueError(f"{value!r} is not a network (CIDR, e.g. 10.0.0.0/24)") from None
    return networks


def bind(sock: zmq.Socket, endpoint: str, prepare: Optional[Prepare] = None) -> str:
    """Bind ``sock`` at ``endpoint``; the endpoint bound, or ``BindError``.

    An endpoint in use is tried again for up to ``BUSY_WAIT`` seconds first.
    """
    check_endpoint(endpoint)
    deadline = time.monotonic() + BUSY_WAIT
    while True:
        try:
            return _bind_once(sock, endpoint, prepare)
        except zmq.ZMQError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                raise _error(endpoint, exc) from None
        gevent.sleep(0.01)


def bind_ephemeral(sock: zmq.Socket, address: str, prepare: Optional[Prepare] = None) -> str:
    """Bind ``sock`` to a random free port in %C000-%FFFF on ``address`` (an IPv4
    address, host name or interface name); the endpoint bound, or ``BindError``."""
    if not isinstance(address, str) or not address or ":" in address or "/" in address:
        raise BindError(f"cannot bind an ephemeral port on {address!r}: not a host address")
    for _ in range(1000):
        endpoint = f"tcp://{address}:{random.choice(EPHEMERAL_PORTS)}"
        try:
            return _bind_once(sock, endpoint, prepare)
        except zmq.ZMQError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise _error(f"an ephemeral port on {address}", exc) from None
    raise BindError(f"cannot bind an ephemeral port on {address}: no free port in "
                    f"{EPHEMERAL_PORTS.start}-{EPHEMERAL_PORTS.stop - 1}", in_use=True)


def _bind_once(sock: zmq.Socket, endpoint: str, prepare: Optional[Prepare]) -> str:
    if prepare is not None:
        prepare(endpoint)
    sock.bind(endpoint)
    bound = sock.getsockopt(zmq.LAST_ENDPOINT)
    return bound.decode() if isinstance(bound, bytes) else str(bound)


def _error(what: str, exc: zmq.ZMQError) -> BindError:
    reasons = {
        errno.EADDRINUSE: "the address is in use",
        errno.ENODEV: "the host does not resolve to an address of this machine",
        errno.EADDRNOTAVAIL: "the address is not one of this machine's",
        errno.EACCES: "permission denied",
        errno.ENOENT: "the directory does not exist",
        errno.EINVAL: "the endpoint is not valid",
    }
    reason = reasons.get(exc.errno or 0, str(exc))
    return BindError(f"cannot bind {what}: {reason} ({exc.strerror})",
                     in_use=exc.errno == errno.EADDRINUSE)
