"""The channel role: send requests to whichever server offers the service.

How it works
------------
A channel binds one ROUTER whose identity is its public endpoint
(``tcp://10.0.0.5:51234``), the durable socket the spec asks for, and tells
the mesh where it is with the HELLO header ``X-PM-SADA-CHANNEL``. Servers
connect to it and INTR their catalog; the channel keeps, per server (known by
the routing id ZeroMQ gave its connection):

* its catalog (service name + version pairs), replaced by every INTR;
* ``in_flight`` requests, a latency EWMA of its replies and a ``penalty``
  that doubles whenever a request to it times out and halves back each
  ping interval: the server chosen for a request is the one with the lowest
  ``(in_flight + 1) * latency * penalty`` among those offering the best
  version (see ``versions``);
* when it was last heard from. Any message counts; after ``ping_interval``
  of silence it is PINGed. A server whose PING is unanswered for half an
  interval is *suspect* (new requests avoid it while others can serve), and
  one silent for ``dead_after`` intervals is *dead*: dropped from the
  catalog, its in-flight requests re-sent to another server when the caller
  allowed ``retries``, else failed with ``ServerLost``. A disconnect seen by
  the socket monitor triggers PINGs at once, and ROUTER_MANDATORY makes a
  PING to a vanished connection fail on the spot, so a killed server is
  dropped within milliseconds.

Requests carry ids unique in the cluster: 16 random hex digits chosen when
the channel starts (so a restarted channel never reuses one), a dash, and a
counter. Each has one deadline covering every attempt; deadlines wait in a
heap watched by one timer on the hub (armed for the earliest), not a timer
per request.
A request for a service no server offers waits, parked, for one to appear
until its deadline. A REP 503 (the server did not run the request) is re-sent
to another server without using up a retry.

A message from a routing id the channel does not know (it restarted, or
dropped the server as dead) is answered with RINTR, at most once per ping
interval per id; the server then INTRs again.

Everything runs on one gevent hub: a channel may be made (its socket bound)
in any thread, but is started and used from the thread (hub) of its node;
replies are handled on the hub itself. For threaded programs see
``ThreadedChannel``.

The path every request takes is kept short: a REQ is written frame by frame
with no list built, a REP that looks as the spec draws it (the usual case) is
matched to its request without ``wire.sada``'s careful decoding (anything
else takes that path), and the answer goes straight to a greenlet waiting in
``request()`` (switched to from the reader, no ``AsyncResult``).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any, Callable, Iterable, Optional

import gevent
import gevent.event
import msgpack
import zmq
from gevent.hub import Waiter
from greenlet import getcurrent

from ..errors import NodeStateError, ProtocolError
from ..io import make_socket, shared_context
from ..net.interfaces import select_interface
from ..wire import sada as wire
from ..wire.sada import Intr, Ping, Pong, ServiceId, Status
from . import _transport
from .errors import ChannelClosed, NoServerError, RequestTimeout, ServerLost, ServiceError
from .handlers import pack
from .versions import choose_version, is_compatible, version_key

__all__ = ["Channel", "ServerInfo", "HEADER_CHANNEL", "HEADER_SERVER", "HEADER_ROLES"]

log = logging.getLogger(__name__)

#: HELLO header of a channel's node: the channel's public endpoint (servers connect to it)
HEADER_CHANNEL = "X-PM-SADA-CHANNEL"
#: HELLO header of a server's node: the protocol it speaks ("SADA1"); informational
HEADER_SERVER = "X-PM-SADA-SERVER"
#: HELLO header listing a node's overlay roles, comma-separated ("sada-channel,sada-server")
HEADER_ROLES = "X-PM-ROLES"

_PING = wire.encode(Ping())
_RINTR = wire.encode(wire.Rintr())
_PROTOCOL = wire.PROTOCOL
_REP = wire.Command.REP.frame
_STATUS_OF = {wire.status_frame(code): code for code in range(100, 600)}
_unpackb = msgpack.unpackb
_EWMA = 0.2            # weight of the newest latency sample
_MAX_PENALTY = 64.0
_INITIAL_LATENCY = 0.001
_MAX_FRAMES = 2 * 65536 + 3   # an INTR of 65536 services; anything longer is dropped
_SWEEP_STEP = 0.001           # seconds: the shortest wait of the deadline timer
_NO_EXCLUSION: frozenset = frozenset()


def advertise(node: Any, key: str, value: str, role: str) -> None:
    """Set HELLO header ``key`` and add ``role`` to ``X-PM-ROLES`` (node not started)."""
    node.set_header(key, value)
    roles = [r for r in node.headers.get(HEADER_ROLES, "").split(",") if r]
    if role not in roles:
        roles.append(role)
        node.set_header(HEADER_ROLES, ",".join(roles))


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """A snapshot of one server as a channel sees it."""

    id: str                            #: hex of its routing id at this channel
    address: str                       #: the IP its connection comes from
    services: tuple[ServiceId, ...]    #: its catalog, sorted
    in_flight: int                     #: requests sent and not answered
    latency: float                     #: EWMA of reply times, seconds
    penalty: float                     #: 1 = none; doubles per timeout
    suspect: bool                      #: a PING went unanswered for half an interval
    idle: float                        #: seconds since it was last heard from
    replies: int = 0                   #: REPs received from it

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {"id": self.id, "address": self.address,
                "services": [{"name": s.name, "version": s.version} for s in self.services],
                "in_flight": self.in_flight,
                "latency_ms": round(self.latency * 1000, 3) if self.replies else None,
                "penalty": self.penalty, "suspect": self.suspect, "idle": round(self.idle, 3),
                "replies": self.replies}


class _Server:
    """What the channel knows about one server connection."""

    __slots__ = ("identity", "id", "address", "services", "in_flight", "latency", "penalty",
                 "penalized_at", "last_heard", "ping_sent", "suspect", "alive", "replies")

    def __init__(self, identity: bytes, address: str, now: float, latency: float) -> None:
        self.identity = identity
        self.id = identity.hex()
        self.address = address
        self.services: frozenset[tuple[str, str]] = frozenset()
        self.in_flight = 0                # requests sent to it and not answered
        self.latency = latency
        self.penalty = 1.0
        self.penalized_at = now
        self.last_heard = now
        self.ping_sent = -math.inf
        self.suspect = False
        self.alive = True
        self.replies = 0

    def info(self, now: float) -> ServerInfo:
        """A snapshot for the application."""
        services = tuple(ServiceId(n, v) for n, v in
                         sorted(self.services, key=lambda s: (s[0], version_key(s[1]))))
        return ServerInfo(self.id, self.address, services, self.in_flight, self.latency,
                          self.penalty, self.suspect, max(0.0, now - self.last_heard),
                          self.replies)


class _Pending:
    """One request between ``request_async`` and its answer."""

    __slots__ = ("rid", "service", "version", "category", "action", "fields", "body", "raw",
                 "result", "deadline", "timeout", "server", "target", "sent_at", "attempts",
                 "retries", "excluded", "parked")

    def __init__(self, rid: bytes, service: str, version: Optional[str], category: str,
                 action: str, fields: tuple[bytes, bytes, bytes], body: bytes, raw: bool,
                 timeout: float, target: Optional[bytes], retries: int, result: Any) -> None:
        self.rid = rid
        self.service = service
        self.version = version
        self.category = category
        self.action = action
        self.fields = fields            # encoded service name, category, action
        self.body = body
        self.raw = raw
        self.result = result            # an AsyncResult, or the Waiter of a request(); None: done
        self.deadline = 0.0
        self.timeout = timeout
        self.server: Optional[_Server] = None
        self.target = target
        self.sent_at = 0.0
        self.attempts = 0
        self.retries = retries
        self.excluded: frozenset[bytes] = _NO_EXCLUSION
        self.parked = False


def _text(kind: str, value: str, empty_ok: bool = False) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"{kind} must be a str, not {type(value).__name__}")
    data = value.encode("utf-8")
    if len(data) > wire.MAX_TEXT or (not data and not empty_ok):
        raise ValueError(f"{kind} must be 1-{wire.MAX_TEXT} UTF-8 octets: {value[:40]!r}"
                         if not empty_ok else f"{kind} is over {wire.MAX_TEXT} octets")
    return data


class Channel:
    """A Safir-Darbaan channel: asks servers for services by name and version.

    ``Channel(node)`` binds on the node's interface (before ``node.start()``:
    the endpoint goes into its HELLO headers so servers on the mesh find it).
    Without a node, give ``interface``, ``address`` or ``endpoint`` and point
    servers at ``channel.endpoint``. The socket is bound at once, in whatever
    thread makes the channel; ``start()`` and every later call belong to the
    hub (thread) that will use it.

    Settings: ``ping_interval`` (seconds of silence before a server is
    PINGed), ``dead_after`` (multiples of it before a silent server is
    dropped), ``timeout`` (default request timeout), ``max_message``
    (largest message accepted, octets).
    """

    def __init__(self, node: Any = None, *, endpoint: Optional[str] = None,
                 interface: Optional[str] = None, address: Optional[str] = None, port: int = 0,
                 ping_interval: float = 1.0, dead_after: float = 3.0, timeout: float = 5.0,
                 max_message: int = 64 * 1024 * 1024, advertise_on: bool = True,
                 context: Optional[zmq.Context] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not ping_interval > 0 or not dead_after >= 1 or not timeout > 0:
            raise ValueError("ping_interval and timeout must be positive, dead_after at least 1")
        if node is not None and advertise_on and getattr(node, "running", False):
            raise NodeStateError("create the Channel before node.start(): its endpoint goes "
                                 "into the node's HELLO headers (or pass advertise_on=False)")
        self.ping_interval = float(ping_interval)
        self.dead_after = float(dead_after)
        self.timeout = float(timeout)
        self._clock = clock
        self._context = context or shared_context()
        sock = make_socket(zmq.ROUTER, context=self._context)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.MAXMSGSIZE, max_message)
        try:
            if endpoint is not None:
                self.endpoint = _transport.bind_endpoint(sock, endpoint)
            else:
                if address is None:
                    choice = interface
                    if choice is None and node is not None:
                        choice = node.config.interface
                    address = select_interface(choice).address
                self.endpoint = _transport.bind_router(sock, address, port)
        except BaseException:
            sock.close(linger=0)
            raise
        self._sock = sock
        #: unique per channel instance: the prefix of every request id
        self.id = os.urandom(8).hex()
        self._prefix = self.id.encode("ascii") + b"-"
        self._counter = 0
        if node is not None and advertise_on:
            advertise(node, HEADER_CHANNEL, self.endpoint, "sada-channel")
        self._servers: dict[bytes, _Server] = {}
        self._routes: dict[str, dict[str, list[_Server]]] = {}
        self._route_cache: dict[tuple[str, Optional[str]], list[tuple[str, list[_Server]]]] = {}
        self._pending: dict[bytes, _Pending] = {}
        self._deadlines: list[tuple[float, int, _Pending]] = []   # a heap
        self._sweeper: Any = None
        self._sweep_at = math.inf
        self._parked: list[_Pending] = []
        self._rintr_sent: dict[bytes, float] = {}
        self._fields: dict[tuple[str, str, str], tuple[bytes, bytes, bytes]] = {}
        self._versions: dict[str, bytes] = {}
        self._changed = gevent.event.Event()
        self._greenlets: list[gevent.Greenlet] = []
        self._monitor: Optional[zmq.Socket] = None
        self._hub: Any = None
        self._loop: Any = None
        self._state = "new"
        #: counters: requests, replies, timeouts, failovers, retries_503, servers_dropped,
        #: intr, rintr_sent, dropped (malformed or unexpected messages)
        self.stats: dict[str, int] = dict.fromkeys(
            ("requests", "replies", "timeouts", "failovers", "retries_503", "servers_dropped",
             "intr", "rintr_sent", "dropped"), 0)

    # --- life cycle -----------------------------------------------------------

    def start(self) -> "Channel":
        """Start reading, pinging and watching connections on the current hub."""
        if self._state != "new":
            raise NodeStateError(f"channel is {self._state}; a channel starts once")
        self._hub = gevent.get_hub()
        self._loop = self._hub.loop
        self._router = _transport.RouterSocket(self._sock)
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._state = "running"
        self._greenlets = [
            gevent.spawn(self._router.serve, self._on_message, _MAX_FRAMES),
            gevent.spawn(_transport.read_monitor, self._monitor, self._on_monitor),
            gevent.spawn(self._ticker),
        ]
        log.debug("channel %s at %s started", self.id, self.endpoint)
        return self

    def stop(self) -> None:
        """Fail every waiting request with ``ChannelClosed`` and close the socket."""
        if self._state != "running":
            if self._state == "new":
                self._sock.close(linger=0)
                self._state = "stopped"
            return
        self._state = "stopped"
        gevent.killall(self._greenlets)
        for pending in list(self._pending.values()):
            self._finish(pending, exc=ChannelClosed("the channel stopped"))
        self._parked.clear()
        if self._sweeper is not None:
            self._sweeper.close()
            self._sweeper = None
        _transport.close_monitored(self._sock, self._monitor, linger=0)
        self._changed.set()

    def __enter__(self) -> "Channel":
        return self.start() if self._state == "new" else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._state == "running"

    # --- requests -------------------------------------------------------------

    def request(self, service: str, action: str, payload: Any = None, *,
                version: Optional[str] = None, category: str = "",
                timeout: Optional[float] = None, server: Optional[str] = None,
                retries: int = 0, raw: bool = False) -> Any:
        """Send a request and wait for its reply; returns the reply payload.

        ``payload`` is packed with msgpack (``raw=True``: sent as the bytes
        given, and the reply returned as bytes). ``version``: see
        ``versions`` (None: the highest offered). ``server``: the id of one
        server (``ServerInfo.id``) to ask, whatever its catalog says.
        ``retries``: how many times the request may be re-sent to another
        server when its server dies holding it; a retried request may run
        twice, so allow retries for idempotent actions only.

        Raises ``ServiceError`` (a REP with status >= 400), ``NoServerError``
        (no server offered the service in time), ``RequestTimeout`` (no reply
        within ``timeout``, default the channel's), ``ServerLost`` (the server
        died and no retry was left) or ``ChannelClosed``.
        """
        # The reader hands the reply straight to this greenlet (no AsyncResult, no
        # extra turn of the hub's loop).
        waiter = Waiter(self._hub)
        self._submit(waiter, service, action, payload, version, category, timeout, server,
                     retries, raw)
        return waiter.get()

    def request_async(self, service: str, action: str, payload: Any = None, *,
                      version: Optional[str] = None, category: str = "",
                      timeout: Optional[float] = None, server: Optional[str] = None,
                      retries: int = 0, raw: bool = False) -> gevent.event.AsyncResult:
        """Like ``request`` but returns at once: an ``AsyncResult`` for the reply."""
        result = gevent.event.AsyncResult()
        self._submit(result, service, action, payload, version, category, timeout, server,
                     retries, raw)
        return result

    def _submit(self, result: Any, service: str, action: str, payload: Any,
                version: Optional[str], category: str, timeout: Optional[float],
                server: Optional[str], retries: int, raw: bool) -> None:
        if self._state != "running":
            raise ChannelClosed(f"channel is {self._state}"
                                + ("; call start() first" if self._state == "new" else ""))
        key = (service, category, action)
        fields = self._fields.get(key)
        if fields is None:
            fields = (_text("service name", service), _text("action category", category, True),
                      _text("action name", action))
            if len(self._fields) < 4096:
                self._fields[key] = fields
        if version is not None and version not in self._versions:
            self._versions[version] = _text("service version", version)
        if raw:
            if not isinstance(payload, (bytes, bytearray, memoryview)):
                raise TypeError(f"a raw payload must be bytes, not {type(payload).__name__}")
            body = bytes(payload)
        else:
            body = pack(payload)
        if timeout is None:
            timeout = self.timeout
        elif not timeout > 0:
            raise ValueError(f"timeout must be positive, not {timeout!r}")
        if retries < 0:
            raise ValueError("retries must not be negative")
        target = None
        if server is not None:
            try:
                target = bytes.fromhex(server)
            except (ValueError, TypeError):
                raise ValueError(f"server {server!r} is not a server id (hex)") from None
        self._counter += 1
        rid = self._prefix + b"%x" % self._counter
        pending = _Pending(rid, service, version, category, action, fields, body, raw, timeout,
                           target, retries, result)
        self._pending[rid] = pending
        deadline = pending.deadline = time.monotonic() + timeout
        heappush(self._deadlines, (deadline, self._counter, pending))
        if deadline < self._sweep_at:
            self._arm(deadline)
        self.stats["requests"] += 1
        self._dispatch(pending)

    def _dispatch(self, pending: _Pending) -> None:
        """Send ``pending`` to the best server, or park it until one appears."""
        while True:
            choice = self._choose(pending)
            if choice is None:
                if pending.target is not None:  # that connection is gone: it never comes back
                    self._finish(pending, exc=self._no_server(pending))
                    return
                if not pending.parked:
                    pending.parked = True
                    self._parked.append(pending)
                return
            version, server = choice
            fields = pending.fields
            version_frame = self._versions.get(version)
            if version_frame is None:
                version_frame = version.encode("utf-8")
                if len(self._versions) < 4096:
                    self._versions[version] = version_frame
            try:
                self._router.send_req(server.identity, pending.rid, fields[0], version_frame,
                                      fields[1], fields[2], pending.body)
            except zmq.Again:
                # its queue is full: treat it like a busy server and try another
                self._penalise(server)
                pending.excluded = pending.excluded | {server.identity}
                continue
            except zmq.ZMQError as exc:
                self._drop(server, f"unreachable ({exc.strerror})")
                if pending.server is not None or self._pending.get(pending.rid) is not pending:
                    return  # dispatched (or finished) while the catalog changed
                continue
            if pending.parked:
                pending.parked = False
                self._parked.remove(pending)
            pending.server = server
            pending.attempts += 1
            server.in_flight += 1
            pending.sent_at = time.perf_counter()
            return

    def _choose(self, pending: _Pending) -> Optional[tuple[str, _Server]]:
        excluded = pending.excluded
        if pending.target is not None:
            server = self._servers.get(pending.target)
            if server is None or server.identity in excluded:
                return None
            offered = [v for n, v in server.services if n == pending.service]
            version = choose_version(offered, pending.version)
            return (version or pending.version or "*"), server
        fallback = None
        for version, servers in self._route(pending.service, pending.version):
            best = None
            best_score = math.inf
            for server in servers:
                if excluded and server.identity in excluded:
                    continue
                if server.suspect:
                    if fallback is None:
                        fallback = (version, server)
                    continue
                score = (server.in_flight + 1) * server.latency * server.penalty
                if score < best_score:
                    best, best_score = server, score
            if best is not None:
                return version, best
        return fallback

    def _route(self, service: str, version: Optional[str]) -> list[tuple[str, list[_Server]]]:
        """(version, servers) groups that may serve the request, best first (cached)."""
        key = (service, version)
        groups = self._route_cache.get(key)
        if groups is None:
            offered = self._routes.get(service, {})
            if version is None:
                usable = sorted(offered, key=version_key, reverse=True)
            else:
                usable = sorted((v for v in offered if v != version and is_compatible(v, version)),
                                key=version_key, reverse=True)
                if version in offered:
                    usable.insert(0, version)
            groups = [(v, offered[v]) for v in usable]
            self._route_cache[key] = groups
        return groups

    # --- replies and deadlines ------------------------------------------------

    def _finish(self, pending: _Pending, value: Any = None,
                exc: Optional[BaseException] = None) -> None:
        """Take ``pending`` out of every table and hand the caller its answer."""
        result = pending.result
        if result is None:
            return
        pending.result = None
        pending.body = b""
        del self._pending[pending.rid]
        server = pending.server
        if server is not None:
            server.in_flight -= 1
            pending.server = None
        if pending.parked:
            pending.parked = False
            try:
                self._parked.remove(pending)
            except ValueError:
                pass
        deadlines = self._deadlines
        while deadlines and deadlines[0][2].result is None:  # answered early: forget
            heappop(deadlines)
        if type(result) is not Waiter:
            if exc is None:
                result.set(value)
            else:
                result.set_exception(exc)
        elif getcurrent() is self._hub:   # a waiting request(): straight to its greenlet
            if exc is None:
                result.switch(value)
            else:
                result.throw(exc)
        elif exc is None:
            self._loop.run_callback(result.switch, value)
        else:
            self._loop.run_callback(result.throw, exc)

    def _arm(self, deadline: float) -> None:
        """(Re)start the deadline timer to fire at ``deadline`` (time.monotonic)."""
        if self._sweeper is not None:
            self._sweeper.close()
        self._sweep_at = deadline
        self._sweeper = self._loop.timer(max(0.0, deadline - time.monotonic()))
        self._sweeper.start(self._sweep)

    def _sweep(self) -> None:
        """The deadline timer fired: expire what is due, re-arm for the next."""
        self._sweeper.close()
        self._sweeper = None
        self._sweep_at = math.inf
        now = time.monotonic()
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            pending = heappop(deadlines)[2]
            if pending.result is not None:
                self._expire(pending)
        while deadlines and deadlines[0][2].result is None:
            heappop(deadlines)
        if deadlines and self._state == "running":
            self._arm(max(deadlines[0][0], now + _SWEEP_STEP))

    def _on_rep(self, server: _Server, pending: _Pending, status: int, payload: bytes) -> None:
        """``server`` answered ``pending`` (which it held)."""
        server.in_flight -= 1
        server.replies += 1
        pending.server = None
        server.latency += _EWMA * (time.perf_counter() - pending.sent_at - server.latency)
        self.stats["replies"] += 1
        if status < 400:
            if pending.raw:
                self._finish(pending, payload)
                return
            try:
                value = _unpackb(payload, raw=False, strict_map_key=False) if payload else None
            except Exception as exc:
                self._finish(pending, exc=ServiceError(
                    Status.BAD_REQUEST, f"reply payload is not msgpack: {exc}",
                    request_id=pending.rid, server=server.id))
                return
            self._finish(pending, value)
            return
        if status == Status.UNAVAILABLE and pending.target is None:
            # not run there: safe to send elsewhere, retries or not
            self.stats["retries_503"] += 1
            pending.excluded = pending.excluded | {server.identity}
            if self._choose(pending) is not None:
                self._dispatch(pending)
                return
        message = payload.decode("utf-8", "replace")
        self._finish(pending, exc=ServiceError(status, message, request_id=pending.rid,
                                               server=server.id))

    def _expire(self, pending: _Pending) -> None:
        """The request's deadline passed (runs on the hub, from the deadline timer)."""
        server = pending.server
        what = f"{pending.service} {pending.category + '/' if pending.category else ''}" \
               f"{pending.action}"
        if server is not None:
            self._penalise(server)
            self.stats["timeouts"] += 1
            exc: Exception = RequestTimeout(
                f"no reply to {what} (request {pending.rid.decode('ascii', 'replace')}) from "
                f"server {server.id} within {pending.timeout:g} s", request_id=pending.rid,
                server=server.id, attempts=pending.attempts)
        elif pending.attempts:
            exc = ServerLost(
                f"{what}: the server holding request {pending.rid.decode('ascii', 'replace')} "
                f"died and no other server took it within {pending.timeout:g} s",
                request_id=pending.rid, attempts=pending.attempts)
        else:
            exc = self._no_server(pending)
        self._finish(pending, exc=exc)

    def _no_server(self, pending: _Pending) -> NoServerError:
        if pending.target is not None:
            return NoServerError(Status.UNKNOWN_SERVICE,
                                 f"no server {pending.target.hex()} at this channel (any more)",
                                 request_id=pending.rid)
        offered = self._routes.get(pending.service)
        if not offered:
            return NoServerError(Status.UNKNOWN_SERVICE,
                                 f"no server offers service {pending.service!r} "
                                 f"(waited {pending.timeout:g} s)", request_id=pending.rid)
        versions = ", ".join(sorted(offered, key=version_key))
        if not self._route(pending.service, pending.version):
            return NoServerError(Status.UNKNOWN_VERSION,
                                 f"no server offers service {pending.service!r} in a version "
                                 f"compatible with {pending.version!r} (offered: {versions})",
                                 request_id=pending.rid)
        return NoServerError(Status.UNAVAILABLE,
                             f"every server of {pending.service!r} was tried or is gone",
                             request_id=pending.rid)

    def _penalise(self, server: _Server) -> None:
        server.penalty = min(server.penalty * 2, _MAX_PENALTY)
        server.penalized_at = self._clock()

    # --- incoming -------------------------------------------------------------

    def _on_message(self, identity: bytes, frames: list, last: Optional[str]) -> None:
        # The fast path: a REP as the spec draws it, from the server holding the request.
        if len(frames) == 6 and frames[2] == _REP and frames[1] == _PROTOCOL and not frames[0]:
            server = self._servers.get(identity)
            pending = self._pending.get(frames[3])
            status = _STATUS_OF.get(frames[4])
            if (server is not None and pending is not None and status is not None
                    and pending.server is server):
                server.last_heard = self._clock()
                server.suspect = False
                self._on_rep(server, pending, status, frames[5])
                return
        try:
            if wire.command_of(frames) == _REP:
                rid, status, payload = wire.parse_rep(frames)
                server = self._servers.get(identity)
                if server is None:
                    self._unknown(identity)
                    return
                server.last_heard = self._clock()
                server.suspect = False
                pending = self._pending.get(rid)
                if pending is None or pending.server is not server:
                    log.debug("REP for unknown or expired request %r from %s", rid, server.id)
                    return
                self._on_rep(server, pending, status, payload)
                return
            message = wire.decode(frames)
        except ProtocolError as exc:
            self.stats["dropped"] += 1
            log.debug("dropped message from %r: %s", identity, exc.reason)
            return
        server = self._servers.get(identity)
        kind = type(message)
        if kind is Intr:
            self._on_intr(identity, server, message, last)  # type: ignore[arg-type]
            return
        if kind is Pong:
            if server is None:
                self._unknown(identity)
                return
            server.last_heard = self._clock()
            server.suspect = False
            return
        # REQ, RINTR, PING: commands a server does not send
        self.stats["dropped"] += 1
        log.debug("dropped unexpected %s from %r", kind.__name__, identity)

    def _on_intr(self, identity: bytes, server: Optional[_Server], intr: Intr,
                 last: Optional[str]) -> None:
        now = self._clock()
        self.stats["intr"] += 1
        if server is None:
            address = last  # the sender's Peer-Address
            known = [s.latency for s in self._servers.values()]
            server = _Server(identity, str(address or ""), now,
                             min(known) if known else _INITIAL_LATENCY)
            self._servers[identity] = server
            self._rintr_sent.pop(identity, None)
            log.debug("server %s (%s) introduced itself", server.id, server.address)
        server.last_heard = now
        server.suspect = False
        services = frozenset((s.name, s.version) for s in intr.services)
        if services != server.services:
            server.services = services
            self._rebuild()
        self._changed_catalog()

    def _unknown(self, identity: bytes) -> None:
        """A server this channel does not know spoke: ask it to introduce itself."""
        now = self._clock()
        sent = self._rintr_sent.get(identity)
        if sent is not None and now - sent < self.ping_interval:
            return
        if len(self._rintr_sent) > 4096:
            self._rintr_sent = {k: t for k, t in self._rintr_sent.items()
                                if now - t < self.ping_interval}
        self._rintr_sent[identity] = now
        try:
            self._router.send(identity, _RINTR)
        except zmq.ZMQError:
            return
        self.stats["rintr_sent"] += 1
        log.debug("sent RINTR to unknown server %s", identity.hex())

    def _on_monitor(self, event: int, endpoint: str) -> None:
        if event == zmq.EVENT_DISCONNECTED:
            # Some connection went away: a PING to a routing id whose pipe is gone
            # fails at once (ROUTER_MANDATORY). Probe now and once more shortly after,
            # in case the pipe was not yet torn down.
            self._probe()
            gevent.spawn_later(0.05, self._probe)

    def _probe(self) -> None:
        if self._state != "running":
            return
        now = self._clock()
        for server in list(self._servers.values()):
            self._ping(server, now)

    # --- liveness -------------------------------------------------------------

    def _ping(self, server: _Server, now: float) -> None:
        if server.ping_sent <= server.last_heard:
            server.ping_sent = now
        try:
            self._router.send(server.identity, _PING)
        except zmq.Again:
            pass
        except zmq.ZMQError as exc:
            self._drop(server, f"disconnected ({exc.strerror})")

    def _ticker(self) -> None:
        period = self.ping_interval / 4
        last = self._clock()
        while True:
            gevent.sleep(period)
            now = self._clock()
            # Judge nobody while this process was too busy to run the ticker on
            # time, or while answers wait unread in the channel's own socket.
            judge = now - last < 2 * period and not self._router.poll()
            last = now
            self._tick(now, judge)

    def _tick(self, now: float, judge: bool = True) -> None:
        interval = self.ping_interval
        dead = self.dead_after * interval
        for server in list(self._servers.values()):
            silence = now - server.last_heard
            if silence >= dead and judge:
                self._drop(server, f"no REP or PONG for {silence:.2f} s")
                continue
            if silence >= interval and now - server.ping_sent >= interval:
                server.ping_sent = now
                self._ping(server, now)
                if not server.alive:
                    continue
            if (server.ping_sent > server.last_heard and now - server.ping_sent >= interval / 2
                    and not server.suspect):
                server.suspect = True
                log.debug("server %s is suspect: PING unanswered", server.id)
            if server.penalty > 1 and now - server.penalized_at >= interval:
                server.penalty = max(1.0, server.penalty / 2)
                server.penalized_at = now

    def _drop(self, server: _Server, reason: str) -> None:
        """Remove a dead server; fail over or fail what it held."""
        self._router.drain_pending()  # its last answers may be waiting unread
        if self._servers.get(server.identity) is not server:
            return
        del self._servers[server.identity]
        server.alive = False
        self.stats["servers_dropped"] += 1
        log.info("server %s (%s) dropped: %s", server.id, server.address, reason)
        self._rebuild()
        held = [p for p in self._pending.values() if p.server is server]
        server.in_flight = 0
        for pending in held:
            pending.server = None
            pending.excluded = pending.excluded | {server.identity}
            if pending.retries > 0 and pending.target is None:
                pending.retries -= 1
                self.stats["failovers"] += 1
                self._dispatch(pending)
            else:
                self._finish(pending, exc=ServerLost(
                    f"{pending.service} {pending.action}: server {server.id} died holding "
                    f"request {pending.rid.decode('ascii', 'replace')} ({reason})"
                    + ("" if pending.target is not None else
                       "; no retries allowed" if pending.attempts <= 1 else "; no retries left"),
                    request_id=pending.rid, server=server.id, attempts=pending.attempts))
        self._changed_catalog()

    # --- the catalog ----------------------------------------------------------

    def _rebuild(self) -> None:
        routes: dict[str, dict[str, list[_Server]]] = {}
        for server in self._servers.values():
            for name, version in server.services:
                routes.setdefault(name, {}).setdefault(version, []).append(server)
        self._routes = routes
        self._route_cache.clear()

    def _changed_catalog(self) -> None:
        changed = self._changed
        self._changed = gevent.event.Event()
        changed.set()
        if self._parked:
            for pending in list(self._parked):
                if pending.parked and self._pending.get(pending.rid) is pending:
                    self._dispatch(pending)

    def refresh(self) -> None:
        """Send RINTR to every known server: each answers with a fresh INTR."""
        for server in list(self._servers.values()):
            try:
                self._router.send(server.identity, _RINTR)
                self.stats["rintr_sent"] += 1
            except zmq.ZMQError:
                pass

    def servers(self) -> list[ServerInfo]:
        """Every server that introduced itself and is alive, by id."""
        now = self._clock()
        return sorted((s.info(now) for s in self._servers.values()), key=lambda i: i.id)

    def services(self) -> dict[str, dict[str, list[str]]]:
        """The catalog: service name -> version -> ids of the servers offering it."""
        return {name: {v: sorted(s.id for s in servers) for v, servers in
                       sorted(versions.items(), key=lambda kv: version_key(kv[0]))}
                for name, versions in sorted(self._routes.items())}

    def offers(self, service: str, version: Optional[str] = None) -> int:
        """How many servers could serve ``service`` at ``version`` now."""
        return len({s.identity for _, servers in self._route(service, version)
                    for s in servers})

    def wait_until(self, predicate: Callable[["Channel"], bool],
                   timeout: Optional[float] = None) -> bool:
        """Wait until ``predicate(channel)`` holds, checked after every catalog change."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not predicate(self):
            if self._state == "stopped":
                return False
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self._changed.wait(remaining)
        return True

    def wait_for(self, service: str, version: Optional[str] = None, count: int = 1,
                 timeout: Optional[float] = None) -> bool:
        """Wait until ``count`` servers offer ``service`` (at ``version``); False on timeout."""
        return self.wait_until(lambda ch: ch.offers(service, version) >= count, timeout)

    def __repr__(self) -> str:
        return (f"<Channel {self.endpoint} {self._state} servers={len(self._servers)} "
                f"pending={len(self._pending)}>")


def as_endpoints(values: Iterable[str]) -> list[str]:
    """Validated channel endpoints (``tcp://host:port`` or ``ipc://path``)."""
    result = []
    for value in values:
        if not isinstance(value, str) or not (value.startswith("tcp://")
                                              or value.startswith("ipc://")):
            raise ValueError(f"channel endpoint {value!r} is not tcp://HOST:PORT or ipc://PATH")
        result.append(value)
    return result
