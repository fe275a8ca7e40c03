"""The channel's routing core: which server gets a request, and what became of it.

How it works
------------
A ``RequestRouter`` is the Safir-Darbaan channel without sockets and without
a clock: a core on the contract of ``peermesh.core``. Its driver
(``Channel``) feeds it what happened: messages from servers
(``receive(link, frames, now)``, the link a server's routing id or
``(routing id, Peer-Address)``), new requests (``submit``), sends that failed
(``send_failed``), a connection that went away (``probe``) and the passing of
time (``handle_timer(now)``, due at ``next_deadline()``). What the router
wants done is returned (``receive``, ``handle_timer``) or collected for
``take()`` (the other calls): ``Send(routing id, frames)`` for every message
to a server and ``Deliver((token, value, error))`` for every finished
request, in order, once the router's own state is updated, and
``Emit(CATALOG_CHANGED)`` whenever the catalog changes (``catalog_version``
counts the changes). A send that failed is
reported with ``send_failed`` after the outputs are applied.

A router made with the functions ``send(identity, frames)`` and
``answer(token, value, error)`` calls them instead of collecting outputs
(then ``on_message(identity, frames, now)`` is the same as ``receive``).

Per server (known by the routing id ZeroMQ gave its connection) it keeps:

* its catalog (service name + version pairs), replaced by every INTR;
* ``in_flight`` requests, a latency EWMA of its replies (a request that
  timed out there counts as a reply after its whole wait) and a ``penalty``
  that doubles whenever a request to it times out and halves back each
  ping interval: the server chosen for a request is the one with the lowest
  ``(in_flight + 1) * latency * penalty`` among those offering the best
  version (see ``versions``);
* when it was last heard from. Any message counts; after ``ping_interval``
  of silence it is PINGed. A server whose PING is unanswered for half an
  interval is *suspect* (new requests avoid it while others can serve), and
  one silent for ``dead_after`` intervals is *dead*: dropped from the
  catalog, its in-flight requests re-sent to another server when the caller
  allowed ``retries``, else failed with ``ServerLost``. A PING (or REQ) the
  driver could not deliver because the connection is gone (``send_failed``)
  drops the server at once.

Requests carry ids unique in the cluster: the channel's id (16 random hex
digits, so a restarted channel never reuses one), a dash, and a counter. Each
has one deadline covering every attempt; deadlines that come in the order of the
requests (one timeout for all, as usual) wait in a queue, first in first out, and
one earlier than the last queued (a shorter timeout) in a heap. A request
for a service no server offers waits, parked, for one to appear until its
deadline. A REP 503 (the server did not run the request) is re-sent to
another server without using up a retry. A REP is accepted only from the
server that holds the request.

A message from a routing id the router does not know (the channel restarted,
or dropped the server as dead) is answered with RINTR, at most once per ping
interval per id; the server then INTRs again.

What a remote sender can grow is bounded: an INTR describes only the
connection it came on (a server introduces only itself, and a REP counts
only from the server that holds the request, so no server can answer for
another), lists at most ``max_services`` services, and is dropped when the
whole catalog would pass ``max_catalog`` entries; each refusal is counted in
``stats`` and logged once per interval. Adding or dropping a server costs
the size of its own catalog, never the whole catalog's. Routing ids waiting
for a RINTR answer are remembered up to 4096.

The usual REP (as the spec draws it, from the server holding the request) is
matched without ``wire.sada``'s careful decoding; anything else takes that
path. ``answer_of(identity, frames, now)`` takes such a REP in and returns its
caller's answer itself, no outputs made (a driver's ``delivery`` fast path), and
``answer_each`` takes a batch's in one call (``delivery_each``); ``known_frames``
names the frames such messages have (a reader may make them once). With the C
extension a batch's usual REPs are taken in by ``sada_take`` and the usual request (a
service and action asked for before, one server alone offering its best version, the
router's timeout, no version, server, retries or raw payload, ``addressed``) is recorded
and its REQ made by ``sada_submit`` (``peermesh.io._zmqbatch``), each the same steps as
the Python code here, which takes everything else and everything without the extension.
A caller that stops waiting is ``forget``-ten: its answer goes nowhere. With ``addressed`` every
``Send``'s frames start with the server's routing id (a driver's ``addressed``
option: sent as they are).

Kept whole: one sans-io core (``RequestRouter``): choosing a server, timeouts, retries
and what each server is known to offer are decisions over the same table of pending
requests.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from collections import deque
from heapq import heappop, heappush
from typing import Any, Callable, Optional, Sequence

import msgpack

from ..core import Deliver, Emit, Outputs
from ..core import Send as SendOutput
from ..errors import ProtocolError
from ..io.zmqbatch import native
from ..counters import Counters
from ..wire import sada as wire
from ..zre.roundtrip import BUCKETS, RoundTrip
from ..wire.sada import Intr, Ping, Pong, ServiceId, Status
from .handlers import unpack as _unpack
from .errors import NoServerError, RequestTimeout, ServerLost, ServiceError
from .versions import choose_version, is_compatible, version_key

__all__ = ["RequestRouter", "ServerInfo", "Send", "Answer", "MAX_SERVICES", "MAX_CATALOG",
           "CATALOG_CHANGED"]

log = logging.getLogger(__name__)

#: sends a message: ``send(routing id, frames after it)`` (a router made without it returns
#: ``peermesh.core.Send`` outputs instead)
Send = Callable[[bytes, list[bytes]], Any]
#: answers a caller: ``answer(the token given to submit, value, error or None)``
Answer = Callable[[Any, Any, Optional[BaseException]], Any]

#: the event a router without callbacks emits whenever its catalog changes
CATALOG_CHANGED = "catalog"
_CATALOG_CHANGED = Emit(CATALOG_CHANGED)

#: services one INTR may list by default; a longer INTR is dropped unread (a
#: remote sender's bound; servers refuse to offer more)
MAX_SERVICES = 4096
#: (server, service) pairs in the whole catalog by default; an INTR that would
#: go past it is dropped and the server keeps what it offered before
MAX_CATALOG = 16384

_PING = wire.encode(Ping())
_RINTR = wire.encode(wire.Rintr())
_DELIMITER = wire.DELIMITER
_PROTOCOL = wire.PROTOCOL
_REQ = wire.Command.REQ.frame
_REP = wire.Command.REP.frame
_OK = wire.status_frame(200)
_STATUS_OF = {_OK if code == 200 else wire.status_frame(code): code for code in range(100, 600)}
#: the frames every usual message from a server has (a REP of 200, a PONG)
_KNOWN = (_PROTOCOL, _REP, _OK, wire.Command.PONG.frame)
_EWMA = 0.2            # weight of the newest latency sample
_MAX_PENALTY = 64.0
_INITIAL_LATENCY = 0.001
_MAX_CACHED = 4096     # encoded fields and versions remembered
_MAX_RINTR = 4096      # unknown routing ids remembered for the RINTR rate limit
_NO_EXCLUSION: frozenset = frozenset()
#: the token of a request whose caller stopped waiting (``forget``): its answer goes nowhere
_FORGOTTEN = object()
#: ``answer_each``'s usual case in C (``peermesh.io._zmqbatch.sada_take``); None without
#: the extension (or with a build older than it): the Python loop alone, the same behaviour
_take_in_c: Optional[Callable[..., int]] = getattr(native, "sada_take", None)
#: ``submit``'s usual request in C (``peermesh.io._zmqbatch.sada_submit``: None, the same)
_submit_in_c: Optional[Callable[..., Optional[bytes]]] = getattr(native, "sada_submit", None)


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
    """What the router knows about one server connection."""

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
    """One request between ``submit`` and its answer."""

    __slots__ = ("rid", "service", "version", "fields", "body", "raw", "token", "timeout",
                 "server", "target", "sent_at", "attempts", "retries", "excluded", "parked",
                 "deadline")

    def __init__(self, rid: bytes, service: str, version: Optional[str],
                 fields: tuple[bytes, bytes, bytes], body: bytes, raw: bool, timeout: float,
                 target: Optional[bytes], retries: int, token: Any, deadline: float) -> None:
        self.rid = rid
        self.service = service
        self.version = version
        self.fields = fields            # encoded service name, category, action
        self.body = body
        self.raw = raw
        self.token = token              # the caller's; None once answered
        self.timeout = timeout
        self.server: Optional[_Server] = None
        self.target = target
        self.sent_at = 0.0
        self.attempts = 0
        self.retries = retries
        self.excluded: frozenset[bytes] = _NO_EXCLUSION
        self.parked = False
        self.deadline = deadline        # covering every attempt

    def what(self) -> str:
        """The service and action, for messages: ``calc math/add``."""
        _, category, action = self.fields
        return f"{self.service} {category.decode() + '/' if category else ''}{action.decode()}"

    def rid_text(self) -> str:
        return self.rid.decode("ascii", "replace")


def _text(kind: str, value: str, empty_ok: bool = False) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"{kind} must be a str, not {type(value).__name__}")
    data = value.encode("utf-8")
    if len(data) > wire.MAX_TEXT or (not data and not empty_ok):
        raise ValueError(f"{kind} must be 1-{wire.MAX_TEXT} UTF-8 octets: {value[:40]!r}"
                         if not empty_ok else f"{kind} is over {wire.MAX_TEXT} octets")
    return data


def _no_address(meta: Any) -> str:
    return ""


class RequestRouter(Outputs):
    """The routing state of one channel; no I/O, time given by the caller.

    ``channel_id`` prefixes every request id. Without ``send`` and ``answer``
    the router returns ``Send`` and ``Deliver((token, value, error))``
    outputs (``peermesh.core``); with them it calls them instead.
    ``address_of(meta)`` gives the address of a new server from the ``meta``
    its first message came with (the driver's, e.g. its Peer-Address);
    ``source_of(identity)``, of one whose link is its bare routing id (the
    driver read no metadata: the owner looks the one sender up);
    ``unread()`` says whether messages wait unread at the driver (a port the
    timer asks, see ``handle_timer``).
    """

    def __init__(self, channel_id: str, send: Optional[Send] = None,
                 answer: Optional[Answer] = None, *,
                 ping_interval: float = 1.0, dead_after: float = 3.0, timeout: float = 5.0,
                 now: float = 0.0, max_services: int = MAX_SERVICES,
                 max_catalog: int = MAX_CATALOG,
                 address_of: Callable[[Any], str] = _no_address,
                 source_of: Optional[Callable[[bytes], str]] = None,
                 unread: Callable[[], bool] = bool, addressed: bool = False) -> None:
        if not ping_interval > 0 or not dead_after >= 1 or not timeout > 0:
            raise ValueError("ping_interval and timeout must be positive, dead_after at least 1")
        if not max_services >= 1 or not max_catalog >= 1:
            raise ValueError("max_services and max_catalog must be at least 1")
        self.ping_interval = float(ping_interval)
        self.dead_after = float(dead_after)
        self.timeout = float(timeout)
        super().__init__()
        self._send: Send = send if send is not None else self._send_output
        self._answer: Answer = answer if answer is not None else self._answer_output
        self._address_of = address_of
        self._source_of = source_of
        self._unread = unread
        self._emits = answer is None
        # Send outputs carry the routing id as their first frame (a driver's ``addressed``)
        self._addressed = addressed and send is None
        if self._addressed:
            self._send = self._send_addressed
        self.max_services = max_services
        self._max_frames = 3 + 2 * max_services
        self._max_catalog = max_catalog
        #: refusals by limit: ``max_services`` (INTRs too long), ``max_catalog``
        self.limits = Counters(log, "Safir-Darbaan channel hit its limits")
        self._catalog_size = 0                          # (server, service) pairs offered
        # a request id: the channel's id, a dash, the counter in hex (one formatting)
        self._rid_format = channel_id.encode("ascii").replace(b"%", b"%%") + b"-%x"
        self._counter = 0
        # payloads packed as ``handlers.pack`` does, by one packer kept (msgpack.packb makes
        # one per call); the router is used from one thread
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self._servers: dict[bytes, _Server] = {}
        self._routes: dict[str, dict[str, list[_Server]]] = {}
        self._route_cache: dict[tuple[str, Optional[str]],
                                list[tuple[bytes, list[_Server]]]] = {}
        self._pending: dict[bytes, _Pending] = {}
        # Deadlines: those that come in the order of the requests (all of one timeout, as
        # usual) wait in a queue, first in first out (no heap entry per request); a
        # deadline earlier than the last queued one (a shorter timeout) waits in a heap.
        self._due: deque[_Pending] = deque()
        self._deadlines: list[tuple[float, int, _Pending]] = []   # a heap
        self._parked: list[_Pending] = []
        self._rintr_sent: dict[bytes, float] = {}
        self._fields: dict[tuple[str, str, str], tuple[bytes, bytes, bytes]] = {}
        self._versions: set[str] = set()          # requested versions found valid
        self._period = self.ping_interval / 4          # liveness is looked at this often
        self._last_tick = now
        self._next_tick = now + self._period
        #: changes whenever the catalog (servers or their services) changes
        self.catalog_version = 0
        self._replies = 0
        #: seconds from a request's (last) sending to a server to its reply
        self.reply_times = RoundTrip()
        # what ``sada_take`` is given to take a batch's usual REPs in as ``answer_each`` does
        self._take_shape = (_PROTOCOL, _REP, _STATUS_OF, _unpack, _FORGOTTEN,
                            self.reply_times, BUCKETS, _EWMA)
        # what ``sada_submit`` is given to take the usual request as ``submit`` does
        self._submit_shape = (self._fields, self._route_cache, self._pending, self._due,
                              self._pack, channel_id.encode("ascii") + b"-", _Pending,
                              SendOutput, _DELIMITER, _PROTOCOL, _REQ, _NO_EXCLUSION)
        self._counts: dict[str, int] = dict.fromkeys(
            ("timeouts", "failovers", "retries_503", "servers_dropped", "intr", "rintr_sent",
             "dropped"), 0)

    # --- the core contract ----------------------------------------------------

    def receive(self, link: Any, frames: list[bytes], now: float) -> list[Any]:
        """A message from ``link`` (a routing id, or ``(routing id, meta)``); the outputs."""
        if type(link) is tuple:
            self.on_message(link[0], frames, now, link[1])
        else:
            self.on_message(link, frames, now)
        return self.take()

    def _send_output(self, identity: bytes, frames: list[bytes]) -> None:
        self._outputs.append(SendOutput(identity, frames))

    def _send_addressed(self, identity: bytes, frames: list[bytes]) -> None:
        self._outputs.append(SendOutput(identity, [identity, *frames]))

    def _answer_output(self, token: Any, value: Any, error: Optional[BaseException]) -> None:
        self._outputs.append(Deliver((token, value, error)))

    # --- requests -------------------------------------------------------------

    def submit(self, token: Any, service: str, action: str, payload: Any, now: float,
               version: Optional[str] = None, category: str = "",
               timeout: Optional[float] = None, server: Optional[str] = None,
               retries: int = 0, raw: bool = False) -> bytes:
        """Take a request; its answer goes to ``answer`` with ``token``.

        Returns the request id. Raises ``TypeError``/``ValueError`` for
        arguments that cannot be sent (nothing is taken then).
        """
        usual = _submit_in_c   # (a cached service and route, the defaults, addressed Sends)
        if (usual is not None and self._addressed and version is None and timeout is None
                and server is None and retries == 0 and not raw):
            rid = usual(self, token, service, category, action, payload, now,
                        self._submit_shape)
            if rid is not None:
                return rid
        key = (service, category, action)
        fields = self._fields.get(key)
        if fields is None:
            fields = (_text("service name", service), _text("action category", category, True),
                      _text("action name", action))
            if len(self._fields) < _MAX_CACHED:
                self._fields[key] = fields
        if version is not None and version not in self._versions:
            _text("service version", version)
            if len(self._versions) < _MAX_CACHED:
                self._versions.add(version)
        if raw:
            if not isinstance(payload, (bytes, bytearray, memoryview)):
                raise TypeError(f"a raw payload must be bytes, not {type(payload).__name__}")
            body = bytes(payload)
        else:
            body = self._pack(payload)
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
        counter = self._counter = self._counter + 1
        rid = self._rid_format % counter
        deadline = now + timeout
        pending = _Pending(rid, service, version, fields, body, raw, timeout, target, retries,
                           token, deadline)
        self._pending[rid] = pending
        due = self._due
        if not due or due[-1].deadline <= deadline:
            due.append(pending)
        else:
            heappush(self._deadlines, (deadline, counter, pending))
        self._dispatch(pending, now)
        return rid

    def close(self, error: BaseException) -> None:
        """Answer every waiting request with ``error`` (the channel stops)."""
        for pending in list(self._pending.values()):
            self._finish(pending, error=error)
        self._parked.clear()
        self._due.clear()
        self._deadlines.clear()

    def forget(self, rid: bytes) -> None:
        """The caller of request ``rid`` stopped waiting (its greenlet was killed, say):
        its answer goes nowhere when it comes; the request runs its course."""
        pending = self._pending.get(rid)
        if pending is not None and pending.token is not None:
            pending.token = _FORGOTTEN

    @property
    def stats(self) -> dict[str, int]:
        """Counters: requests, replies, timeouts, failovers, retries_503, servers_dropped,
        intr, rintr_sent, dropped (malformed, oversized or unexpected messages), and per
        limit the INTRs refused by it (``max_services``, ``max_catalog``)."""
        return {"requests": self._counter, "replies": self._replies, **self._counts,
                "max_services": 0, "max_catalog": 0, **self.limits.snapshot()}

    @property
    def pending(self) -> int:
        """Requests waiting for an answer."""
        return len(self._pending)

    def _dispatch(self, pending: _Pending, now: float) -> None:
        """Send ``pending`` to the best server, or park it until one appears."""
        choice = self._choose(pending)
        if choice is None:
            if pending.target is not None:  # that connection is gone: it never comes back
                self._finish(pending, error=self._no_server(pending))
            elif not pending.parked:
                pending.parked = True
                self._parked.append(pending)
            return
        version_frame, server = choice
        if pending.parked:
            pending.parked = False
            self._parked.remove(pending)
        pending.server = server
        pending.attempts += 1
        server.in_flight += 1
        pending.sent_at = now
        fields = pending.fields
        identity = server.identity
        if self._addressed:   # (the usual message: made whole at once, no copy)
            self._outputs.append(SendOutput(identity, (
                identity, _DELIMITER, _PROTOCOL, _REQ, pending.rid, fields[0], version_frame,
                fields[1], fields[2], pending.body)))
        else:
            self._send(identity, [_DELIMITER, _PROTOCOL, _REQ, pending.rid, fields[0],
                                  version_frame, fields[1], fields[2], pending.body])

    def _choose(self, pending: _Pending) -> Optional[tuple[bytes, _Server]]:
        """The server for ``pending`` and the version frame to ask it for, or None."""
        excluded = pending.excluded
        if pending.target is not None:
            server = self._servers.get(pending.target)
            if server is None or server.identity in excluded:
                return None
            offered = [v for n, v in server.services if n == pending.service]
            version = choose_version(offered, pending.version)
            return (version or pending.version or "*").encode("utf-8"), server
        fallback = None
        groups = self._route_cache.get((pending.service, pending.version))
        if groups is None:
            groups = self._route(pending.service, pending.version)
        for frame, servers in groups:
            if len(servers) == 1:   # the usual small case: nothing to compare
                server = servers[0]
                if not excluded or server.identity not in excluded:
                    if not server.suspect:
                        return frame, server
                    if fallback is None:
                        fallback = (frame, server)
                continue
            best = None
            best_score = math.inf
            for server in servers:
                if excluded and server.identity in excluded:
                    continue
                if server.suspect:
                    if fallback is None:
                        fallback = (frame, server)
                    continue
                score = (server.in_flight + 1) * server.latency * server.penalty
                if score < best_score:
                    best, best_score = server, score
            if best is not None:
                return frame, best
        return fallback

    def _route(self, service: str, version: Optional[str]) -> list[tuple[bytes, list[_Server]]]:
        """(version frame, servers) groups that may serve the request, best first (cached)."""
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
            groups = [(v.encode("utf-8"), offered[v]) for v in usable]
            if len(self._route_cache) < _MAX_CACHED:
                self._route_cache[key] = groups
        return groups

    def send_failed(self, identity: bytes, frames: list[bytes], now: float, *,
                    full: bool, reason: str = "") -> None:
        """The driver could not send ``frames`` to ``identity``.

        ``full``: its queue is full (a busy server: a REQ goes elsewhere);
        otherwise the connection is gone and the server is dropped.
        """
        server = self._servers.get(identity)
        pending = None
        if len(frames) > 3 and frames[2] == _REQ:
            pending = self._pending.get(frames[3])
            if pending is not None and server is not None and pending.server is server:
                pending.server = None      # it never left: take the attempt back
                pending.attempts -= 1
                server.in_flight -= 1
                pending.excluded = pending.excluded | {identity}
            else:
                pending = None
        if server is not None:
            if full:
                if pending is not None:   # a busy server: a PING waits for the next turn
                    self._penalise(server, now)
            else:
                self._drop(server, f"unreachable ({reason})" if reason else "unreachable", now)
        if pending is not None and pending.token is not None and pending.server is None:
            self._dispatch(pending, now)

    # --- answers and deadlines ------------------------------------------------

    def _finish(self, pending: _Pending, value: Any = None,
                error: Optional[BaseException] = None) -> None:
        """Take ``pending`` out of every table and answer the caller."""
        if pending.token is not None:
            token = self._settle(pending)
            if token is not _FORGOTTEN:
                self._answer(token, value, error)

    def _settle(self, pending: _Pending) -> Any:
        """Take ``pending`` (not yet answered) out of every table; its caller's token."""
        token = pending.token
        pending.token = None
        pending.body = b""
        del self._pending[pending.rid]
        server = pending.server
        if server is not None:
            server.in_flight -= 1
            pending.server = None
        if pending.parked:
            pending.parked = False
            self._parked.remove(pending)
        self._tidy()
        return token

    def _tidy(self) -> None:
        """Drop the answered requests from the top of the deadline queue and heap."""
        due = self._due
        while due and due[0].token is None:   # answered early: forget
            due.popleft()
        self._pop_answered()

    def _pop_answered(self) -> None:
        """Drop the heap's answered deadlines from its top."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][2].token is None:
            heappop(deadlines)

    def next_deadline(self) -> float:
        """When ``handle_timer`` is next due (the earliest request deadline or liveness check)."""
        earliest = self._next_tick
        due = self._due
        if due and due[0].deadline < earliest:
            earliest = due[0].deadline
        deadlines = self._deadlines
        if deadlines and deadlines[0][0] < earliest:
            earliest = deadlines[0][0]
        return earliest

    def handle_timer(self, now: float, *, backlog: Optional[bool] = None) -> list[Any]:
        """Expire requests whose deadline passed; PING, suspect and drop silent servers.

        ``backlog``: messages wait unread at the driver (then nobody is judged
        dead now, as when the driver's process was too busy to call on time;
        None: ask the ``unread`` port). Returns the outputs.
        """
        due, deadlines = self._due, self._deadlines
        while True:   # (the queue's and the heap's, earliest first)
            if due and due[0].deadline <= now and not (
                    deadlines and deadlines[0][0] < due[0].deadline):
                pending = due.popleft()
            elif deadlines and deadlines[0][0] <= now:
                pending = heappop(deadlines)[2]
            else:
                break
            if pending.token is not None:
                self._expire(pending, now)
        while due and due[0].token is None:
            due.popleft()
        while deadlines and deadlines[0][2].token is None:
            heappop(deadlines)
        if now >= self._next_tick:
            if backlog is None:
                backlog = self._unread()
            judge = now - self._last_tick < 2 * self._period and not backlog
            self._last_tick = now
            self._next_tick = now + self._period
            self._tick(now, judge)
        return self.take()

    def _expire(self, pending: _Pending, now: float) -> None:
        """The request's deadline passed."""
        server = pending.server
        if server is not None:
            self._penalise(server, now)
            server.latency += _EWMA * (now - pending.sent_at - server.latency)
            self._counts["timeouts"] += 1
            error: Exception = RequestTimeout(
                f"no reply to {pending.what()} (request {pending.rid_text()}) from server "
                f"{server.id} within {pending.timeout:g} s", request_id=pending.rid,
                server=server.id, attempts=pending.attempts)
        elif pending.attempts:
            error = ServerLost(
                f"{pending.what()}: the server holding request {pending.rid_text()} died and "
                f"no other server took it within {pending.timeout:g} s",
                request_id=pending.rid, attempts=pending.attempts)
        else:
            error = self._no_server(pending)
        self._finish(pending, error=error)

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

    def _penalise(self, server: _Server, now: float) -> None:
        server.penalty = min(server.penalty * 2, _MAX_PENALTY)
        server.penalized_at = now

    # --- incoming -------------------------------------------------------------

    def on_message(self, identity: bytes, frames: list[bytes], now: float,
                   meta: Any = None) -> None:
        """A message from routing id ``identity`` (the frames after it)."""
        # The usual case: a REP as the spec draws it, from the server holding the request.
        if len(frames) == 6 and frames[2] == _REP and frames[1] == _PROTOCOL and not frames[0]:
            pending = self._pending.get(frames[3])
            if pending is not None:
                server = pending.server      # always a live server (a dropped one lets go)
                status = _STATUS_OF.get(frames[4])
                if server is not None and server.identity == identity and status is not None:
                    server.last_heard = now
                    server.suspect = False
                    self._on_rep(server, pending, status, frames[5], now)
                    return
        try:
            if wire.command_of(frames) == _REP:
                rid, status, payload = wire.parse_rep(frames)
                server = self._servers.get(identity)
                if server is None:
                    self._unknown(identity, now)
                    return
                server.last_heard = now
                server.suspect = False
                pending = self._pending.get(rid)
                if pending is None or pending.server is not server:
                    log.debug("REP for unknown or expired request %r from %s", rid, server.id)
                    return
                self._on_rep(server, pending, status, payload, now)
                return
            if len(frames) > self._max_frames:
                self.over_services(identity, now)
                return
            message = wire.decode(frames)
        except ProtocolError as exc:
            self._counts["dropped"] += 1
            log.debug("dropped message from %r: %s", identity, exc.reason)
            return
        server = self._servers.get(identity)
        kind = type(message)
        if kind is Intr:
            self._on_intr(identity, server, message, now, meta)  # type: ignore[arg-type]
        elif kind is Pong:
            if server is None:
                self._unknown(identity, now)
                return
            server.last_heard = now
            server.suspect = False
        else:  # REQ, RINTR, PING: commands a server does not send
            self._counts["dropped"] += 1
            log.debug("dropped unexpected %s from %r", kind.__name__, identity)

    def answer_of(self, identity: Any, frames: list[bytes], now: float
                  ) -> Optional[tuple[Any, Any, Optional[BaseException]]]:
        """The usual message, a REP (status below 400, as the spec draws it) from the
        server holding its request, taken in: the caller's answer ``(token, value, error)``,
        as a ``Deliver`` carries it, once the router's state is updated (the driver's
        ``delivery`` fast path: no outputs are made). None for any other message, untouched
        (``receive`` it), and for the answer of a ``forget``-ten request (taken in)."""
        items: list[tuple[Any, Any, Optional[BaseException]]] = []
        self.answer_each(((identity, frames),), 0, now, items.append)
        return items[0] if items else None

    def answer_each(self, batch: Sequence[tuple[Any, Optional[list[bytes]]]], start: int,
                    now: float, sink: Callable[[tuple[Any, Any, Optional[BaseException]]], Any]
                    ) -> int:
        """``answer_of`` over the messages of a batch (``(routing id, frames)`` each, frames
        None for one over the limits) from index ``start`` on, each answer handed to
        ``sink`` at once (the router's state already updated: ``sink`` may submit again),
        for as long as they are the usual REP: the index of the first that is not
        (``len(batch)``: none), left as it was for ``receive``. One call per batch, not
        per message (a driver's ``delivery_each``)."""
        pendings, status_of = self._pending, _STATUS_OF
        at, end = start, len(batch)
        take = _take_in_c
        if take is not None and at < end:   # (its first unusual message goes on below)
            at = take(batch, at, pendings, now, sink, self._take_shape)
            if at > start:
                self._replies += at - start
                self._tidy()
        while at < end:
            identity, frames = batch[at]
            if (frames is None or len(frames) != 6 or frames[2] != _REP
                    or frames[1] != _PROTOCOL or frames[0]):
                return at
            pending = pendings.get(frames[3])
            if pending is None:
                return at
            server = pending.server
            status = status_of.get(frames[4])
            if (server is None or server.identity != identity or status is None
                    or status >= 400):
                return at
            at += 1
            server.last_heard = now
            server.suspect = False
            self._count_reply(server, pending, now)
            value, error = self._value_of(server, pending, frames[5])
            token = self._settle(pending)
            if token is not _FORGOTTEN:
                sink((token, value, error))
        return at

    def _count_reply(self, server: _Server, pending: _Pending, now: float) -> None:
        server.replies += 1
        server.latency += _EWMA * (now - pending.sent_at - server.latency)
        self._replies += 1
        self.reply_times.add(now - pending.sent_at)

    def _value_of(self, server: _Server, pending: _Pending,
                  payload: bytes) -> tuple[Any, Optional[BaseException]]:
        """The value of a successful REP's payload, or the error it is."""
        if pending.raw:
            return payload, None
        try:
            return _unpack(payload), None
        except Exception as exc:
            return None, ServiceError(Status.BAD_REQUEST, f"reply payload is not msgpack: {exc}",
                                      request_id=pending.rid, server=server.id)

    def _on_rep(self, server: _Server, pending: _Pending, status: int, payload: bytes,
                now: float) -> None:
        """``server`` answered ``pending`` (which it held)."""
        self._count_reply(server, pending, now)
        if status < 400:
            value, error = self._value_of(server, pending, payload)
            self._finish(pending, value, error)
            return
        if status == Status.UNAVAILABLE and pending.target is None:
            # not run there: safe to send elsewhere, retries or not
            self._counts["retries_503"] += 1
            server.in_flight -= 1
            pending.server = None
            pending.excluded = pending.excluded | {server.identity}
            if self._choose(pending) is not None:
                self._dispatch(pending, now)
                return
        message = payload.decode("utf-8", "replace")
        self._finish(pending, error=ServiceError(status, message, request_id=pending.rid,
                                                 server=server.id))

    def _on_intr(self, identity: bytes, server: Optional[_Server], intr: Intr, now: float,
                 meta: Any) -> None:
        self._counts["intr"] += 1
        services = frozenset((s.name, s.version) for s in intr.services)
        before = len(server.services) if server is not None else 0
        if self._catalog_size - before + len(services) > self._max_catalog:
            self._counts["dropped"] += 1
            self.limits.over("max_catalog", f"dropped an INTR of {len(services)} services from "
                             f"{identity.hex()}: the catalog holds {self._catalog_size} of "
                             f"{self._max_catalog}", now)
            return
        if server is None:
            known = [s.latency for s in self._servers.values()]
            address = (self._source_of(identity) if meta is None and self._source_of
                       is not None else self._address_of(meta))
            server = _Server(identity, address, now,
                             min(known) if known else _INITIAL_LATENCY)
            self._servers[identity] = server
            self._rintr_sent.pop(identity, None)
            log.debug("server %s (%s) introduced itself", server.id, server.address)
        server.last_heard = now
        server.suspect = False
        if services != server.services:
            self._offer(server, services)
        self._catalog_changed(now)

    def over_services(self, identity: bytes, now: float) -> None:
        """An INTR longer than ``max_services`` came from ``identity`` (dropped unread)."""
        self._counts["dropped"] += 1
        self.limits.over("max_services", f"dropped an INTR from {identity.hex()}: over "
                         f"{self.max_services} services", now)

    def _unknown(self, identity: bytes, now: float) -> None:
        """A server this channel does not know spoke: ask it to introduce itself."""
        sent = self._rintr_sent.get(identity)
        if sent is not None and now - sent < self.ping_interval:
            return
        if len(self._rintr_sent) >= _MAX_RINTR:
            self._rintr_sent = {k: t for k, t in self._rintr_sent.items()
                                if now - t < self.ping_interval}
            if len(self._rintr_sent) >= _MAX_RINTR:
                return
        self._rintr_sent[identity] = now
        self._send(identity, _RINTR)
        self._counts["rintr_sent"] += 1
        log.debug("sent RINTR to unknown server %s", identity.hex())

    def probe(self, now: float) -> None:
        """PING every server now (a connection went away: find out whose)."""
        for server in self._servers.values():
            self._ping(server, now)

    def refresh(self) -> None:
        """RINTR every known server: each answers with a fresh INTR."""
        for server in self._servers.values():
            self._send(server.identity, _RINTR)
            self._counts["rintr_sent"] += 1

    # --- liveness -------------------------------------------------------------

    def _ping(self, server: _Server, now: float) -> None:
        if server.ping_sent <= server.last_heard:
            server.ping_sent = now
        self._send(server.identity, _PING)

    def _tick(self, now: float, judge: bool) -> None:
        interval = self.ping_interval
        dead = self.dead_after * interval
        for server in list(self._servers.values()):
            silence = now - server.last_heard
            if silence >= dead and judge:
                self._drop(server, f"no REP or PONG for {silence:.2f} s", now)
                continue
            if silence >= interval and now - server.ping_sent >= interval:
                server.ping_sent = now
                self._ping(server, now)
            if (server.ping_sent > server.last_heard and now - server.ping_sent >= interval / 2
                    and not server.suspect):
                server.suspect = True
                log.debug("server %s is suspect: PING unanswered", server.id)
            if server.penalty > 1 and now - server.penalized_at >= interval:
                server.penalty = max(1.0, server.penalty / 2)
                server.penalized_at = now

    def _drop(self, server: _Server, reason: str, now: float) -> None:
        """Remove a dead server; fail over or fail what it held."""
        if self._servers.get(server.identity) is not server:
            return
        del self._servers[server.identity]
        server.alive = False
        self._counts["servers_dropped"] += 1
        log.info("server %s (%s) dropped: %s", server.id, server.address, reason)
        self._offer(server, frozenset())
        held = [p for p in self._pending.values() if p.server is server]
        server.in_flight = 0
        for pending in held:
            pending.server = None
            pending.excluded = pending.excluded | {server.identity}
            if pending.retries > 0 and pending.target is None:
                pending.retries -= 1
                self._counts["failovers"] += 1
                self._dispatch(pending, now)
            else:
                self._finish(pending, error=ServerLost(
                    f"{pending.what()}: server {server.id} died holding "
                    f"request {pending.rid_text()} ({reason})"
                    + ("" if pending.target is not None else
                       "; no retries allowed" if pending.attempts <= 1 else "; no retries left"),
                    request_id=pending.rid, server=server.id, attempts=pending.attempts))
        self._catalog_changed(now)

    # --- the catalog ----------------------------------------------------------

    def _offer(self, server: _Server, services: frozenset[tuple[str, str]]) -> None:
        """Make ``services`` what ``server`` offers: only what changed is touched, so
        a large INTR costs its own size, never the whole catalog's."""
        routes = self._routes
        for name, version in server.services - services:
            versions = routes[name]
            versions[version].remove(server)
            if not versions[version]:
                del versions[version]
                if not versions:
                    del routes[name]
        for name, version in services - server.services:
            routes.setdefault(name, {}).setdefault(version, []).append(server)
        self._catalog_size += len(services) - len(server.services)
        server.services = services
        self._route_cache.clear()

    def _catalog_changed(self, now: float) -> None:
        self.catalog_version += 1
        if self._emits:
            self._outputs.append(_CATALOG_CHANGED)
        for pending in list(self._parked):
            if pending.parked and pending.token is not None:
                self._dispatch(pending, now)

    def known_frames(self) -> tuple[bytes, ...]:
        """The frames every usual message from a server has (the driver may read them as
        these very objects: ``HubSocket.wrap_reader``, ``zmqbatch.knows_frames``)."""
        return _KNOWN

    def knows(self, identity: bytes) -> bool:
        """Whether the server of routing id ``identity`` introduced itself (and is kept)."""
        return identity in self._servers

    def servers(self, now: float) -> list[ServerInfo]:
        """Every server that introduced itself and is alive, by id."""
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
