"""Channels and servers for threaded programs, on a ``ThreadedNode``'s hub.

The overlay objects (``Channel``, ``Server``) live on the node's hub thread;
these handles hand every call to it with ``ThreadedNode.call`` and block the
calling thread until the answer, so any number of threads may share one
channel. ::

    channel = ThreadedChannel(interface="lo")          # binds now: the endpoint is known
    with ThreadedNode("driver", interface="lo", headers=channel.headers) as node:
        channel.start(node)
        print(channel.request("echo", "echo", {"x": 1}))
        future = channel.request_async("echo", "echo", 2)   # concurrent.futures.Future
        channel.stop()

They also follow the overlay contract (``attach``, ``start``, ``stop``, run
on the hub), so a ``ThreadedNode`` given them as ``overlays=[...]`` attaches
them before its node starts (a channel told no address then binds on the
node's interface) and starts and stops them with the node; ``start(node)``
then only connects the handle to that ``ThreadedNode`` for the calls. ::

    channel = ThreadedChannel()
    with ThreadedNode("driver", interface="lo", overlays=[channel]) as node:
        channel.start(node)
        print(channel.request("echo", "echo", {"x": 1}))

Handlers of a ``ThreadedServer`` run on the node's hub thread, as greenlets:
they must not block that thread (use ``gevent`` calls, or hand CPU-bound or
blocking work to ``gevent.get_hub().threadpool``).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Optional

from ..errors import NodeStateError
from ..overlay import ROLES_HEADER, Lifecycle
from .channel import HEADER_SERVER, Channel, ServerInfo
from .handlers import Service
from .server import Server

__all__ = ["ThreadedChannel", "ThreadedServer"]


class _OnHub:
    """What both handles share: the ``ThreadedNode`` they call through, and the hub thread."""

    def __init__(self) -> None:
        self._facade: Any = None          # the ThreadedNode given to start(node)
        self._hub_thread: Optional[int] = None

    def _started_on_hub(self) -> None:
        self._hub_thread = threading.get_ident()

    def _on_hub_thread(self) -> bool:
        return self._hub_thread == threading.get_ident()

    def _call(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(node)`` on the node's hub: directly when already there."""
        if self._facade is None:
            raise NodeStateError(f"the {self._kind} is not started; call start(node)")
        if self._on_hub_thread():
            return fn(None)
        return self._facade.call(fn)

    _kind = "overlay"


class ThreadedChannel(_OnHub):
    """A ``Channel`` usable from any thread; it runs on a ``ThreadedNode``'s hub.

    Keyword settings are ``Channel``'s without a node: ``interface``,
    ``address`` and ``port``, or ``endpoint``, and the timing settings. Told
    where, the ROUTER is bound when this object is made, so that ``headers``
    can go into the ``ThreadedNode``'s HELLO; told nowhere, it is bound when
    a ``ThreadedNode(overlays=[channel])`` attaches it, on that node's
    interface.
    """

    roles = Channel.roles
    _kind = "channel"

    def __init__(self, **settings: Any) -> None:
        super().__init__()
        # Binding needs no hub: the channel is made here, in the caller's thread,
        # and used only on the node's hub from start() on.
        self._channel = Channel(**settings)

    @property
    def endpoint(self) -> Optional[str]:
        """Where the channel is bound (None until it is)."""
        return self._channel.endpoint

    @property
    def headers(self) -> dict[str, str]:
        """HELLO headers that advertise this channel (pass them to ``ThreadedNode``)."""
        if self._channel.endpoint is None:
            raise NodeStateError(
                "ThreadedChannel() was told no interface, address or endpoint, so it is "
                "not bound yet: give the node's interface (ThreadedChannel(interface=...)) "
                "or pass it as ThreadedNode(..., overlays=[channel])")
        return {**self._channel.headers(), ROLES_HEADER: ",".join(self.roles)}

    @property
    def id(self) -> str:
        """The channel's id (the prefix of its request ids)."""
        return self._channel.id

    @property
    def lifecycle(self) -> Lifecycle:
        """Where the channel is in its life (see ``peermesh.overlay``)."""
        return self._channel.lifecycle

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._channel.running

    # --- the overlay contract, on the hub -----------------------------------

    def attach(self, node: Any) -> None:
        """Attach the channel to ``node`` (a ``Node``, on its hub, before it starts)."""
        self._channel.attach(node)

    def start(self, node: Any = None) -> "ThreadedChannel":
        """Start the channel on ``node``'s hub (a started ``ThreadedNode``) and make
        calls through it. Without ``node``: start it here, on the hub (what a
        ``ThreadedNode`` given ``overlays=[channel]`` does)."""
        channel = self._channel
        if node is None:
            channel.start()
            self._started_on_hub()
            return self
        if self._facade is not None:
            raise NodeStateError("a channel starts once")

        def begin(_: Any) -> None:
            if not channel.running:
                channel.start()
            self._started_on_hub()

        node.call(begin)
        self._facade = node
        return self

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the channel (waiting requests fail with ``ChannelClosed``)."""
        channel = self._channel
        if not channel.running or self._on_hub_thread():
            channel.stop(timeout)    # never started (closes the socket), or on the hub
        elif self._facade is not None and self._facade.running:
            self._facade.call(lambda _: channel.stop(timeout))

    # --- calls, from any thread ---------------------------------------------

    def request(self, service: str, action: str, payload: Any = None, **options: Any) -> Any:
        """See ``Channel.request``; blocks this thread until the reply."""
        channel = self._channel
        return self._call(lambda _: channel.request(service, action, payload, **options))

    def request_async(self, service: str, action: str, payload: Any = None,
                      **options: Any) -> "Future[Any]":
        """See ``Channel.request_async``; returns a ``concurrent.futures.Future``."""
        future: Future[Any] = Future()

        def done(result: Any) -> None:
            if result.successful():
                future.set_result(result.value)
            else:
                future.set_exception(result.exception)

        channel = self._channel
        self._call(lambda _: channel.request_async(service, action, payload, **options)
                   .rawlink(done))
        return future

    def servers(self) -> list[ServerInfo]:
        """See ``Channel.servers``."""
        channel = self._channel
        return self._call(lambda _: channel.servers())

    def services(self) -> dict[str, dict[str, list[str]]]:
        """See ``Channel.services``."""
        channel = self._channel
        return self._call(lambda _: channel.services())

    def wait_for(self, service: str, version: Optional[str] = None, count: int = 1,
                 timeout: Optional[float] = None) -> bool:
        """See ``Channel.wait_for``."""
        channel = self._channel
        return self._call(lambda _: channel.wait_for(service, version, count, timeout))

    @property
    def stats(self) -> dict[str, int]:
        """A copy of ``Channel.stats``."""
        channel = self._channel
        return self._call(lambda _: dict(channel.stats))


class ThreadedServer(_OnHub):
    """A ``Server`` usable from any thread; it runs on a ``ThreadedNode``'s hub.

    Register services or handlers before or after ``start(node)``; keyword
    settings are ``Server``'s (``channels``, ``max_concurrent``, ...).
    """

    roles = Server.roles
    _kind = "server"
    #: HELLO headers that advertise a server (pass them to ``ThreadedNode``)
    headers = {HEADER_SERVER: "SADA1", ROLES_HEADER: ",".join(Server.roles)}

    def __init__(self, *, services: Iterable[Service] = (), **settings: Any) -> None:
        super().__init__()
        self._services: list[Service] = list(services)
        self._settings = settings
        self._server: Optional[Server] = None

    @property
    def lifecycle(self) -> Lifecycle:
        """Where the server is in its life (see ``peermesh.overlay``)."""
        return Lifecycle.NEW if self._server is None else self._server.lifecycle

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._server is not None and self._server.running

    def _make(self, node: Any) -> Server:
        """The ``Server`` itself, made on the hub (attached to ``node`` if not started)."""
        if self._server is None:
            self._server = Server(node, services=self._services, **self._settings)
        return self._server

    # --- the overlay contract, on the hub -----------------------------------

    def attach(self, node: Any) -> None:
        """Attach the server to ``node`` (a ``Node``, on its hub, before it starts)."""
        if self._server is not None:
            raise NodeStateError("a server attaches once")
        self._make(node)

    def start(self, node: Any = None) -> "ThreadedServer":
        """Start serving on ``node``'s hub (a started ``ThreadedNode``) and make calls
        through it. Without ``node``: start it here, on the hub (what a
        ``ThreadedNode`` given ``overlays=[server]`` does)."""
        if node is None:
            if self._server is None:
                raise NodeStateError("attach the server to a node first")
            self._server.start()
            self._started_on_hub()
            return self
        if self._facade is not None:
            raise NodeStateError("a server starts once")

        def begin(hub_node: Any) -> None:
            server = self._make(hub_node)
            if not server.running:
                server.start()
            self._started_on_hub()

        node.call(begin)
        self._facade = node
        return self

    def stop(self, grace: float = 1.0) -> None:
        """See ``Server.stop``."""
        server = self._server
        if server is None or not server.running:
            return
        if self._on_hub_thread():
            server.stop(grace)
        elif self._facade is not None and self._facade.running:
            self._facade.call(lambda _: server.stop(grace))

    # --- calls, from any thread ---------------------------------------------

    def add_service(self, service: Service) -> Service:
        """See ``Server.add_service``."""
        server = self._server
        if server is None:
            self._services.append(service)
            return service
        return self._call(lambda _: server.add_service(service))

    def remove_service(self, name: str, version: str) -> None:
        """See ``Server.remove_service``."""
        server = self._server
        if server is None:
            self._services = [s for s in self._services
                              if (s.name, s.version) != (name, version)]
            return
        self._call(lambda _: server.remove_service(name, version))

    def handler(self, service: str, action: Optional[str] = None, version: str = "1.0",
                category: str = "", **options: Any
                ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """See ``Server.handler``."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            server = self._server
            if server is not None:
                self._call(lambda _: server.handler(service, action, version, category,
                                                    **options)(fn))
                return fn
            for existing in self._services:
                if (existing.name, existing.version) == (service, version):
                    return existing.action(action, category, **options)(fn)
            new = Service(service, version)
            self._services.append(new)
            return new.action(action, category, **options)(fn)

        return register

    def catalog(self) -> list[Any]:
        """See ``Server.catalog``."""
        server = self._server
        if server is None:
            return sorted({(s.name, s.version) for s in self._services})
        return self._call(lambda _: server.catalog())
