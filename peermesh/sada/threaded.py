"""Channels and servers for threaded programs, on a ``ThreadedNode``'s hub.

The overlay objects live on the node's hub thread; these facades hand every
call to it with ``ThreadedNode.call`` and block the calling thread until the
answer, so any number of threads may share one channel. ::

    channel = ThreadedChannel(interface="lo")          # binds now: the endpoint is known
    with ThreadedNode("driver", interface="lo", headers=channel.headers) as node:
        channel.start(node)
        print(channel.request("echo", "echo", {"x": 1}))
        future = channel.request_async("echo", "echo", 2)   # concurrent.futures.Future
        channel.stop()

Handlers of a ``ThreadedServer`` run on the node's hub thread, as greenlets:
they must not block that thread (use ``gevent`` calls, or hand CPU-bound or
blocking work to ``gevent.get_hub().threadpool``).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Callable, Iterable, Optional

from ..errors import NodeStateError
from .channel import HEADER_CHANNEL, HEADER_ROLES, HEADER_SERVER, Channel, ServerInfo
from .handlers import Service
from .server import Server

__all__ = ["ThreadedChannel", "ThreadedServer"]


class ThreadedChannel:
    """A ``Channel`` usable from any thread; it runs on a ``ThreadedNode``'s hub.

    The ROUTER is bound when this object is made (keyword settings are
    ``Channel``'s without a node: ``interface``, ``address`` and ``port``, or
    ``endpoint``, and the timing settings), so that ``headers`` can go into
    the ``ThreadedNode``'s HELLO.
    """

    def __init__(self, **settings: Any) -> None:
        # Binding needs no hub: the channel is made here, in the caller's thread,
        # and used only on the node's hub from start() on.
        self._channel = Channel(**settings)
        self.endpoint = self._channel.endpoint
        self._node: Any = None
        self._started = False

    @property
    def headers(self) -> dict[str, str]:
        """HELLO headers that advertise this channel (pass them to ``ThreadedNode``)."""
        return {HEADER_CHANNEL: self.endpoint, HEADER_ROLES: "sada-channel"}

    @property
    def id(self) -> str:
        """The channel's id (the prefix of its request ids)."""
        return self._channel.id

    def start(self, node: Any) -> "ThreadedChannel":
        """Start the channel on ``node``'s hub (a started ``ThreadedNode``)."""
        if self._started:
            raise NodeStateError("a channel starts once")
        channel = self._channel
        node.call(lambda _: channel.start())
        self._node = node
        self._started = True
        return self

    def _on_hub(self, fn: Callable[[Channel], Any]) -> Any:
        if not self._started:
            raise NodeStateError("the channel is not started; call start(node)")
        channel = self._channel
        return self._node.call(lambda _: fn(channel))

    def request(self, service: str, action: str, payload: Any = None, **options: Any) -> Any:
        """See ``Channel.request``; blocks this thread until the reply."""
        return self._on_hub(lambda ch: ch.request(service, action, payload, **options))

    def request_async(self, service: str, action: str, payload: Any = None,
                      **options: Any) -> "Future[Any]":
        """See ``Channel.request_async``; returns a ``concurrent.futures.Future``."""
        future: Future[Any] = Future()

        def done(result: Any) -> None:
            if result.successful():
                future.set_result(result.value)
            else:
                future.set_exception(result.exception)

        self._on_hub(lambda ch: ch.request_async(service, action, payload, **options)
                     .rawlink(done))
        return future

    def servers(self) -> list[ServerInfo]:
        """See ``Channel.servers``."""
        return self._on_hub(lambda ch: ch.servers())

    def services(self) -> dict[str, dict[str, list[str]]]:
        """See ``Channel.services``."""
        return self._on_hub(lambda ch: ch.services())

    def wait_for(self, service: str, version: Optional[str] = None, count: int = 1,
                 timeout: Optional[float] = None) -> bool:
        """See ``Channel.wait_for``."""
        return self._on_hub(lambda ch: ch.wait_for(service, version, count, timeout))

    @property
    def stats(self) -> dict[str, int]:
        """A copy of ``Channel.stats``."""
        return self._on_hub(lambda ch: dict(ch.stats))

    def stop(self) -> None:
        """Stop the channel (waiting requests fail with ``ChannelClosed``)."""
        if not self._started:
            self._channel.stop()  # never started: closes the socket
        elif self._node is not None and self._node.running:
            self._on_hub(lambda ch: ch.stop())


class ThreadedServer:
    """A ``Server`` usable from any thread; it runs on a ``ThreadedNode``'s hub.

    Register services or handlers before or after ``start(node)``; keyword
    settings are ``Server``'s (``channels``, ``max_concurrent``, ...).
    """

    headers = {HEADER_SERVER: "SADA1", HEADER_ROLES: "sada-server"}

    def __init__(self, *, services: Iterable[Service] = (), **settings: Any) -> None:
        self._services: list[Service] = list(services)
        self._settings = settings
        self._node: Any = None
        self._server: Optional[Server] = None

    def add_service(self, service: Service) -> Service:
        """See ``Server.add_service``."""
        if self._server is None:
            self._services.append(service)
            return service
        server = self._server
        return self._node.call(lambda _: server.add_service(service))

    def remove_service(self, name: str, version: str) -> None:
        """See ``Server.remove_service``."""
        if self._server is None:
            self._services = [s for s in self._services
                              if (s.name, s.version) != (name, version)]
            return
        server = self._server
        self._node.call(lambda _: server.remove_service(name, version))

    def handler(self, service: str, action: Optional[str] = None, version: str = "1.0",
                category: str = "", **options: Any
                ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """See ``Server.handler``."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if self._server is not None:
                server = self._server
                self._node.call(lambda _: server.handler(service, action, version, category,
                                                         **options)(fn))
                return fn
            for existing in self._services:
                if (existing.name, existing.version) == (service, version):
                    return existing.action(action, category, **options)(fn)
            new = Service(service, version)
            self._services.append(new)
            return new.action(action, category, **options)(fn)

        return register

    def start(self, node: Any) -> "ThreadedServer":
        """Start serving on ``node``'s hub (a started ``ThreadedNode``)."""
        if self._server is not None:
            raise NodeStateError("a server starts once")

        def make(hub_node: Any) -> Server:
            return Server(hub_node, services=self._services, **self._settings).start()

        self._node = node
        self._server = node.call(make)
        return self

    def catalog(self) -> list[Any]:
        """See ``Server.catalog``."""
        if self._server is None:
            return sorted({(s.name, s.version) for s in self._services})
        server = self._server
        return self._node.call(lambda _: server.catalog())

    def stop(self, grace: float = 1.0) -> None:
        """See ``Server.stop``."""
        if self._server is not None and self._node is not None and self._node.running:
            server = self._server
            self._node.call(lambda _: server.stop(grace))
