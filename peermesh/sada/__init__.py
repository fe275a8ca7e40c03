"""Safir-Darbaan (PIRAN/Safir-Darbaan v1) channels and servers on the peermesh mesh.

Request/reply for "a few clients, many servers", with no broker: a
``Channel`` asks for a service by name and version and gets the answer from
whichever ``Server`` offers it, chosen by load, with PING/PONG liveness and
failover. Servers find channels through the mesh (HELLO header
``X-PM-SADA-CHANNEL``) or are pointed at them. The wire format is
``peermesh.wire.sada``. ::

    from peermesh import Node
    from peermesh.sada import Channel, Server

    node = Node("both", interface="lo")
    channel = Channel(node)                 # before start: advertised in HELLO
    server = Server(node)

    @server.handler("calc", "add", version="1.2")
    def add(numbers):
        return sum(numbers)

    node.start(); channel.start(); server.start()
    assert channel.request("calc", "add", [1, 2], version="1.0") == 3
"""

from ..wire.sada import ServiceId, Status
from .channel import HEADER_CHANNEL, HEADER_SERVER, Channel
from .demo import echo_service
from .errors import (CatalogFull, ChannelClosed, EndpointError, NoServerError, RequestTimeout,
                     SadaError, ServerLost, ServiceError)
from .handlers import Reply, Request, Service
from .routing import ServerInfo
from .server import Server
from .threaded import ThreadedChannel, ThreadedServer
from .versions import choose_version, is_compatible, parse_version

__all__ = [
    "Channel", "Server", "Service", "Reply", "Request", "ServerInfo", "ServiceId", "Status",
    "ThreadedChannel", "ThreadedServer", "echo_service",
    "SadaError", "ServiceError", "NoServerError", "RequestTimeout", "ServerLost",
    "CatalogFull", "ChannelClosed", "EndpointError", "HEADER_CHANNEL", "HEADER_SERVER",
    "choose_version", "is_compatible", "parse_version",
]
