"""The channel role: send requests to whichever server offers the service.

A channel binds one ROUTER whose identity is its public endpoint
(``tcp://10.0.0.5:51234``), the durable socket the spec asks for, and tells
the mesh where it is with the HELLO header ``X-PM-SADA-CHANNEL``. Servers
connect to it and INTR their catalog.

Which server gets each request, liveness (PING, suspect, dead), deadlines,
retries and failover are decided by ``routing.RequestRouter``, which does no
I/O and reads no clock (a core on the contract of ``peermesh.core``). The one
driver (``peermesh.io.driver.Driver``) serves it: it reads the channel's
ROUTER in batches, runs the router's timer and applies its outputs (``Send``:
the message goes out; ``Deliver``: the answer goes to its waiting caller;
``Emit``: the catalog changed). This module binds the socket, feeds the
router the callers' requests and hands the answers over.
A disconnect seen by the socket monitor makes the router PING every server at
once, and ROUTER_MANDATORY makes a PING to a vanished connection fail on the
spot, so a killed server is dropped within milliseconds.

Everything runs on one gevent hub: a channel may be made (its socket bound)
in any thread, but is started and used from the thread (hub) of its node;
replies are handled on the hub itself, and an answer goes straight to the
greenlet waiting in ``request()``: the reader takes in a batch's usual REPs in one
call (``RequestRouter.answer_each``) and switches to the first caller; a caller
that then waits again (its next ``request``) switches straight to the next one,
and the last back to the hub: one greenlet switch per answer, not two (no
``Waiter`` or ``AsyncResult``, no callback of the hub per reply). For threaded
programs see ``ThreadedChannel``.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import Any, Callable, Optional

import gevent
import gevent.event
import zmq
from gevent.event import AsyncResult
from gevent.exceptions import BlockingSwitchOutError
from greenlet import getcurrent
from greenlet import greenlet as _RawGreenlet

from ..core import Send as SendOutput
from ..errors import NodeStateError
from ..io import BindError, make_socket, shared_context
from ..io.connections import GuardedListener
from ..io.driver import Driver
from ..io.socket import HubSocket
from ..io.transport import ZmqTransport
from ..net.interfaces import select_interface
from ..overlay import Lifecycle, Overlay
from . import _transport
from .endpoints import check_endpoint
from .errors import ChannelClosed, EndpointError
from .routing import MAX_CATALOG, MAX_SERVICES, RequestRouter, ServerInfo

__all__ = ["Channel", "ServerInfo", "HEADER_CHANNEL", "HEADER_SERVER"]

log = logging.getLogger(__name__)

#: HELLO header of a channel's node: the channel's public endpoint (servers connect to it)
HEADER_CHANNEL = "X-PM-SADA-CHANNEL"
#: HELLO header of a server's node: the protocol it speaks ("SADA1"); informational
HEADER_SERVER = "X-PM-SADA-SERVER"

_PROBE_AGAIN = 0.05                  # seconds: a disconnect is probed once more after this
#: requests for one server held for the end of the hub's turn (``Driver.cork``) before
#: all held go out at once: the server starts on them while the turn's other callers ask,
#: where holding the whole turn left each side idle while the other worked (1.1-1.4 times
#: the round trips per second to one server, 64 in flight); several servers still get
#: their shares of a turn whole
_CORK_LIMIT = 16
_RUNNING = Lifecycle.RUNNING
# greenlet's own (gevent's Greenlet.throw returns nothing: a caller that threw an answer
# into the next one must get its own answer back from the call)
_switch = _RawGreenlet.switch   # _switch(hub): a caller waits for its answer on the hub
_throw = _RawGreenlet.throw


def _set(result: AsyncResult, value: Any, error: Optional[BaseException]) -> None:
    """A ``request_async`` caller's answer."""
    if error is None:
        result.set(value)
    else:
        result.set_exception(error)


class _ClockTransport(ZmqTransport):
    """The real transport on the channel's clock (the driver's timer runs on it)."""

    def __init__(self, context: zmq.Context, clock: Callable[[], float]) -> None:
        super().__init__(context)
        self._clock = clock

    def now(self) -> float:  # type: ignore[override]
        return self._clock()


class Channel(Overlay):
    """A Safir-Darbaan channel: asks servers for services by name and version.

    ``Channel(node)`` attaches to the node (before ``node.start()``: the
    endpoint goes into its HELLO headers so servers on the mesh find it) and
    binds on the node's interface. A channel made without a node binds at
    once where ``interface``, ``address`` (and ``port``) or ``endpoint`` say;
    with none of them it binds when attached, on its node's interface (or,
    started without a node, on the default interface). The socket is bound in
    whatever thread makes the channel; ``start()`` and every later call belong
    to the hub (thread) that will use it. A channel without a node is started
    on its own (``Channel(address=...).start()``); point servers at
    ``channel.endpoint``.

    Settings: ``ping_interval`` (seconds of silence before a server is
    PINGed), ``dead_after`` (multiples of it before a silent server is
    dropped), ``timeout`` (default request timeout), ``max_message``
    (largest message accepted, octets), ``max_services`` (services one INTR
    may list; a longer one is dropped unread) and ``max_catalog`` (server and
    service pairs in the whole catalog; an INTR that would pass it is dropped
    and its server keeps what it offered). ``advertise_on=False`` with a node:
    use the node's interface, but do not attach (the node may be running).
    """

    roles = ("sada-channel",)

    def __init__(self, node: Any = None, *, endpoint: Optional[str] = None,
                 interface: Optional[str] = None, address: Optional[str] = None, port: int = 0,
                 ping_interval: float = 1.0, dead_after: float = 3.0, timeout: float = 5.0,
                 max_message: int = 64 * 1024 * 1024, max_services: int = MAX_SERVICES,
                 max_catalog: int = MAX_CATALOG, advertise_on: bool = True,
                 context: Optional[zmq.Context] = None,
                 clock: Callable[[], float] = time.monotonic, curve: Any = None) -> None:
        super().__init__()
        if endpoint is not None:
            check_endpoint(endpoint, bind=True)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise EndpointError(f"channel port {port!r} is outside 0-65535 (0: any free port)")
        self._clock = clock
        #: unique per channel instance: the prefix of every request id
        self.id = os.urandom(8).hex()
        self._core = RequestRouter(self.id, ping_interval=ping_interval, dead_after=dead_after,
                                   timeout=timeout, now=clock(), max_services=max_services,
                                   max_catalog=max_catalog, source_of=self._source_of,
                                   unread=self._unread, addressed=True)
        self._take = self._core.take
        self.ping_interval = self._core.ping_interval
        self.dead_after = self._core.dead_after
        self.timeout = self._core.timeout
        self._context = context or shared_context()
        self._max_message = max_message
        self._where = (endpoint, interface, address, port)
        #: the bound endpoint (None until bound; see the class docstring)
        self.endpoint: Optional[str] = None
        self._sock: Optional[zmq.Socket] = None
        #: the node's CURVE keys (or ``curve``, a ``peermesh.io.curve.Curve``, for a channel
        #: bound before its node exists): a CURVE server admitting the allowed keys
        self._curve = curve if curve is not None else getattr(node, "curve", None)
        self._router: Optional[HubSocket] = None
        self._guard: Optional[GuardedListener] = None
        self._driver: Optional[Driver] = None
        self._deferring = False    # answers wait for the hub's next turn (see _deliver)
        #: callers whose answer waits for the hub's next turn: greenlet -> (value, error)
        self._due: dict[Any, tuple[Any, Optional[BaseException]]] = {}
        #: callers answered by the batch being read, each to be switched to in turn
        #: (greenlet, value, error): by the hub, or by the caller before it (``request``)
        self._ready: deque[tuple[Any, Any, Optional[BaseException]]] = deque()
        self._hub: Any = None
        self._loop: Any = None
        self._changed = gevent.event.Event()
        if node is not None and advertise_on:
            self.attach(node)
        elif node is not None:
            self._bind(node.config.interface)
        elif endpoint is not None or interface is not None or address is not None:
            self._bind(None)

    # --- binding --------------------------------------------------------------

    def _bind(self, node_interface: Optional[str]) -> str:
        """Bind the ROUTER where the settings say, else on ``node_interface``."""
        endpoint, interface, address, port = self._where
        sock = make_socket(zmq.ROUTER, context=self._context, curve=self._curve)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.MAXMSGSIZE, self._max_message)
        try:
            if endpoint is not None:
                bound = _transport.bind_endpoint(sock, endpoint)
            else:
                if address is None:
                    address = select_interface(interface or node_interface).address
                bound = _transport.bind_router(sock, address, port)
        except (zmq.ZMQError, BindError) as exc:
            sock.close(linger=0)
            where = endpoint or f"{address}:{port or 'any port'}"
            why = exc.strerror if isinstance(exc, zmq.ZMQError) else str(exc)
            raise EndpointError(f"cannot bind the channel at {where}: {why}") from None
        except BaseException:
            sock.close(linger=0)
            raise
        self._sock = sock
        self.endpoint = bound
        return bound

    # --- the overlay contract ---------------------------------------------------

    def headers(self) -> dict[str, str]:
        """The HELLO header that tells servers where this channel is."""
        if self.endpoint is None:
            raise NodeStateError("the channel is not bound yet: give interface=, address= or "
                                 "endpoint=, or attach it to a node")
        return {HEADER_CHANNEL: self.endpoint}

    def attach(self, node: Any) -> None:
        """Attach to ``node`` before it starts; an unbound channel binds on its interface."""
        if self.endpoint is None and self.lifecycle is Lifecycle.NEW and not node.running:
            self._curve = self._curve or getattr(node, "curve", None)
            self._bind(node.config.interface)
        super().attach(node)

    def start(self) -> "Channel":
        """Start reading, pinging and watching connections on the current hub."""
        if self.lifecycle is Lifecycle.NEW and self.node is None:
            if self.endpoint is None:   # on its own, told nothing: the default interface
                self._bind(None)
            self.lifecycle = Lifecycle.ATTACHED   # a channel on its own: attached to no node
        return super().start()

    def _on_oversized(self, identity: bytes) -> None:
        """A message longer than the longest INTR accepted was read and dropped."""
        self._core.over_services(identity, self._clock())
        self._apply(self._take())

    def on_start(self) -> None:
        self._hub = gevent.get_hub()
        self._loop = self._hub.loop
        assert self._sock is not None
        self._router = HubSocket(self._sock, endpoint=self.endpoint or "")
        _transport.read_known(self._router, self._core.known_frames)
        # the connection policy, and the disconnects that make the router probe its servers
        curve = self._curve
        self._guard = GuardedListener(
            self._router, self._core.limits,
            allowlist=curve.allowlist if curve is not None else None,
            on_revoked=lambda keys: self._probe(), events=zmq.EVENT_DISCONNECTED,
            on_event=lambda event, value, endpoint: self._on_monitor(event, endpoint),
            keep=self._core.knows)
        router = self._router
        router.max_frames = 3 + 2 * self._core.max_services
        transport = (ZmqTransport(self._context) if self._clock is time.monotonic
                     else _ClockTransport(self._context, self._clock))
        # a batch's usual REPs answer their callers from the reader
        # (``RequestRouter.answer_each``: no outputs made); the router's messages name their
        # server first (``addressed``)
        self._driver = Driver(self._core, transport, on_deliver=self._deliver,
                              on_event=self._on_event, on_send_failed=self._send_failed,
                              on_oversized=self._on_oversized, look_once=True,
                              addressed=True, batch_clock=True, cork_limit=_CORK_LIMIT,
                              delivery_each=self._answer_each, name=f"channel {self.id}")
        self._driver.listen(self._guard)   # (no metadata: see _source_of)
        log.debug("channel %s at %s started", self.id, self.endpoint)

    def stop(self, timeout: float = 1.0) -> None:
        """Fail every waiting request with ``ChannelClosed`` and close the socket."""
        running = self.running
        super().stop(timeout)
        if not running and self._sock is not None and not self._sock.closed:
            self._sock.close(linger=0)   # never started

    def on_stop(self, timeout: float) -> None:
        assert self._sock is not None
        if self._guard is not None:
            self._guard.stop()  # (its monitor while its reader is still open)
        self._deferring = True
        if self._driver is not None:
            self._driver.drop_corked()   # (their callers are answered ChannelClosed now)
        self._core.close(ChannelClosed("the channel stopped"))
        self._apply(self._take())
        if self._driver is not None:
            self._driver.close()   # (its reader, its timer and the socket)
        self._sock.close(linger=0)
        self._changed.set()

    def __enter__(self) -> "Channel":
        return self.start() if not self.running else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

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
        # _submit's steps, written out: this is the path every request takes
        if self.lifecycle is not _RUNNING:
            raise self._not_running()
        me = getcurrent()
        hub = self._hub
        if me is hub:
            raise BlockingSwitchOutError("Impossible to call blocking function in the event "
                                         "loop callback")
        core = self._core
        rid = core.submit(me, service, action, payload, self._clock(), version, category,
                          timeout, server, retries, raw)
        outputs = core.take()
        driver = self._driver   # (the usual: held with what this turn's callers ask: _cork)
        if (driver is not None and driver.corked and len(outputs) == 1
                and type(outputs[0]) is SendOutput):
            driver.cork(outputs)
        else:
            self._cork(outputs)
        ready = self._ready
        try:
            while ready:   # callers answered with us: the next one is switched to from here
                token, value, error = ready.popleft()
                if type(token) is AsyncResult:
                    _set(token, value, error)
                elif error is None:
                    return _switch(token, value)   # (our answer comes back as its value)
                else:
                    return _throw(token, error)
            return _switch(hub)   # (the answer switches back here: _wake, _resume, above)
        except BaseException:   # (killed, or a gevent.Timeout: nobody waits any more)
            core.forget(rid)
            self._due.pop(me, None)
            raise

    def request_async(self, service: str, action: str, payload: Any = None, *,
                      version: Optional[str] = None, category: str = "",
                      timeout: Optional[float] = None, server: Optional[str] = None,
                      retries: int = 0, raw: bool = False) -> gevent.event.AsyncResult:
        """Like ``request`` but returns at once: an ``AsyncResult`` for the reply."""
        result = gevent.event.AsyncResult()
        self._submit(result, service, action, payload, version, category, timeout, server,
                     retries, raw)
        return result

    def _submit(self, token: Any, service: str, action: str, payload: Any,
                version: Optional[str], category: str, timeout: Optional[float],
                server: Optional[str], retries: int, raw: bool) -> None:
        if self.lifecycle is not _RUNNING:
            raise self._not_running()
        now = self._clock()
        self._core.submit(token, service, action, payload, now, version, category, timeout,
                          server, retries, raw)
        self._cork(self._take())

    def _not_running(self) -> ChannelClosed:
        return ChannelClosed(f"channel is {self.lifecycle.value}" + (
            "" if self.lifecycle is Lifecycle.STOPPED else "; call start() first"))

    # --- what the driver hands over -----------------------------------------------

    def _apply(self, outputs: list[Any]) -> None:
        """Have the driver carry out what the router returned to a call of ours."""
        if outputs:
            assert self._driver is not None
            self._driver.apply(outputs)

    def _cork(self, outputs: list[Any]) -> None:
        """A caller's request: the driver holds its message (``Driver.cork``), so the
        requests callers make in one hub turn (those answered from one batch of replies,
        or a loop of ``request_async``) go out together, at the latest when one server
        has ``_CORK_LIMIT`` of them. The only request in flight goes out at once: no other
        caller is there to ask again in this turn."""
        driver = self._driver
        assert driver is not None
        if len(outputs) == 1 and type(outputs[0]) is SendOutput and (
                driver.corked or self._core.pending > 1):
            driver.cork(outputs)
        elif outputs:
            driver.uncork()   # (what was asked before goes first)
            driver.apply(outputs)

    def _source_of(self, identity: bytes) -> str:
        """The router's ``source_of`` port: the address of a new server (its connection's
        Peer-Address), looked up for its first message alone: no message is read with its
        metadata."""
        address = self._guard.peer_address(identity) if self._guard is not None else None
        return address or ""

    def _unread(self) -> bool:
        """The router's ``unread`` port: do messages wait unread in the socket?"""
        return self._router is not None and self._router.readable()

    def _on_event(self, event: Any) -> None:
        """The router's catalog changed: wake whoever waits for it."""
        changed, self._changed = self._changed, gevent.event.Event()
        changed.set()

    def _send_failed(self, identity: Any, frames: Any, error: BaseException) -> None:
        """A send found no way out (the connection is gone): the router drops the server."""
        if self._router is None or type(identity) is not bytes:
            return
        deferring, self._deferring = self._deferring, True
        try:
            self._router.drain(16)   # its last answers may wait unread
            reason = error.strerror if isinstance(error, zmq.ZMQError) else str(error)
            self._core.send_failed(identity, list(frames[1:]), self._clock(), full=False,
                                   reason=reason)   # (frames[0]: the routing id)
            self._apply(self._take())
        finally:
            self._deferring = deferring

    def _answer_each(self, batch: Any, start: int, now: float,
                     sink: Callable[[Any], None]) -> int:
        """The driver's ``delivery_each``: a batch's usual REPs taken in by the router,
        then each caller switched to in turn (``_wake``; the driver's ``sink``,
        ``_deliver``, while answers must wait for the hub's next turn)."""
        if self._deferring:
            return self._core.answer_each(batch, start, now, sink)
        ready = self._ready
        at = self._core.answer_each(batch, start, now, ready.append)
        if ready:
            self._wake()
        return at

    def _wake(self) -> None:
        """On the hub: the answers in ``_ready`` to their callers, in order (a greenlet is
        switched to; a caller that waits again in ``request`` switches to the next one
        itself, so the hub is back here once the last has run, or one waited for
        something else)."""
        ready = self._ready
        while ready:
            token, value, error = ready.popleft()
            if type(token) is AsyncResult:
                _set(token, value, error)
            elif error is None:
                _switch(token, value)   # (its greenlet waits in ``request``)
            else:
                _throw(token, error)

    def _deliver(self, item: tuple[Any, Any, Optional[BaseException]]) -> None:
        """A ``Deliver``: hand ``value`` or ``error`` to the caller of ``token``.

        A waiting ``request()`` is switched to at once when the router answers
        a message (on the hub: from the reader, for the usual REP, or once the driver
        read its batch); otherwise, and
        while the router is told of the time, of failed sends or of ``stop``
        (it may answer several callers in one loop then), on the hub's next turn.
        """
        token, value, error = item
        if type(token) is AsyncResult:
            _set(token, value, error)
            return
        if getcurrent() is self._hub and not self._deferring:
            self._ready.append(item)
            self._wake()
            return
        if not self._due:
            self._loop.run_callback(self._resume)
        self._due[token] = (value, error)

    def _resume(self) -> None:
        """On the hub: the callers whose answers waited for this turn get them (one whose
        ``request`` was left meanwhile, by a kill, took its answer out: none goes to a
        greenlet that waits for something else)."""
        due = self._due
        while due:
            token = next(iter(due))
            value, error = due.pop(token)
            if error is None:
                _switch(token, value)
            else:
                _throw(token, error)

    def _on_monitor(self, event: int, endpoint: str) -> None:
        if event == zmq.EVENT_DISCONNECTED:
            # Some connection went away: a PING to a routing id whose pipe is gone
            # fails at once (ROUTER_MANDATORY). Probe now and once more shortly after,
            # in case the pipe was not yet torn down.
            self._probe()
            gevent.spawn_later(_PROBE_AGAIN, self._probe)

    def _probe(self) -> None:
        if self.running:
            self._core.probe(self._clock())
            self._apply(self._take())

    # --- the catalog ----------------------------------------------------------

    def refresh(self) -> None:
        """Send RINTR to every known server: each answers with a fresh INTR."""
        self._core.refresh()
        self._apply(self._take())

    def servers(self) -> list[ServerInfo]:
        """Every server that introduced itself and is alive, by id."""
        return self._core.servers(self._clock())

    def services(self) -> dict[str, dict[str, list[str]]]:
        """The catalog: service name -> version -> ids of the servers offering it."""
        return self._core.services()

    def offers(self, service: str, version: Optional[str] = None) -> int:
        """How many servers could serve ``service`` at ``version`` now."""
        return self._core.offers(service, version)

    def metrics(self) -> Any:
        """``Overlay.metrics`` (requests, replies, timeouts, failovers, ... by ``stats``) plus
        the reply times as a histogram and the requests waiting for an answer."""
        yield from super().metrics()
        yield "sada_reply_seconds", {}, self._core.reply_times
        yield "sada_pending_requests", {}, self._core.pending

    @property
    def stats(self) -> dict[str, int]:
        """Counters: requests, replies, timeouts, failovers, retries_503, servers_dropped,
        intr, rintr_sent, dropped (malformed, oversized or unexpected messages), the
        INTRs refused by each limit (``max_services``, ``max_catalog``), and what the
        connection policy shed or closed (``connections_shed``, ``connections_revoked``,
        ``messages_revoked``, ``accept_paused``: see ``peermesh.io.connections``)."""
        return self._core.stats

    def wait_until(self, predicate: Callable[["Channel"], bool],
                   timeout: Optional[float] = None) -> bool:
        """Wait until ``predicate(channel)`` holds, checked after every catalog change."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not predicate(self):
            if self.lifecycle is Lifecycle.STOPPED:
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
        return (f"<Channel {self.endpoint} {self.lifecycle.value} "
                f"servers={len(self._core.servers(self._clock()))} "
                f"pending={self._core.pending}>")
