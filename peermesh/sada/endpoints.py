"""Channel endpoints, checked before anything is bound or connected.

One function (``check_endpoint``) holds the whole policy, so a bind policy
shared by every socket can take its place.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Iterable, Optional, Sequence

from ..io.endpoints import Network, peer_endpoint
from ..io.endpoints import as_networks as io_networks
from .errors import EndpointError

__all__ = ["check_endpoint", "as_endpoints", "as_networks", "mesh_endpoint", "MAX_ENDPOINT"]

#: longest endpoint accepted, octets of text (it is a channel's routing identity)
MAX_ENDPOINT = 255
#: every address
ANY = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))


def check_endpoint(endpoint: object, *, bind: bool = False) -> str:
    """``endpoint`` if it is ``tcp://HOST:PORT`` (port 1-65535, a host that resolves) or
    ``ipc://PATH``; ``EndpointError`` naming what is wrong otherwise.

    ``bind``: it is to be bound as a channel's identity, so a wildcard host
    (``*``, ``0.0.0.0``) is refused too.
    """
    if not isinstance(endpoint, str):
        raise EndpointError(f"a channel endpoint must be a str, not {type(endpoint).__name__}")
    if len(endpoint.encode("utf-8", "replace")) > MAX_ENDPOINT:
        raise EndpointError(f"channel endpoint {endpoint[:40]!r}... is over {MAX_ENDPOINT} octets")
    if endpoint.startswith("ipc://"):
        if len(endpoint) == 6:
            raise EndpointError(f"channel endpoint {endpoint!r} names no path")
        return endpoint
    if not endpoint.startswith("tcp://"):
        raise EndpointError(f"channel endpoint {endpoint!r} is not tcp://HOST:PORT or "
                            "ipc://PATH")
    host, sep, port = endpoint[6:].rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit():
        raise EndpointError(f"channel endpoint {endpoint!r} is not tcp://HOST:PORT")
    if not 1 <= int(port) <= 65535:
        raise EndpointError(f"channel endpoint {endpoint!r}: port {port} is outside 1-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host in ("*", "0.0.0.0", "::"):
        if bind:
            raise EndpointError(f"channel endpoint {endpoint!r}: a channel's identity is its "
                                "public endpoint, so bind a concrete address, not a wildcard")
        raise EndpointError(f"channel endpoint {endpoint!r}: cannot connect to a wildcard")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        try:
            socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise EndpointError(f"channel endpoint {endpoint!r}: host {host!r} does not "
                                f"resolve ({getattr(exc, 'strerror', None) or exc})") from None
    return endpoint


def mesh_endpoint(endpoint: str, networks: Optional[Sequence[Network]] = None
                  ) -> Optional[str]:
    """``endpoint`` if a peer's HELLO may name it as a channel, else None: the
    rule of ``peermesh.io.endpoints.peer_endpoint``, any network if None."""
    return peer_endpoint(endpoint, ANY if networks is None else networks)


def as_networks(values: Iterable[str]) -> list[Network]:
    """Networks in CIDR form (``10.0.0.0/24``; a bare address is one host), checked."""
    try:
        return io_networks(values)
    except ValueError as exc:
        raise EndpointError(str(exc)) from None


def as_endpoints(values: Iterable[str]) -> list[str]:
    """Checked channel endpoints (see ``check_endpoint``), in order."""
    if isinstance(values, str):
        raise EndpointError(f"channel endpoints must be a list, not the str {values!r}")
    return [check_endpoint(value) for value in values]
