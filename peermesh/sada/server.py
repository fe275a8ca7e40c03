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

The common REQ (a service, version and action the server has seen before)
is handled without decoding its text frames: the service is found by its
name and version frames (a cache of earlier resolutions, cleared when the
catalog changes) and the handler by its category and action frames
(``Service.by_frames``); anything else takes the careful path through
``wire.sada``, which also produces the 404/405/406 answers. While stopping, the
server INTRs an empty catalog, answers new REQs with 503 (channels send
those elsewhere) and lets running handlers finish for up to ``grace``
seconds.

Kept whole: one role (``Server``): its catalog, channel links and request handling share
one ROUTER and the routing ids it gives channels; ``_Workers`` is the pool only it runs
handlers in.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Optional

import gevent
import gevent.event
import zmq
from greenlet import GreenletExit, getcurrent, greenlet

from ..errors import PeermeshError, ProtocolError
from ..events import Event, EventType
from ..io import make_socket, shared_context
from ..counters import Counters
from ..io.curve import Curve
from ..wire.zre import PUBLIC_KEY_HEADER
from ..overlay import Lifecycle, Overlay
from ..wire import sada as wire
from ..wire.sada import Intr, Ping, Pong, Rintr, ServiceId, Status
from . import _transport
from .channel import HEADER_CHANNEL, HEADER_SERVER
from .endpoints import Network, as_endpoints, as_networks, check_endpoint, mesh_endpoint
from .errors import CatalogFull
from .handlers import (Handler, ReqFields, Request, Service, call, finish, resolve_service,
                       unknown_action)
from .routing import MAX_SERVICES
from .versions import version_key

__all__ = ["Server"]

log = logging.getLogger(__name__)

_PONG = wire.encode(Pong())
_DELIMITER, _PROTOCOL = wire.DELIMITER, wire.PROTOCOL
_REQ, _REP = wire.Command.REQ.frame, wire.Command.REP.frame
_STATUS = {code: wire.status_frame(code) for code in range(100, 600)}
_MAX_FRAMES = 16  # a REQ has 9; PING, RINTR 3: anything longer is not for a server
_MAX_CACHED = 4096  # (service, version) resolutions remembered
_JOB = object()     # marks a job switched into a worker greenlet
#: requests a server runs at once by default; more get 503 (channels go elsewhere)
MAX_CONCURRENT = 1024


class _ChannelLink:
    """One channel this server is connected to."""

    __slots__ = ("endpoint", "alias", "direct", "owners", "forget")

    def __init__(self, endpoint: str, alias: bytes, direct: bool) -> None:
        self.endpoint = endpoint
        self.alias = alias
        self.direct = direct                     # named by the application: never forgotten
        self.owners: set[Any] = set()            # mesh peers advertising this endpoint
        self.forget: Optional[gevent.Greenlet] = None


class _Workers:
    """Greenlets that run handlers, kept and reused (no greenlet made per request).

    ``run`` from the hub switches straight into an idle worker, which runs the
    job up to its end or its first wait and then hands the hub back, so the
    read that found the request carries on at once. From other greenlets the
    job is handed over through the hub's callbacks.
    """

    def __init__(self, hub: Any) -> None:
        self._hub = hub
        self._idle: list[greenlet] = []
        self._all: set[greenlet] = set()
        self.busy = 0
        self._quiet: Optional[gevent.event.Event] = None   # made by wait()

    def run(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` in a worker greenlet."""
        self.busy += 1
        if getcurrent() is self._hub:
            self._start(fn, args)
        else:
            self._hub.loop.run_callback(self._start, fn, args)

    def _start(self, fn: Callable[..., None], args: tuple) -> None:
        if self._idle:
            worker = self._idle.pop()
        else:
            worker = greenlet(self._work, parent=self._hub)
            self._all.add(worker)
        worker.switch(_JOB, fn, args)

    def _work(self, *job: Any) -> None:
        me = getcurrent()
        while True:
            try:
                job[1](*job[2])
            except GreenletExit:
                self._done()
                self._all.discard(me)
                return
            except Exception:
                log.exception("a request handler's greenlet failed")
            self._done()
            self._idle.append(me)
            while True:   # parked until the next job
                try:
                    job = self._hub.switch()
                except GreenletExit:   # kill() has forgotten the idle ones already
                    if me in self._idle:
                        self._idle.remove(me)
                    self._all.discard(me)
                    return
                except BaseException:  # e.g. a gevent.Timeout a handler left running
                    log.debug("ignored an exception thrown into an idle worker", exc_info=True)
                    continue
                if type(job) is tuple and len(job) == 3 and job[0] is _JOB:
                    break
                log.debug("ignored a switch into an idle worker: %r", job)

    def _done(self) -> None:
        self.busy -= 1
        if not self.busy and self._quiet is not None:
            self._quiet.set()

    def wait(self, timeout: float) -> bool:
        """Wait (up to ``timeout``) until no job runs; True if none does."""
        if not self.busy:
            return True
        self._quiet = gevent.event.Event()
        return self._quiet.wait(timeout)

    def kill(self) -> None:
        """End every worker (running jobs get GreenletExit)."""
        for worker in list(self._all):
            if not worker.dead:
                gevent.kill(worker)
        self._idle.clear()
        self._all.clear()


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
        self.max_concurrent = max_concurrent
        self.max_services = max_services
        self._networks: Optional[list[Network]] = (
            None if channel_networks is None else as_networks(channel_networks))
        #: refusals by limit: ``max_concurrent`` (REQs answered 503), ``channel_networks``
        #: (channel endpoints from the mesh outside them, or not tcp://IP:PORT)
        self.limits = Counters(log, "Safir-Darbaan server hit its limits")
        self._size = 0     # (name, version) pairs in the catalog
        self.forget_after = forget_after
        self._heartbeat = heartbeat
        self._max_message = max_message
        self._context = context or shared_context()
        self._catalog: dict[str, dict[str, Service]] = {}
        self._resolved: dict[tuple[str, str], Any] = {}  # (service, version) -> Service | outcome
        self._by_frames: dict[tuple[bytes, bytes], Service] = {}  # the same, by REQ frames 5-6
        self._closed = False
        for service in services:
            self.add_service(service)
        if node is not None:
            if node.running:
                self.node = node    # too late to advertise: find channels only
            else:
                self.attach(node)
        self._sock: Optional[zmq.Socket] = None
        self._monitor: Optional[zmq.Socket] = None
        self._links: dict[bytes, _ChannelLink] = {}
        self._by_endpoint: dict[str, _ChannelLink] = {}
        self._generations: dict[str, int] = {}
        self._workers: Optional[_Workers] = None
        self._greenlets: list[gevent.Greenlet] = []
        self._intr: list[bytes] = self._encode_intr()
        #: counters: requests, replies, errors (status >= 400), busy (503), intr_sent,
        #: dropped (malformed or unexpected messages), unsent (REPs that found no channel)
        self.stats: dict[str, int] = dict.fromkeys(
            ("requests", "replies", "errors", "busy", "intr_sent", "dropped", "unsent"), 0)

    # --- services -------------------------------------------------------------

    def add_service(self, service: Service) -> Service:
        """Serve ``service`` (replacing one of the same name and version); INTRs if running."""
        if not isinstance(service, Service):
            raise TypeError(f"not a Service: {service!r}")
        versions = self._catalog.get(service.name, {})
        changed = versions.get(service.version) is None
        if changed and self._size >= self.max_services:
            raise CatalogFull(f"cannot serve {service.name} {service.version}: the catalog holds "
                              f"{self._size} services, the most one INTR may list "
                              f"(max_services)")
        self._catalog[service.name] = versions
        versions[service.version] = service
        self._size += changed
        if changed:
            self._catalog_changed()
        return service

    def remove_service(self, name: str, version: str) -> None:
        """Stop serving ``name`` ``version``; INTRs if running. KeyError if not served."""
        versions = self._catalog[name]
        del versions[version]
        self._size -= 1
        if not versions:
            del self._catalog[name]
        self._catalog_changed()

    def service(self, name: str, version: str = "1.0") -> Service:
        """The served ``Service`` of that name and version, created (and served) if new."""
        existing = self._catalog.get(name, {}).get(version)
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
        return [ServiceId(name, version) for name in sorted(self._catalog)
                for version in sorted(self._catalog[name], key=version_key)]

    def _encode_intr(self, empty: bool = False) -> list[bytes]:
        return wire.encode(Intr(() if empty else tuple(self.catalog())))

    def _catalog_changed(self) -> None:
        self._resolved.clear()
        self._by_frames.clear()
        self._intr = self._encode_intr()
        if self.running:
            for link in list(self._links.values()):
                self._send_intr(link.alias)

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
        # with keys: a CURVE client of each channel's key (set per connection)
        sock = make_socket(zmq.ROUTER, context=self._context, curve=self._curve,
                           server_key=b"" if self._curve is not None else None)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.MAXMSGSIZE, self._max_message)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
        if self._heartbeat:
            ivl = max(1, int(self._heartbeat * 1000))
            sock.setsockopt(zmq.HEARTBEAT_IVL, ivl)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * ivl)
        self._sock = sock
        self._hub = gevent.get_hub()
        self._workers = _Workers(self._hub)
        self._router = _transport.RouterSocket(sock)
        self._monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self._greenlets = [
            gevent.spawn(self._router.serve, self._on_message, _MAX_FRAMES),
            gevent.spawn(_transport.read_monitor, self._monitor, self._on_monitor),
        ]
        for endpoint in self._direct:
            self._link(endpoint, direct=True)
        node = self.node
        if node is not None:
            node.add_listener(self._on_event)
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
        self._intr = self._encode_intr(empty=True)
        for link in list(self._links.values()):
            self._send_intr(link.alias)
        workers = self._workers
        assert workers is not None
        if workers.busy:
            workers.wait(timeout)
        workers.kill()
        self._closed = True
        if self.node is not None:
            try:
                self.node.remove_listener(self._on_event)
            except ValueError:
                pass
        assert self._sock is not None
        _transport.stop_monitor(self._sock)  # while its reader is still open
        gevent.killall(self._greenlets)
        for link in self._links.values():
            if link.forget is not None:
                link.forget.kill(block=False)
        assert self._sock is not None
        # linger: let the last REPs and the empty INTR out
        _transport.close_monitored(self._sock, self._monitor, linger=200)

    def __enter__(self) -> "Server":
        return self.start() if self.lifecycle is Lifecycle.NEW else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

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
        return sorted(self._by_endpoint)

    def _link(self, endpoint: str, *, direct: bool = False, owner: Any = None) -> None:
        link = self._by_endpoint.get(endpoint)
        if link is None:
            if not direct and mesh_endpoint(endpoint, self._mesh_networks()) is None:
                self.limits.over("channel_networks", f"ignored channel endpoint "
                                 f"{endpoint[:80]!r} from the mesh: not tcp://IP:PORT in "
                                 f"{', '.join(map(str, self._mesh_networks())) or 'no network'}")
                return
            generation = self._generations.get(endpoint, 0)
            self._generations[endpoint] = generation + 1
            alias = endpoint.encode("utf-8")
            if generation:
                alias += b"#%d" % generation
            assert self._sock is not None
            key = None
            if self._curve is not None:
                key = self._channel_keys.get(endpoint) or self._key_of(owner)
                if key is None:
                    log.warning("not connecting to channel %s: its public key is unknown "
                                "(give channel_keys= or connect(endpoint, key))", endpoint)
                    return
            try:
                self._sock.setsockopt(zmq.CONNECT_ROUTING_ID, alias)
                if key is not None:
                    Curve.connect(self._sock, endpoint, key)
                else:
                    self._sock.connect(endpoint)
            except zmq.ZMQError as exc:
                log.warning("cannot connect to channel %r: %s", endpoint, exc)
                return
            link = _ChannelLink(endpoint, alias, direct)
            self._links[alias] = link
            self._by_endpoint[endpoint] = link
            log.debug("connected to channel %s", endpoint)
            self._send_intr(alias)  # queued until the connection is up
        link.direct = link.direct or direct
        if owner is not None:
            link.owners.add(owner)
        if link.forget is not None:
            link.forget.kill(block=False)
            link.forget = None

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
            for link in list(self._links.values()):
                if event.peer in link.owners:
                    link.owners.discard(event.peer)
                    if not link.owners and not link.direct and link.forget is None:
                        link.forget = gevent.spawn_later(self.forget_after, self._forget, link)

    def _forget(self, link: _ChannelLink) -> None:
        link.forget = None
        if link.owners or link.direct or self._links.get(link.alias) is not link:
            return
        del self._links[link.alias]
        del self._by_endpoint[link.endpoint]
        log.debug("forgot channel %s", link.endpoint)
        if self._sock is not None and self.running:
            try:
                self._sock.disconnect(link.endpoint)
            except zmq.ZMQError:
                pass

    def _on_monitor(self, event: int, endpoint: str) -> None:
        if event != zmq.EVENT_HANDSHAKE_SUCCEEDED:
            return
        link = self._by_endpoint.get(endpoint)
        if link is not None:
            self._send_intr(link.alias)
        else:  # reported under its resolved address: introduce ourselves to all
            for link in list(self._links.values()):
                self._send_intr(link.alias)

    # --- messages -------------------------------------------------------------

    def _send(self, alias: bytes, frames: list[bytes]) -> bool:
        assert self._sock is not None
        try:
            self._router.send(alias, frames)
            return True
        except zmq.ZMQError as exc:
            log.debug("cannot send to channel %r: %s", alias, exc)
            return False

    def _send_intr(self, alias: bytes) -> None:
        if self._send(alias, self._intr):
            self.stats["intr_sent"] += 1

    def _on_message(self, alias: bytes, frames: list, last: Optional[str]) -> None:
        # The fast path: a REQ as the spec draws it, for a service resolved before
        # and an action it has (a request id of 1-255 octets is all left to check).
        if (len(frames) == 9 and frames[2] == _REQ and frames[1] == _PROTOCOL
                and not frames[0] and 0 < len(frames[3]) <= wire.MAX_REQUEST_ID):
            service = self._by_frames.get((frames[4], frames[5]))
            if service is not None:
                handler = service.by_frames.get((frames[6], frames[7]))
                if (handler is not None and not handler.with_request
                        and self.lifecycle is Lifecycle.RUNNING):
                    self.stats["requests"] += 1
                    if handler.inline:
                        self._run_inline(alias, handler, frames[3], frames[8], None)
                    else:
                        self._start(alias, handler, frames[3], frames[8], None)
                    return
        try:
            command = wire.command_of(frames)
            if command == _REQ:
                self._on_req(alias, wire.parse_req(frames), (frames[4], frames[5]))
                return
            message = wire.decode(frames)
        except ProtocolError as exc:
            self.stats["dropped"] += 1
            log.debug("dropped message from %r: %s", alias, exc.reason)
            return
        kind = type(message)
        if kind is Ping:
            self._send(alias, _PONG)
        elif kind is Rintr:
            self._send_intr(alias)
        else:
            self.stats["dropped"] += 1
            log.debug("dropped unexpected %s from %r", kind.__name__, alias)

    def _resolve(self, service: str, version: str, frames: tuple[bytes, bytes]) -> Any:
        """The Service for ``service`` ``version`` (or the outcome saying why none),
        remembered under the names and under their REQ ``frames`` for the fast path."""
        key = (service, version)
        found = self._resolved.get(key)
        if found is None:
            found = resolve_service(self._catalog, service, version)
            if len(self._resolved) < _MAX_CACHED:
                self._resolved[key] = found
        if type(found) is Service and len(self._by_frames) < _MAX_CACHED:
            self._by_frames[frames] = found
        return found

    def _on_req(self, alias: bytes, req: ReqFields, frames: tuple[bytes, bytes]) -> None:
        """A REQ off the fast path; ``frames``: its service name and version frames."""
        self.stats["requests"] += 1
        if not self.running:
            self._reply(alias, req[0], Status.UNAVAILABLE, b"server is stopping")
            return
        service = self._resolve(req[1], req[2], frames)
        if type(service) is tuple:
            self._reply(alias, req[0], *service)
            return
        handler = service.handler(req[3], req[4])
        if handler is None:
            self._reply(alias, req[0], *unknown_action(service, req[3], req[4]))
            return
        request = Request(req, self._channel_name(alias)) if handler.with_request else None
        if handler.inline:
            self._run_inline(alias, handler, req[0], req[5], request)
        else:
            self._start(alias, handler, req[0], req[5], request)

    def _run_inline(self, alias: bytes, handler: Handler, request_id: bytes, payload: bytes,
                    request: Optional[Request]) -> None:
        """Run a handler here, in the reader (``inline`` ones)."""
        result: Any = call(handler, payload, request)
        if type(result) is tuple:
            self._reply(alias, request_id, *result)
        else:
            result.rawlink(lambda done: self._reply(alias, request_id, *finish(handler, done)))

    def _start(self, alias: bytes, handler: Handler, request_id: bytes, payload: bytes,
               request: Optional[Request]) -> None:
        """Run a handler in a worker greenlet (503 when ``max_concurrent`` run already)."""
        workers = self._workers
        assert workers is not None
        if self.max_concurrent is not None and workers.busy >= self.max_concurrent:
            self.stats["busy"] += 1
            self.limits.over("max_concurrent", f"answered 503 to a request from "
                             f"{self._channel_name(alias)}: {workers.busy} running")
            self._reply(alias, request_id, Status.UNAVAILABLE,
                        f"server busy ({self.max_concurrent} requests running)".encode())
            return
        workers.run(self._run, alias, handler, request_id, payload, request)

    def _channel_name(self, alias: bytes) -> str:
        link = self._links.get(alias)
        return link.endpoint if link is not None else alias.decode("utf-8", "replace")

    def _run(self, alias: bytes, handler: Handler, request_id: bytes, payload: bytes,
             request: Optional[Request]) -> None:
        result = call(handler, payload, request)
        if type(result) is not tuple:
            result = finish(handler, result)
        self._reply(alias, request_id, *result)

    def _reply(self, alias: bytes, request_id: bytes, status: int, payload: bytes) -> None:
        if self._closed:
            return
        stats = self.stats
        if status >= 400:
            stats["errors"] += 1
        try:
            self._router.send_rep(alias, request_id, _STATUS[status], payload)
            stats["replies"] += 1
        except zmq.ZMQError as exc:
            stats["unsent"] += 1
            log.debug("cannot reply to channel %r: %s", alias, exc)

    def __repr__(self) -> str:
        return (f"<Server {self.lifecycle.value} services={len(self.catalog())} "
                f"channels={len(self._links)}>")
