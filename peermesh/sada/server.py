"""The server role: serve services to every channel found on the mesh (or named).

How it works
------------
A server has one transient ROUTER (no identity, as the spec requires) and
connects it to every channel it knows of:

* channels on the mesh: a peer whose HELLO carries ``X-PM-SADA-CHANNEL`` is
  connected to on ENTER; when the peer EXITs, the connection is kept for
  ``forget_after`` seconds (a channel restarting at the same endpoint is
  picked up again by ZeroMQ's reconnection) and then closed;
* channels named directly (``Server(channels=[...])``, ``connect()``), which
  need no mesh at all, so a plain implementation of the spec can be served.

To address a channel a server needs its routing id. Before each connect the
server sets ZMQ_CONNECT_ROUTING_ID to the channel's endpoint, the identity
the spec gives channels: the connection is known by it at once, so the first
INTR is queued before the TCP handshake has even finished. (libzmq aborts
when a routing id is reused while its old connection is still being torn
down, so a channel connected to a second time after ``forget_after`` gets
``ENDPOINT#N`` as its local routing id; it never goes on the wire.)

The server INTRs its catalog (service name + version pairs) when it
connects, whenever a connection is (re-)established (socket monitor:
handshake succeeded, e.g. after the channel restarted), when it gets RINTR,
and to every channel whenever the catalog changes. It answers PING with
PONG, and every REQ with exactly one REP: 404/405/406 when it has no such
service, action or compatible version, otherwise what the handler makes of
it (see ``handlers``). A handler that raises gives a 500, never a dead server.

Where handlers run: by default each request runs in a greenlet of its own,
taken from a pool of reusable ones and switched to at once, so it may block
cooperatively (sleep, I/O, waiting on other requests) while the server
serves others. A handler registered ``inline=True`` runs in the reader
itself, on the hub, with no switch at all: the fastest way, for handlers that
never block (pure computation on the payload). An inline handler that does
try to block fails with gevent's ``BlockingSwitchOutError`` (a 500), and one
that computes for long delays every other request of the server; so
``inline`` is an explicit promise, never guessed.

What each message asks for is decided by ``serving.ServerCore``, a sans-io
core on the contract of ``peermesh.core``, served by the one driver
(``peermesh.io.driver.Driver``) over the ROUTER (``peermesh.io.routed``): the
driver reads it in batches, hands each message to the core and carries out
what comes back (PONGs, INTRs and REPs as ``Send``, a channel to connect to as
``Dial``, one forgotten as ``Hangup``); a REQ comes out as a ``Deliver`` of its
job (a batch's usual REQs as the jobs themselves, straight from the reader:
``ServerCore.job_each``), which this module runs (``workers``) and whose outcome
it gives back to the core. While stopping, the server INTRs an empty catalog,
answers new REQs with 503 (channels send those elsewhere) and lets running
handlers finish for up to ``grace`` seconds.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, Optional, Union

import gevent
import zmq

from ..core import Output
from ..errors import PeermeshError
from ..events import Event, EventType
from ..io import shared_context
from ..io.driver import Driver
from ..io.routed import ConnectingRouter, RoutedTransport, connecting_router
from ..io.transport import ZmqTransport
from ..overlay import Lifecycle, Overlay
from ..wire.sada import ServiceId
from ..wire.zre import PUBLIC_KEY_HEADER
from . import _transport
from .channel import HEADER_CHANNEL, HEADER_SERVER
from .endpoints import Network, as_endpoints, as_networks, check_endpoint
from .handlers import Service, call, finish
from .routing import MAX_SERVICES
from .serving import Job, ServerCore
from .workers import Workers

__all__ = ["Server"]

log = logging.getLogger(__name__)

_MAX_FRAMES = 16  # a REQ has 9; PING, RINTR 3: anything longer is not for a server
_LINGER = 0.2     # seconds a stopped server's last REPs and empty INTR may take to leave
#: requests a server runs at once by default; more get 503 (channels go elsewhere)
MAX_CONCURRENT = 1024


class Server(Overlay):
    """A Safir-Darbaan server: offers services to channels.

    ``Server(node)`` finds channels on the mesh through ``node`` (made before
    ``node.start()``, it attaches to the node and advertises
    ``X-PM-SADA-SERVER``; made on a running node, it only listens);
    ``channels`` names channel endpoints to connect to directly (no node
    needed; each is checked at once, see ``endpoints``). Add services with
    ``add_service`` or the ``handler`` decorator, then ``start()`` on the hub
    that runs the node.

    Settings: ``max_concurrent`` (requests running at once before new ones
    get 503; None: no limit), ``max_services`` (services the catalog may
    hold: channels drop a longer INTR unread, so ``add_service`` past it
    raises ``CatalogFull``), ``channel_networks`` (networks, in CIDR form,
    a channel named in a peer's HELLO must be in; by default the network of
    the node's interface; channels named directly are not checked),
    ``forget_after`` (seconds a channel that left the mesh stays connected),
    ``heartbeat`` (ZMTP heartbeat interval on the connections, so a channel
    behind a pulled cable is noticed and reconnected), ``max_message``
    (largest message accepted, octets).
    """

    roles = ("sada-server",)

    def __init__(self, node: Any = None, *, channels: Iterable[str] = (),
                 services: Iterable[Service] = (),
                 max_concurrent: Optional[int] = MAX_CONCURRENT,
                 max_services: int = MAX_SERVICES,
                 channel_networks: Optional[Iterable[str]] = None,
                 forget_after: float = 10.0, heartbeat: float = 1.0,
                 max_message: int = 64 * 1024 * 1024, context: Optional[zmq.Context] = None,
                 channel_keys: Optional[dict[str, str]] = None) -> None:
        super().__init__()
        self._direct = as_endpoints(channels)
        #: endpoint -> Z85 public key of channels outside the mesh, for a node with keys
        #: (a mesh channel's key is its node's authenticated X-PUBLICKEY)
        self._channel_keys = dict(channel_keys or {})
        self._curve = getattr(node, "curve", None)
        if max_concurrent is not None and not max_concurrent >= 1:
            raise ValueError(f"max_concurrent must be at least 1 (or None), not {max_concurrent!r}")
        if not max_services >= 1:
            raise ValueError(f"max_services must be at least 1, not {max_services!r}")
        self._networks: Optional[list[Network]] = (
            None if channel_networks is None else as_networks(channel_networks))
        # (every message it sends names its channel first: sent as it is)
        self._core = ServerCore(max_concurrent=max_concurrent, max_services=max_services,
                                forget_after=forget_after, addressed=True)
        #: refusals by limit: ``max_concurrent`` (REQs answered 503), ``channel_networks``
        #: (channel endpoints from the mesh outside them, or not tcp://IP:PORT)
        self.limits = self._core.limits
        #: counters: requests, replies, errors (status >= 400), busy (503), intr_sent,
        #: dropped (malformed or unexpected messages), unsent (REPs that found no channel)
        self.stats: dict[str, int] = self._core.stats
        self._heartbeat = heartbeat
        self._max_message = max_message
        self._context = context or shared_context()
        self._router: Optional[ConnectingRouter] = None
        self._driver: Optional[Driver] = None
        self._workers: Optional[Workers] = None
        self._watcher: Optional[gevent.Greenlet] = None
        for service in services:
            self.add_service(service)
        if node is not None:
            if node.running:
                self.node = node    # too late to advertise: find channels only
            else:
                self.attach(node)

    # --- settings (the core's) ------------------------------------------------

    @property
    def max_concurrent(self) -> Optional[int]:
        """Requests running at once before new ones get 503 (None: no limit)."""
        return self._core.max_concurrent

    @max_concurrent.setter
    def max_concurrent(self, value: Optional[int]) -> None:
        self._core.max_concurrent = value

    @property
    def max_services(self) -> int:
        """Services the catalog may hold."""
        return self._core.max_services

    @property
    def forget_after(self) -> float:
        """Seconds a channel that left the mesh stays connected."""
        return self._core.forget_after

    @forget_after.setter
    def forget_after(self, value: float) -> None:
        self._core.forget_after = value

    @property
    def _generations(self) -> dict[str, int]:
        """How many times each endpoint was connected to (a fresh routing id each)."""
        return self._core.generations

    # --- services -------------------------------------------------------------

    def add_service(self, service: Service) -> Service:
        """Serve ``service`` (replacing one of the same name and version); INTRs if running."""
        if not isinstance(service, Service):
            raise TypeError(f"not a Service: {service!r}")
        self._apply(self._core.add_service(service))
        return service

    def remove_service(self, name: str, version: str) -> None:
        """Stop serving ``name`` ``version``; INTRs if running. KeyError if not served."""
        self._apply(self._core.remove_service(name, version))

    def service(self, name: str, version: str = "1.0") -> Service:
        """The served ``Service`` of that name and version, created (and served) if new."""
        existing = self._core.catalog.get(name, {}).get(version)
        return existing if existing is not None else self.add_service(Service(name, version))

    def handler(self, service: str, action: Optional[str] = None, version: str = "1.0",
                category: str = "", *, raw: bool = False, inline: bool = False,
                request: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: serve the function as ``service`` ``version`` ``category``/``action``.

        ::

            @server.handler("calc", "add", version="1.2", category="math")
            def add(numbers):
                return sum(numbers)

        See ``Service.action`` for ``raw``, ``inline`` and ``request``.
        """
        return self.service(service, version).action(action, category, raw=raw, inline=inline,
                                                     request=request)

    def catalog(self) -> list[ServiceId]:
        """The (name, version) pairs INTRed to channels, sorted."""
        return self._core.services()

    # --- the overlay contract ---------------------------------------------------

    def headers(self) -> dict[str, str]:
        """The HELLO header of a server's node: the protocol it speaks."""
        return {HEADER_SERVER: "SADA1"}

    def start(self) -> "Server":
        """Open the socket, connect to the known channels and start serving (current hub)."""
        if self.lifecycle is Lifecycle.NEW:
            self.lifecycle = Lifecycle.ATTACHED   # on its own, or on a node already running
        return super().start()

    def on_start(self) -> None:
        if self._curve is None and self.node is not None:
            self._curve = getattr(self.node, "curve", None)
        options: dict[int, Union[int, bytes]] = {zmq.SNDHWM: 100_000, zmq.RCVHWM: 100_000, zmq.RECONNECT_IVL: 100,
                   zmq.RECONNECT_IVL_MAX: 500}
        if self._heartbeat:
            ivl = max(1, int(self._heartbeat * 1000))
            options.update({zmq.HEARTBEAT_IVL: ivl, zmq.HEARTBEAT_TIMEOUT: 3 * ivl})
        # with keys: a CURVE client of each channel's key (set per connection)
        transport = ZmqTransport(self._context, curve=self._curve)
        router = self._router = connecting_router(transport, options,
                                                  max_message=self._max_message,
                                                  max_frames=_MAX_FRAMES, linger=_LINGER)
        _transport.read_known(router.hub, self._core.known_frames)
        self._workers = Workers(gevent.get_hub())
        self._core.serving = True
        # a batch's usual REQs go from the reader to their handlers in one call
        # (``ServerCore.job_each``: no outputs made)
        self._driver = Driver(self._core, RoutedTransport(transport, router, addressed=True),
                              on_deliver=self._run_job, on_send_failed=self._unsent,
                              look_once=True, batch_clock=True,
                              delivery_each=self._core.job_each, addressed=True,
                              name="Safir-Darbaan server")
        self._watcher = gevent.spawn(_transport.read_monitor,
                                     router.monitor(zmq.EVENT_HANDSHAKE_SUCCEEDED),
                                     self._on_monitor)
        self._driver.listen(router)
        for endpoint in self._direct:
            self._link(endpoint, direct=True)
        node = self.node
        if node is not None:
            node.add_listener(self._on_event, messages=False)
            own = node.headers.get(HEADER_CHANNEL)
            if own and self._curve is not None:
                self._channel_keys.setdefault(own, self._curve.public.decode())
            if own:
                self._link(own, direct=True)  # the node is a channel too
            for peer in node.peers():
                try:
                    advertised = node.peer_header_value(peer, HEADER_CHANNEL)
                except Exception:  # the peer left meanwhile
                    continue
                if advertised:
                    self._link(advertised, owner=peer)

    def stop(self, grace: float = 1.0) -> None:
        """Leave: INTR an empty catalog, refuse new REQs (503), let handlers finish
        for up to ``grace`` seconds, then close."""
        super().stop(grace)

    def on_stop(self, timeout: float) -> None:
        self._uncork()   # (the replies made before the empty INTR go before it)
        self._apply(self._core.stop())
        workers = self._workers
        assert workers is not None and self._router is not None and self._driver is not None
        if workers.busy:
            workers.wait(timeout)
        workers.kill()
        self._core.closed = True
        if self.node is not None:
            try:
                self.node.remove_listener(self._on_event)
            except ValueError:
                pass
        # the monitor before its reader; the router, with its linger (the last REPs and
        # the empty INTR go out), before the driver (its links, its timer)
        self._uncork()
        self._router.stop_monitor()
        if self._watcher is not None:
            self._watcher.kill()
        self._router.close()
        self._driver.close()

    def __enter__(self) -> "Server":
        return self.start() if self.lifecycle is Lifecycle.NEW else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what the driver hands over -----------------------------------------------

    def _apply(self, outputs: list[Output]) -> None:
        """Have the driver carry out what the core returned (nothing before start or
        after stop: there are no channels then)."""
        driver = self._driver
        if outputs and driver is not None and not driver.closed:
            driver.apply(outputs)

    def _run_job(self, job: Job) -> None:
        """A ``Deliver``: run the job's handler here (``inline``) or in a worker."""
        handler = job.handler
        if handler.inline:
            result: Any = call(handler, job.payload, job.request)
            if type(result) is tuple:
                self._cork(self._core.reply(job, *result))
            else:
                result.rawlink(lambda done: self._cork(
                    self._core.reply(job, *finish(handler, done))))
        else:
            assert self._workers is not None
            self._workers.run(self._work, job)

    def _work(self, job: Job) -> None:
        handler = job.handler
        result = call(handler, job.payload, job.request)
        if type(result) is not tuple:
            result = finish(handler, result)
        self._cork(self._core.reply(job, *result))

    def _cork(self, outputs: list[Output]) -> None:
        """A handler's reply: the driver holds it (``Driver.cork``), so the replies of one
        hub turn (of the handlers one batch of REQs ran, say) go out together."""
        driver = self._driver
        if outputs and driver is not None and not driver.closed:
            driver.cork(outputs)

    def _uncork(self) -> None:
        """Send the replies the driver holds now."""
        if self._driver is not None:
            self._driver.uncork()

    def _unsent(self, alias: Any, frames: Any, error: BaseException) -> None:
        self._core.unsent(frames)

    # --- channels -------------------------------------------------------------

    def connect(self, endpoint: str, key: Optional[str] = None) -> None:
        """Serve the channel at ``endpoint`` (``tcp://host:port``), mesh or not; ``key``: the
        Z85 public key of its node, needed by a server whose node has keys."""
        check_endpoint(endpoint)
        if key is not None:
            self._channel_keys[endpoint] = key
        if endpoint not in self._direct:
            self._direct.append(endpoint)
        if self.running:
            self._link(endpoint, direct=True)

    def channels(self) -> list[str]:
        """Endpoints of the channels this server is connected to."""
        return sorted(self._core.aliases)

    def _link(self, endpoint: str, *, direct: bool = False, owner: Any = None) -> None:
        core = self._core
        core.networks = self._mesh_networks()
        key = None
        if self._curve is not None and endpoint not in core.aliases:
            key = self._channel_keys.get(endpoint) or self._key_of(owner)
        self._apply(core.link(endpoint, time.monotonic(), direct=direct, owner=owner, key=key,
                              need_key=self._curve is not None))

    def _key_of(self, peer: Any) -> Optional[str]:
        """The X-PUBLICKEY of mesh peer ``peer`` (authenticated by its node), or None."""
        if peer is None or self.node is None:
            return None
        try:
            return self.node.peer_header_value(peer, PUBLIC_KEY_HEADER)
        except PeermeshError:  # the peer left meanwhile
            return None

    def _mesh_networks(self) -> list[Network]:
        """Where a channel named on the mesh may be: ``channel_networks``, else the node's."""
        if self._networks is not None:
            return self._networks
        interface = getattr(self.node, "interface", None)
        return [interface.network] if interface is not None else []

    def _on_event(self, event: Event) -> None:
        """Node listener: channels appear (ENTER) and go (EXIT) with mesh peers."""
        if not self.running:
            return
        if event.type is EventType.ENTER:
            endpoint = (event.headers or {}).get(HEADER_CHANNEL)
            if endpoint:
                self._link(endpoint, owner=event.peer)
        elif event.type is EventType.EXIT:
            self._core.peer_left(event.peer, time.monotonic())
            assert self._driver is not None
            self._driver.apply([])   # (re-arms its timer for the forgetting)

    def _on_monitor(self, event: int, endpoint: str) -> None:
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED and self.running:
            self._apply(self._core.connected(endpoint))

    def __repr__(self) -> str:
        return (f"<Server {self.lifecycle.value} services={len(self.catalog())} "
                f"channels={len(self._core.endpoints)}>")
