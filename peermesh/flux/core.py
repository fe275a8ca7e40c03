"""One node of a Flux instance as a sans-io state machine: routing, events, the tree.

How it works
------------
``FluxCore`` owns no socket and reads no clock. The driver feeds it what
arrives, ``receive(link, frames, now)``, the calls of local handles
(``rpc``, ``respond``, ``publish``, ...), ``link_down(link, now)`` when a send
found a link gone, and ``timer(now)`` at ``next_deadline``; every call returns
a list of outputs: ``Send(link, frames)``, ``Deliver(handle, message)``,
``Dial(endpoint, identity)`` (replace the link to the parent), ``Hangup()``
and ``Notice(what, rank, detail)``.

Links. ``PARENT`` is the one DEALER this node connects (to its parent, or
while joining to a bootstrap endpoint); every other link is the identity
of a peer on this node's ROUTER (children, and guests that are joining).
Frames sent to a child start with its identity (the ROUTER's address).

Identities and hello. Every node has a random 16-byte identity per start
(its DEALER's routing id). A node joins in two steps, both ordinary Flux
requests from the core's own handle (``@0``):

1. ``overlay.join`` to rank 0 (``nodeid`` 0), sent from a bootstrap
   endpoint (any member of the instance: a parent list, or the root's
   endpoint from the ZRE mesh) with ``{"rank": R or -1, "uuid", "endpoint"}``.
   Rank 0 answers ``{"rank", "parent", "endpoint", "size"}``: a claimed rank
   R if no other live node holds it (else EEXIST), otherwise the next rank
   never given (ranks grow the instance while it runs: no restart, ``size``
   is the highest rank given + 1); the parent is the nearest formula
   ancestor rank 0 has given out and not heard lost (a parent may still be
   attaching itself: it accepts children already). A node that could reach
   none of its candidate parents says so when it joins again (``failed``),
   and rank 0 passes over those ranks.
2. ``overlay.hello`` to that parent over a new DEALER, ``{"rank", "uuid",
   "endpoint"}``. The parent accepts a rank below it in the formula tree
   (EEXIST if a live child holds it, ENOSPC past ``max_children``) and
   answers ``{"ancestors": [[rank, endpoint], ...], "seq", "size"}``; it tells
   rank 0 with ``overlay.attached`` (no response), so rank 0's directory
   knows where each rank listens.

States (``State``)::

    state      event                                     next        outputs
    ---------  ----------------------------------------  ----------  ------------------------
    DETACHED   start, root                               ONLINE      Notice online
    DETACHED   start / set_bootstrap, endpoints known    JOINING     Dial bootstrap, join
    JOINING    join answered                             ATTACHING   Dial parent, hello
    JOINING    error or hello_timeout                    JOINING     next bootstrap endpoint
    ATTACHING  hello answered                            ONLINE      Notice online (replay gap)
    ATTACHING  EEXIST                                    JOINING     join again, rank -1
    ATTACHING  other error or hello_timeout              ATTACHING   next ancestor, else JOINING
    ONLINE     parent lost (DISCONNECT, link down,       ATTACHING   fail RPCs via parent,
               silent for ``lost`` s)                                hello to the grandparent
    any        stop                                      STOPPED     DISCONNECT to all links

Leaving and faults. A child that sends DISCONNECT, that a send finds gone
(ROUTER_MANDATORY: at once when its process died), or that is silent for
``lost`` seconds is lost: every request this node forwarded to it is
answered EHOSTUNREACH at once, and rank 0 is told (``overlay.lost``), which
marks the rank offline (it stays reserved for the node that held it, and a
node may claim it again). Orphans re-attach to the nearest live ancestor
(the hello answer gave each node its ancestor chain), keeping their ranks
and their subtrees; when the chain is exhausted (rank 0 itself was lost)
they join again through the bootstrap endpoints, claiming their ranks.
So when rank 0 is lost, an instance bootstrapped from a parent list waits
for rank 0 to answer at its endpoint again (its subtrees stay whole and
keep their ranks, and rank 0's directory fills again from their joins);
one bootstrapped through the ZRE mesh has the next elected member take
over as rank 0 (``peermesh.flux.overlay``). A partition heals the same way:
the side cut off from rank 0 keeps trying its ancestors and the bootstrap
endpoints until they answer, then it is one tree again. A
child silent for ``torpid`` seconds is reported torpid (and still served).
Heartbeats (control messages) go on every link idle for ``heartbeat`` s.

Request routing (RFC 3; ``me`` is this node's rank)::

    nodeid                condition                                  action
    --------------------  -----------------------------------------  -------------------
    ANY, UPSTREAM != me   a local handle serves the service and is    deliver to it
                          not the sender
    ANY                   built-in service (overlay, event, broker)   answer here
    ANY                   a parent                                    up
    ANY                   root                                        ENOSYS
    me                    local service / built-in                    deliver / answer
    me                    none                                        ENOSYS
    T                     a child (or adopted orphan) on T's path     down to it
    T                     no route down, came from the parent         EHOSTUNREACH
    T                     a parent                                    up
    T                     no parent                                   EHOSTUNREACH

Requests carry the route back: arriving from a child its identity is pushed
(what a ROUTER does anyway), from the parent ``^``, from local handle n
``@n``; a response pops its top entry to go back the same way. Each request
forwarded to a link (unless NORESPONSE) is remembered until its final
response so that the loss of that link can answer it.

Events: rank 0 numbers them from 1 (``event.pub`` requests from other
ranks), keeps the last ``recent_events`` and sends them to its children,
which forward them down. A node that sees a sequence gap holds later
events, fetches the missed ones from rank 0 (``event.replay``) and
forwards them in order, so its subtree sees no gap; events older than the
buffer are reported lost (``Notice("events-lost")``). A node that joins
(rather than re-attaches) takes the sequence of its new parent as it is: rank 0
may be another node, or a restarted one, with numbering of its own.

Bounds on what remote senders can grow (``FluxSettings``): children per
node, ranks in rank 0's directory (``max_size``), requests tracked in
flight per node (``max_inflight``; past it EAGAIN), events held or kept
(``recent_events``), ancestors kept (``max_ancestors``), replayed events per
answer (``replay_batch``); message size is bounded by the driver
(``max_message``). Local handles are bounded by ``max_pending`` RPCs.
"""

from __future__ import annotations

import base64
import binascii
import enum
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

from ..errors import ProtocolError
from ..wire.flux import (
    MATCHTAG_NONE, MAX_RANK, NODEID_ANY, NODEID_UPSTREAM, Control, ControlType, Errno, Event,
    Message,
    Request, Response, decode, encode, json_payload, read_json, service_of, string_payload,
)
from .directory import Directory, Refusal
from .errors import FluxStateError
from .topology import Topology

__all__ = ["FluxCore", "FluxSettings", "State", "Send", "Deliver", "Dial", "Hangup", "Notice",
           "Output", "PARENT", "SELF", "IDENTITY_SIZE", "BUILTIN_SERVICES"]

log = logging.getLogger(__name__)

#: the link to the parent (and route entry for "came from the parent")
PARENT = b"^"
#: route entry of the core's own requests (handle 0)
SELF = b"@0"
#: bytes of a node's identity (its DEALER's routing id); ROUTER peers with other
#: identities (libzmq's own are 5 bytes) are dropped, so no peer can pose as ``^`` or ``@n``
IDENTITY_SIZE = 16
#: services every node answers itself
BUILTIN_SERVICES = frozenset({"overlay", "event", "broker"})

# MsgFlag bits as plain ints: IntFlag's operators are Python-level calls
_NORESPONSE, _UPSTREAM, _STREAMING = 0x04, 0x10, 0x40


class State(enum.Enum):
    """Where a node is in joining its instance."""

    DETACHED = "detached"
    JOINING = "joining"
    ATTACHING = "attaching"
    ONLINE = "online"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class FluxSettings:
    """Timers (seconds) and the bounds of what remote senders can grow."""

    topology: Topology = Topology(32)
    heartbeat: float = 2.0       #: a link idle this long gets a heartbeat
    torpid: float = 10.0         #: a child silent this long is reported torpid
    lost: float = 30.0           #: a link silent this long is lost
    hello_timeout: float = 5.0   #: a join or hello unanswered this long is tried elsewhere
    max_children: int = 4096     #: children (and adopted orphans) one node accepts
    max_size: int = 1 << 17      #: ranks (and rank numbers) rank 0 gives and keeps
    max_inflight: int = 65536    #: requests one node tracks in flight through its links
    max_pending: int = 65536     #: RPCs in flight per local handle
    recent_events: int = 1024    #: events rank 0 keeps for replay; events a node holds
    replay_batch: int = 256      #: events per replay answer
    max_ancestors: int = 32      #: ancestors a node keeps for re-attaching

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat <= self.torpid <= self.lost:
            raise FluxStateError("Flux settings need 0 < heartbeat <= torpid <= lost, not "
                                 f"{self.heartbeat}, {self.torpid}, {self.lost}")
        for name in ("max_children", "max_size", "max_inflight", "max_pending",
                     "recent_events", "replay_batch", "max_ancestors"):
            if getattr(self, name) < 1:
                raise FluxStateError(f"Flux setting {name} must be at least 1")


# --- outputs ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``frames`` on ``link`` (``PARENT`` or a ROUTER identity: then ``frames[0]``)."""

    link: bytes
    frames: list[bytes]


@dataclass(frozen=True, slots=True)
class Deliver:
    """Hand ``message`` to local handle ``handle`` (a request, response or event)."""

    handle: int
    message: Message


@dataclass(frozen=True, slots=True)
class Dial:
    """Replace the DEALER to the parent: connect to ``endpoint`` as ``identity``."""

    endpoint: str
    identity: bytes


@dataclass(frozen=True, slots=True)
class Hangup:
    """Close the DEALER to the parent."""


@dataclass(frozen=True, slots=True)
class Notice:
    """Something worth telling: online, child-attached, child-lost, child-torpid,
    parent-lost, events-lost (``rank``: the rank concerned; ``detail``: more)."""

    what: str
    rank: int = -1
    detail: Any = None


Output = Union[Send, Deliver, Dial, Hangup, Notice]


# --- state --------------------------------------------------------------------


@dataclass(slots=True)
class Child:
    """A peer on this node's ROUTER that said hello."""

    identity: bytes
    rank: int
    endpoint: str
    uuid: str
    heard: float
    sent: float
    torpid: bool = False


@dataclass(slots=True)
class Pending:
    """An RPC of a local handle awaiting its (final) response."""

    topic: str
    nodeid: int
    streaming: bool


@dataclass(slots=True)
class Handle:
    """A local client of the node: pending RPCs, matchtags, subscriptions."""

    pending: dict[int, Pending] = field(default_factory=dict)
    free: list[int] = field(default_factory=list)
    next_tag: int = 1
    prefixes: set[str] = field(default_factory=set)

    def allocate(self) -> int:
        """A matchtag not in use: one freed by a final response first, else a new one."""
        while self.free:
            tag = self.free.pop()
            if tag not in self.pending:
                return tag
        tag = self.next_tag
        self.next_tag = tag + 1 if tag < 0xFFFFFFFF else 1
        while tag in self.pending:
            tag = self.next_tag
            self.next_tag = tag + 1 if tag < 0xFFFFFFFF else 1
        return tag

    def release(self, tag: int) -> None:
        if self.pending.pop(tag, None) is not None:
            self.free.append(tag)


InflightKey = tuple[bytes, tuple[bytes, ...], int]


def _rerouted(response: Response, routes: tuple[bytes, ...]) -> Response:
    """``response`` with another route stack."""
    return Response(response.topic, response.payload, response.errnum, response.matchtag,
                    response.flags, routes, response.userid, response.rolemask)


def _b64(data: Optional[bytes]) -> Optional[str]:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> Optional[bytes]:
    if text is None:
        return None
    if not isinstance(text, str):
        raise ProtocolError("payload is not base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("payload is not base64") from None


def _int(obj: dict, key: str, low: int = -1, high: int = MAX_RANK) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ProtocolError(f"{key!r} is not a whole number in {low}..{high}")
    return value


def _str(obj: dict, key: str, limit: int = 1024) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or len(value) > limit:
        raise ProtocolError(f"{key!r} is not a string of at most {limit} characters")
    return value


class FluxCore:
    """One node's routing, events and membership; see the module's docstring."""

    def __init__(self, identity: bytes, endpoint: str, *, settings: FluxSettings = FluxSettings(),
                 rank: Optional[int] = None, root: bool = False,
                 bootstrap: Sequence[str] = ()) -> None:
        if len(identity) != IDENTITY_SIZE:
            raise FluxStateError(f"a node's identity is {IDENTITY_SIZE} bytes")
        if root and rank not in (None, 0):
            raise FluxStateError("the root is rank 0")
        self.identity = identity
        self.uuid = identity.hex()
        self.endpoint = endpoint
        self.settings = settings
        self.topology = settings.topology
        self.root = root
        self.rank: Optional[int] = 0 if root else rank
        self.claim = self.rank  # the rank to ask for when joining
        self.bootstrap = list(bootstrap)
        self.state = State.DETACHED
        self.size = 1 if root else 0
        self.parent_rank: Optional[int] = None
        self.ancestors: list[tuple[int, str]] = []
        self.children: dict[bytes, Child] = {}
        self.by_rank: dict[int, bytes] = {}
        self.handles: dict[int, Handle] = {0: Handle()}
        self._next_handle = 1
        self.services: dict[str, int] = {}
        self.methods: dict[str, int] = {}
        self._inflight: dict[InflightKey, Pending] = {}
        self._via: dict[bytes, set[InflightKey]] = {}
        self._parent_heard = self._parent_sent = 0.0
        self._deadline = 0.0  # of the join or hello in progress
        self._attempt = 0     # bootstrap endpoint / ancestor tried next
        self._candidates: list[tuple[int, str]] = []
        self._internal: dict[int, Callable[[Response, float], list[Output]]] = {}
        self._taken: Optional[int] = None  # a rank found taken, for rank 0 to skip
        self._failed: list[int] = []  # candidate parents that did not answer a hello
        # events
        self.seq = 0
        self._synced = root  # whether ``seq`` follows rank 0 (set by the first hello answer)
        self.recent: deque[Event] = deque(maxlen=settings.recent_events)
        self._held: list[Event] = []
        self._replay_to = 0  # last seq of the gap being fetched (0: none)
        #: rank 0's directory of ranks
        self.directory = Directory(settings.topology, settings.max_size, endpoint, self.uuid)
        self._tick = settings.heartbeat
        self.next_deadline = 0.0
        self.stats = {"dropped": 0, "forwarded": 0, "replayed": 0}

    # --- life --------------------------------------------------------------

    def start(self, now: float) -> list[Output]:
        """Begin: the root is online at once, others join through the bootstrap endpoints."""
        self.next_deadline = now + self._tick
        if self.root:
            self.state = State.ONLINE
            return [Notice("online", 0, {"size": self.size})]
        return self._join(now) if self.bootstrap else []

    def set_bootstrap(self, endpoints: Sequence[str], now: float) -> list[Output]:
        """New bootstrap endpoints (e.g. the root's, from the mesh); joins if detached."""
        self.bootstrap = [e for e in endpoints if e != self.endpoint]
        if self.state is State.DETACHED and self.bootstrap:
            return self._join(now)
        return []

    def stop(self, now: float) -> list[Output]:
        """Leave: DISCONNECT to the parent and every child; local RPCs fail."""
        out: list[Output] = []
        bye = encode(Control(ControlType.DISCONNECT))
        if self.state in (State.ONLINE, State.ATTACHING, State.JOINING) and not self.root:
            out.append(Send(PARENT, bye))
        for identity in self.children:
            out.append(Send(identity, [identity, *bye]))
        for link in list(self._via):
            out += self._fail_via(link, "the node left")
        self.children.clear()
        self.by_rank.clear()
        self.state = State.STOPPED
        out.append(Hangup())
        return out

    @property
    def online(self) -> bool:
        return self.state is State.ONLINE

    # --- local handles -----------------------------------------------------

    def open_handle(self) -> int:
        """A new local handle's number."""
        number = self._next_handle
        self._next_handle += 1
        self.handles[number] = Handle()
        return number

    def close_handle(self, handle: int) -> None:
        """Forget a handle: its services, subscriptions and pending RPCs."""
        self.handles.pop(handle, None)
        for name in [s for s, h in self.services.items() if h == handle]:
            del self.services[name]
        for name in [m for m, h in self.methods.items() if h == handle]:
            del self.methods[name]

    def register(self, handle: int, topic: str) -> None:
        """Let ``handle`` serve ``topic`` (``service.method``); one handle per service."""
        service, dot, method = topic.partition(".")
        if not service or not dot or not method:
            raise FluxStateError(f"register a service.method topic, not {topic!r}")
        if service in BUILTIN_SERVICES:
            raise FluxStateError(f"service {service!r} is built in")
        owner = self.services.setdefault(service, handle)
        if owner != handle:
            raise FluxStateError(f"service {service!r} is served by another handle")
        self.methods[topic] = handle

    def unregister(self, handle: int, topic: str) -> None:
        """Stop serving ``topic``; the service goes with its last method."""
        if self.methods.get(topic) == handle:
            del self.methods[topic]
            service = service_of(topic)
            if not any(service_of(m) == service for m in self.methods):
                self.services.pop(service, None)

    def subscribe(self, handle: int, prefix: str) -> None:
        """Deliver events whose topic starts with ``prefix`` to ``handle``."""
        self.handles[handle].prefixes.add(prefix)

    def unsubscribe(self, handle: int, prefix: str) -> None:
        self.handles[handle].prefixes.discard(prefix)

    def rpc(self, handle: int, topic: str, payload: Optional[bytes], nodeid: int,
            flags: int, now: float) -> tuple[int, list[Output]]:
        """Send a request from ``handle``; its matchtag (0 with NORESPONSE) and outputs."""
        state = self.handles[handle]
        if nodeid == NODEID_UPSTREAM:
            if self.rank is None:
                raise FluxStateError("NODEID_UPSTREAM needs a rank: the node is not online")
            nodeid, flags = self.rank, flags | _UPSTREAM
        if flags & _NORESPONSE:
            tag = MATCHTAG_NONE
        else:
            if len(state.pending) >= self.settings.max_pending:
                raise FluxStateError(f"{len(state.pending)} RPCs already in flight on this "
                                     f"handle (max_pending)")
            tag = state.allocate()
            state.pending[tag] = Pending(topic, nodeid, bool(flags & _STREAMING))
        request = Request(topic, payload, nodeid, tag, flags, (b"@%d" % handle,))
        return tag, self._route_request(request, b"@%d" % handle, now)

    def respond(self, handle: int, request: Request, payload: Optional[bytes], errnum: int,
                now: float, streaming: bool = False) -> list[Output]:
        """Answer ``request`` (delivered to ``handle``); nothing with NORESPONSE."""
        if request.flags & _NORESPONSE:
            return []
        flags = _STREAMING if request.flags & _STREAMING else 0
        response = Response(request.topic, payload, errnum, request.matchtag, flags,
                            request.routes)
        return self._route_response(response, now)

    def cancel(self, handle: int, matchtag: int, now: float) -> list[Output]:
        """Ask the server of a streaming RPC to end it: ``<service>.cancel`` with
        ``{"matchtag"}`` (no response) to the same rank; the stream still ends
        with its final response."""
        pending = self.handles[handle].pending.get(matchtag)
        if pending is None or not pending.streaming:
            return []
        topic = service_of(pending.topic) + ".cancel"
        _, out = self.rpc(handle, topic, json_payload({"matchtag": matchtag}), pending.nodeid,
                          _NORESPONSE, now)
        return out

    def abandon(self, handle: int, matchtag: int) -> None:
        """Forget a pending RPC whose response is no longer wanted (its matchtag is
        only reused after that; a late response is dropped)."""
        state = self.handles.get(handle)
        if state is not None and matchtag in state.pending:
            state.pending[matchtag].topic = ""  # marks it abandoned; released on final response

    def publish(self, handle: int, topic: str, payload: Optional[bytes],
                now: float) -> tuple[int, list[Output]]:
        """Publish an event (through rank 0); the matchtag answers with its sequence."""
        body = json_payload({"topic": topic, "payload": _b64(payload)})
        return self.rpc(handle, "event.pub", body, 0, 0, now)

    # --- input -------------------------------------------------------------

    def receive(self, link: bytes, frames: list[bytes], now: float) -> list[Output]:
        """A message arrived on ``link`` (``PARENT``, or a ROUTER identity, frames without it)."""
        if self.state is State.STOPPED:
            return []
        if len(link) != IDENTITY_SIZE and link != PARENT:
            return self._drop(link, "an identity that is not 16 bytes")
        try:
            message = decode(frames)
        except ProtocolError as exc:
            return self._drop(link, f"malformed: {exc.reason}")
        child = None
        if link == PARENT:
            self._parent_heard = now
        else:
            child = self.children.get(link)
            if child is not None:
                child.heard = now
                if child.torpid:
                    child.torpid = False
        kind = type(message)
        if kind is Request:
            assert isinstance(message, Request)
            if child is None and link != PARENT and message.topic not in (
                    "overlay.join", "overlay.hello"):
                return self._drop(link, "a request from a stranger")
            routes = (link,) + (message.routes or ())
            request = Request(message.topic, message.payload, message.nodeid, message.matchtag,
                              message.flags, routes, message.userid, message.rolemask)
            # the frames as they are, the route pushed: forwarded without encoding again
            wire = [link, *frames] if message.routes is not None else None
            return self._route_request(request, link, now, wire)
        if kind is Response:
            assert isinstance(message, Response)
            if child is None and link != PARENT:
                return self._drop(link, "a response from a stranger")
            if not message.routes:
                return self._drop(link, "a response without routes")
            self._settle(link, message)
            return self._route_response(message, now, frames)
        if kind is Event:
            assert isinstance(message, Event)
            if link != PARENT or self.state is not State.ONLINE:
                return self._drop(link, "an event not from the parent")
            return self._event(message, frames, now)
        assert isinstance(message, Control)
        if message.ctype == ControlType.DISCONNECT:
            if link == PARENT and self.state is State.ONLINE:
                return self._parent_lost(now, "the parent left")
            if child is not None:
                return self._child_lost(child, now, "the child left")
        return []

    def link_down(self, link: bytes, now: float) -> list[Output]:
        """A send found ``link`` gone (its peer's connection closed)."""
        if link == PARENT:
            return self._parent_lost(now, "the link is down") if self.online else []
        child = self.children.get(link)
        return self._child_lost(child, now, "the link is down") if child else []

    def timer(self, now: float) -> list[Output]:
        """Heartbeats, torpid and lost links, timed-out joins; call at ``next_deadline``."""
        out: list[Output] = []
        s = self.settings
        self.next_deadline = now + self._tick
        if self.state is State.STOPPED:
            return out
        if self.state is State.ONLINE and not self.root:
            if now - self._parent_heard >= s.lost:
                out += self._parent_lost(now, f"silent for {s.lost:g} s")
            elif now - self._parent_sent >= s.heartbeat:
                out.append(self._to_parent(encode(Control(ControlType.HEARTBEAT)), now))
        elif self.state in (State.JOINING, State.ATTACHING) and now >= self._deadline:
            out += self._retry(now)
        heartbeat: Optional[list[bytes]] = None
        for child in list(self.children.values()):
            silent = now - child.heard
            if silent >= s.lost:
                out += self._child_lost(child, now, f"silent for {s.lost:g} s")
                continue
            if silent >= s.torpid and not child.torpid:
                child.torpid = True
                out.append(Notice("child-torpid", child.rank, silent))
            if now - child.sent >= s.heartbeat:
                if heartbeat is None:
                    heartbeat = encode(Control(ControlType.HEARTBEAT))
                child.sent = now
                out.append(Send(child.identity, [child.identity, *heartbeat]))
        return out

    # --- routing -------------------------------------------------------------

    def _route_request(self, request: Request, came_from: bytes, now: float,
                       wire: Optional[list[bytes]] = None) -> list[Output]:
        """Deliver, answer or forward ``request`` (``wire``: its frames, if at hand)."""
        nodeid = request.nodeid
        me = self.rank
        topic = request.topic
        service = service_of(topic)
        upstream = request.flags & _UPSTREAM
        if nodeid == NODEID_ANY or upstream:
            if not (upstream and nodeid == me):  # UPSTREAM: never on the sending rank
                owner = self.services.get(service)
                if owner is not None and came_from != b"@%d" % owner:
                    return self._deliver_request(owner, request, now)
                if service in BUILTIN_SERVICES and self._answers_here(topic):
                    return self._builtin(request, now)
            if self.parent_rank is not None and self.state is State.ONLINE:
                return self._forward(PARENT, request, now, wire)
            if self.root:
                return self._error(request, Errno.ENOSYS,
                                   f"No service matching {topic} is registered", now)
            return self._error(request, Errno.EHOSTUNREACH, "not attached to the tree", now)
        if nodeid == me and self.state is State.ONLINE or (
                topic in ("overlay.hello", "overlay.join") and nodeid == me):
            owner = self.services.get(service)
            if owner is not None:
                return self._deliver_request(owner, request, now)
            if service in BUILTIN_SERVICES:
                return self._builtin(request, now)
            return self._error(request, Errno.ENOSYS,
                               f"No service matching {topic} is registered", now)
        if nodeid > MAX_RANK or self.root and nodeid >= self.size:
            return self._error(request, Errno.EHOSTUNREACH, f"no rank {nodeid}", now)
        child = self._child_toward(nodeid)
        if child is not None:
            return self._forward(child, request, now, wire)
        if self.parent_rank is not None and self.state is State.ONLINE \
                and came_from != PARENT:  # never back up: no request bounces
            return self._forward(PARENT, request, now, wire)
        return self._error(request, Errno.EHOSTUNREACH, f"rank {nodeid} is unreachable", now)

    def _answers_here(self, topic: str) -> bool:
        """Built-ins that any node answers for NODEID_ANY (the rest belong to rank 0)."""
        return topic in ("broker.ping", "overlay.info") or self.root

    def _child_toward(self, rank: int) -> Optional[bytes]:
        """The child whose subtree holds ``rank`` (walking up from it), if any."""
        by_rank = self.by_rank
        if not by_rank:
            return None
        me = self.rank
        k = self.topology.k
        while rank > 0 and rank != me:
            identity = by_rank.get(rank)
            if identity is not None:
                return identity
            rank = 0 if k == 0 else (rank - 1) // k
        return None

    def _forward(self, link: bytes, request: Request, now: float,
                 wire: Optional[list[bytes]] = None) -> list[Output]:
        """Send ``request`` (routes already pushed; ``wire``: its frames) on ``link``,
        tracking it until answered."""
        if not request.flags & _NORESPONSE:
            if len(self._inflight) >= self.settings.max_inflight:
                return self._error(request, Errno.EAGAIN, "too many requests in flight", now)
            key = (link, request.routes or (), request.matchtag)
            self._inflight[key] = Pending(request.topic, request.nodeid,
                                          bool(request.flags & _STREAMING))
            self._via.setdefault(link, set()).add(key)
        self.stats["forwarded"] += 1
        frames = wire if wire is not None else encode(request)
        if link == PARENT:
            return [self._to_parent(frames, now)]
        child = self.children.get(link)
        if child is not None:
            child.sent = now
        return [Send(link, [link, *frames])]

    def _settle(self, link: bytes, response: Response) -> None:
        """A response came back on ``link``: forget its request once it is final."""
        if response.flags & _STREAMING and not response.errnum:
            return
        key = (link, response.routes or (), response.matchtag)
        if self._inflight.pop(key, None) is not None:
            via = self._via.get(link)
            if via is not None:
                via.discard(key)
                if not via:
                    del self._via[link]

    def _route_response(self, response: Response, now: float,
                        wire: Optional[list[bytes]] = None) -> list[Output]:
        """Pop the top route and send ``response`` that way (``wire``: its frames)."""
        routes = response.routes or ()
        if not routes:
            return self._drop(b"", "a response with no route left")
        top = routes[0]
        if top == PARENT:
            if self.parent_rank is None:
                return self._drop(top, "a response for a parent this node has not")
            return [self._to_parent(wire[1:] if wire is not None else
                                    encode(_rerouted(response, routes[1:])), now)]
        if len(top) != IDENTITY_SIZE:  # "@n": a local handle
            if top[:1] != b"@" or not top[1:].isdigit():
                return self._drop(top, "a response to no handle")
            return self._to_handle(int(top[1:]), _rerouted(response, routes[1:]), now)
        child = self.children.get(top)
        if child is not None:
            child.sent = now
        # the ROUTER takes the top route as the address
        return [Send(top, wire if wire is not None else encode(response))]

    def _to_handle(self, number: int, response: Response, now: float) -> list[Output]:
        state = self.handles.get(number)
        if state is None:
            return []
        pending = state.pending.get(response.matchtag)
        if pending is None:
            return self._drop(b"@%d" % number, f"a response to no RPC ({response.matchtag})")
        final = not pending.streaming or response.errnum != 0
        if final:
            state.release(response.matchtag)
        if number == 0:
            callback = self._internal.pop(response.matchtag, None) if final else \
                self._internal.get(response.matchtag)
            return callback(response, now) if callback is not None else []
        if not pending.topic:  # abandoned
            return []
        return [Deliver(number, response)]

    def _deliver_request(self, handle: int, request: Request, now: float) -> list[Output]:
        topic = request.topic
        if topic in self.methods or topic == service_of(topic) + ".cancel":
            return [Deliver(handle, request)]
        return self._error(request, Errno.ENOSYS, f"No method {topic} is registered", now)

    def _error(self, request: Request, errnum: int, text: str, now: float) -> list[Output]:
        if request.flags & _NORESPONSE:
            return []
        flags = _STREAMING if request.flags & _STREAMING else 0
        return self._route_response(Response(request.topic, string_payload(text), errnum,
                                             request.matchtag, flags, request.routes), now)

    def _answer(self, request: Request, obj: dict, now: float) -> list[Output]:
        if request.flags & _NORESPONSE:
            return []
        return self._route_response(Response(request.topic, json_payload(obj), 0,
                                             request.matchtag, 0, request.routes), now)

    def _to_parent(self, frames: list[bytes], now: float) -> Send:
        self._parent_sent = now
        return Send(PARENT, frames)

    def _drop(self, link: bytes, why: str) -> list[Output]:
        self.stats["dropped"] += 1
        if self.stats["dropped"] <= 100 or self.stats["dropped"] % 1000 == 0:
            log.debug("flux rank %s dropped a message from %r: %s", self.rank, link[:16], why)
        return []

    def _internal_rpc(self, topic: str, obj: dict, nodeid: int, now: float,
                      callback: Optional[Callable[[Response, float], list[Output]]],
                      streaming: bool = False) -> list[Output]:
        flags = _NORESPONSE if callback is None else 0
        tag, out = self.rpc(0, topic, json_payload(obj), nodeid, flags, now)
        if callback is not None and tag in self.handles[0].pending:
            self._internal[tag] = callback
        return out

    # --- built-in services ---------------------------------------------------

    def _builtin(self, request: Request, now: float) -> list[Output]:
        topic = request.topic
        handler = _BUILTINS.get(topic)
        if handler is None:
            return self._error(request, Errno.ENOSYS, f"No method {topic} is registered", now)
        try:
            return handler(self, request, now)
        except ProtocolError as exc:
            return self._error(request, Errno.EPROTO, exc.reason, now)

    def _ping(self, request: Request, now: float) -> list[Output]:
        if request.flags & _NORESPONSE:
            return []
        return self._route_response(Response(request.topic, request.payload, 0,
                                             request.matchtag, 0, request.routes), now)

    def _info(self, request: Request, now: float) -> list[Output]:
        return self._answer(request, self.info(), now)

    def info(self) -> dict[str, Any]:
        """This node's place in the tree."""
        return {"rank": self.rank, "size": self.size, "parent": self.parent_rank,
                "state": self.state.value, "seq": self.seq,
                "children": sorted(c.rank for c in self.children.values()),
                "torpid": sorted(c.rank for c in self.children.values() if c.torpid),
                "topology": str(self.topology)}

    def _join_request(self, request: Request, now: float) -> list[Output]:
        """Rank 0 gives a rank (claimed or new) and names the parent to attach to."""
        if not self.root:
            return self._error(request, Errno.EHOSTUNREACH, "only rank 0 gives ranks", now)
        body = read_json(request.payload)
        claim = _int(body, "rank", -1, self.settings.max_size - 1)
        uuid = _str(body, "uuid", 64)
        endpoint = _str(body, "endpoint")
        failed = body.get("failed")
        if isinstance(failed, list):
            for rank in failed[:self.settings.max_ancestors]:
                if isinstance(rank, int) and not isinstance(rank, bool):
                    self.directory.lost(rank)
        taken = body.get("taken")
        if isinstance(taken, int) and not isinstance(taken, bool):
            self.directory.taken(taken)
        given = self.directory.give(claim, uuid, endpoint)
        if isinstance(given, Refusal):
            return self._error(request, given.errnum, given.text, now)
        rank, parent, parent_endpoint = given
        self.size = self.directory.size
        return self._answer(request, {"rank": rank, "parent": parent, "size": self.size,
                                      "endpoint": parent_endpoint}, now)

    def _hello_request(self, request: Request, now: float) -> list[Output]:
        """A node asks to attach as this node's child."""
        link = request.routes[0] if request.routes else b""
        if len(link) != IDENTITY_SIZE:
            return self._error(request, Errno.EINVAL, "hello comes from a child's link", now)
        if self.state not in (State.ONLINE, State.ATTACHING) or self.rank is None:
            return self._error(request, Errno.EAGAIN, "not in the tree", now)
        body = read_json(request.payload)
        rank = _int(body, "rank", 1, self.settings.max_size - 1)
        uuid = _str(body, "uuid", 64)
        endpoint = _str(body, "endpoint")
        if not self.topology.is_descendant(rank, self.rank):
            return self._error(request, Errno.EINVAL,
                               f"rank {rank} is not below rank {self.rank}", now)
        old_identity = self.by_rank.get(rank)
        if old_identity is not None and old_identity != link:
            old = self.children[old_identity]
            if old.uuid != uuid and now - old.heard < self.settings.torpid:
                return self._error(request, Errno.EEXIST, f"rank {rank} is attached", now)
            out = self._child_lost(old, now, "replaced by a new hello")
        else:
            out = []
        if link not in self.children and len(self.children) >= self.settings.max_children:
            return out + self._error(request, Errno.ENOSPC, "no room for children", now)
        self.children[link] = Child(link, rank, endpoint, uuid, now, now)
        self.by_rank[rank] = link
        self.size = max(self.size, rank + 1)
        out.append(Notice("child-attached", rank, endpoint))
        chain = [[self.rank, self.endpoint]] + [[r, e] for r, e in self.ancestors]
        out += self._answer(request, {"ancestors": chain[:self.settings.max_ancestors],
                                      "seq": self.seq, "size": self.size}, now)
        out += self._report_attached(self.children[link], now)
        return out

    def _report_attached(self, child: Child, now: float) -> list[Output]:
        """Tell rank 0 where ``child`` listens (once this node is online itself)."""
        note = {"rank": child.rank, "uuid": child.uuid, "endpoint": child.endpoint}
        if self.root:
            self._attached(note)
            return []
        if self.state is not State.ONLINE:
            return []  # reported when this node comes online
        return self._internal_rpc("overlay.attached", note, 0, now, None)

    def _attached_request(self, request: Request, now: float) -> list[Output]:
        if self.root:
            body = read_json(request.payload)
            self._attached({"rank": _int(body, "rank", 1, self.settings.max_size - 1),
                            "uuid": _str(body, "uuid", 64),
                            "endpoint": _str(body, "endpoint")})
        return []

    def _attached(self, body: dict) -> None:
        self.directory.attached(body["rank"], body["uuid"], body["endpoint"])
        self.size = self.directory.size

    def _lost_request(self, request: Request, now: float) -> list[Output]:
        if self.root:
            body = read_json(request.payload)
            self.directory.lost(_int(body, "rank", 1), _str(body, "uuid", 64))
        return []

    def _pub_request(self, request: Request, now: float) -> list[Output]:
        if not self.root:
            return self._error(request, Errno.EHOSTUNREACH, "only rank 0 publishes", now)
        body = read_json(request.payload)
        topic = _str(body, "topic")
        if not topic:
            raise ProtocolError("'topic' is empty")
        seq, out = self._publish_here(topic, _unb64(body.get("payload")), now)
        return out + self._answer(request, {"seq": seq}, now)

    def _publish_here(self, topic: str, payload: Optional[bytes],
                      now: float) -> tuple[int, list[Output]]:
        self.seq += 1
        event = Event(topic, payload, self.seq)
        self.recent.append(event)
        return self.seq, self._pass_down(event, encode(event))

    def _replay_request(self, request: Request, now: float) -> list[Output]:
        if not self.root:
            return self._error(request, Errno.EHOSTUNREACH, "only rank 0 replays", now)
        body = read_json(request.payload)
        first = _int(body, "from", 1, 0xFFFFFFFF)
        last = min(_int(body, "to", 1, 0xFFFFFFFF), first + self.settings.replay_batch - 1)
        events = [[e.seq, e.topic, _b64(e.payload)] for e in self.recent
                  if first <= e.seq <= last]
        return self._answer(request, {"events": events, "to": last}, now)

    # --- events ------------------------------------------------------------

    def _event(self, event: Event, frames: list[bytes], now: float) -> list[Output]:
        seq = event.seq
        if seq <= self.seq:
            return []  # a duplicate
        if self._replay_to:
            if len(self._held) >= self.settings.recent_events:
                return [Notice("events-lost", self.rank or 0, (seq, seq))]
            self._held.append(event)
            return []
        if seq == self.seq + 1 or not self._synced:
            return self._pass_down(event, frames if event.routes is None else
                                   encode(Event(event.topic, event.payload, event.seq,
                                                event.flags)))
        self._held.append(event)
        return self._fetch(self.seq + 1, seq - 1, now)

    def _pass_down(self, event: Event, frames: list[bytes]) -> list[Output]:
        """Take ``event`` as the next one: hand it to subscribers and children."""
        self.seq = event.seq
        out: list[Output] = []
        topic = event.topic
        for number, handle in self.handles.items():
            for prefix in handle.prefixes:
                if topic.startswith(prefix):
                    out.append(Deliver(number, event))
                    break
        for identity, child in self.children.items():
            out.append(Send(identity, [identity, *frames]))
        return out

    def _fetch(self, first: int, last: int, now: float) -> list[Output]:
        self._replay_to = last
        return self._internal_rpc("event.replay", {"from": first, "to": last}, 0, now,
                                  self._replayed)

    def _replayed(self, response: Response, now: float) -> list[Output]:
        out: list[Output] = []
        wanted_to = self._replay_to
        if response.errnum == Errno.EHOSTUNREACH:  # the parent went: ask again once attached
            self._replay_to = 0
            return out
        events: list = []
        if response.errnum == 0:
            try:
                body = read_json(response.payload)
                events = body.get("events") or []
                answered_to = _int(body, "to", 1, 0xFFFFFFFF)
            except ProtocolError:
                answered_to = wanted_to
        else:
            answered_to = wanted_to
        for item in events if isinstance(events, list) else []:
            try:
                seq, topic, payload = item
                event = Event(str(topic), _unb64(payload), int(seq))
            except (ValueError, TypeError, ProtocolError):
                continue
            if event.seq <= self.seq:
                continue
            if event.seq > self.seq + 1:
                out.append(Notice("events-lost", self.rank or 0, (self.seq + 1, event.seq - 1)))
            self.stats["replayed"] += 1
            out += self._pass_down(event, encode(event))
        if answered_to < wanted_to and response.errnum == 0:
            return out + self._fetch(answered_to + 1, wanted_to, now)
        if self.seq < wanted_to:
            out.append(Notice("events-lost", self.rank or 0, (self.seq + 1, wanted_to)))
            self.seq = wanted_to
        self._replay_to = 0
        held, self._held = self._held, []
        for event in held:
            out += self._event(event, encode(event), now)
        return out

    # --- membership ------------------------------------------------------------

    def _join(self, now: float) -> list[Output]:
        """Ask rank 0 for a rank through the next bootstrap endpoint."""
        if not self.bootstrap:
            self.state = State.DETACHED
            return [Hangup()]
        endpoint = self.bootstrap[self._attempt % len(self.bootstrap)]
        self._attempt += 1
        self.state = State.JOINING
        self.parent_rank = None
        self._deadline = now + self.settings.hello_timeout
        self._forget_internal()
        body: dict[str, Any] = {"rank": -1 if self.claim is None else self.claim,
                                "uuid": self.uuid, "endpoint": self.endpoint}
        if self._taken is not None:
            body["taken"] = self._taken
        if self._failed:
            body["failed"] = self._failed[-self.settings.max_ancestors:]
            self._failed = []
        # a guest identity of its own: the parent's ROUTER (with ROUTER_HANDOVER) never sees
        # this node's identity move from one connection to another
        guest = bytes([self.identity[0] ^ 0xFF]) + self.identity[1:]
        out: list[Output] = [Dial(endpoint, guest)]
        self._parent_heard = self._parent_sent = now
        out += self._guest_rpc("overlay.join", body, 0, now, self._joined)
        return out

    def _guest_rpc(self, topic: str, body: dict, nodeid: int, now: float,
                   callback: Callable[[Response, float], list[Output]]) -> list[Output]:
        """A request from the core straight to the DEALER (not routed: not attached yet)."""
        state = self.handles[0]
        tag = state.allocate()
        state.pending[tag] = Pending(topic, nodeid, False)
        self._internal[tag] = callback
        request = Request(topic, json_payload(body), nodeid, tag, 0, (SELF,))
        return [self._to_parent(encode(request), now)]

    def _forget_internal(self) -> None:
        """Drop the core's own join and hello requests still unanswered."""
        state = self.handles[0]
        for tag in [t for t, p in state.pending.items()
                    if p.topic in ("overlay.join", "overlay.hello")]:
            state.release(tag)
            self._internal.pop(tag, None)

    def _joined(self, response: Response, now: float) -> list[Output]:
        if self.state is not State.JOINING:
            return []
        if response.errnum:
            if response.errnum == Errno.EEXIST and self.claim is not None:
                out: list[Output] = [Notice("rank-taken", self.claim)]
                self.claim = None
                return out + self._join(now)
            self._deadline = min(self._deadline, now)  # try the next endpoint at the next tick
            return [Notice("join-failed", -1, response.errnum)]
        try:
            body = read_json(response.payload)
            rank, parent = _int(body, "rank", 1), _int(body, "parent", 0)
            endpoint = _str(body, "endpoint")
            size = _int(body, "size", 1, MAX_RANK + 1)
        except ProtocolError as exc:
            return self._drop(PARENT, f"join answer: {exc.reason}")
        self.rank = rank
        self.size = max(self.size, size)
        self._taken = None
        # rank 0 may be another node (or restarted) with numbering of its own: the hello
        # answer gives the sequence to follow from
        self._synced, self._held, self._replay_to = False, [], 0
        self._candidates = [(parent, endpoint)]
        self._attempt = 0
        return self._attach(now)

    def _attach(self, now: float) -> list[Output]:
        """Say hello to the next candidate parent; join again when none is left."""
        if self._attempt >= len(self._candidates):
            self.claim = self.rank
            self._attempt = 0
            return self._join(now)
        parent, endpoint = self._candidates[self._attempt]
        self._attempt += 1
        self.state = State.ATTACHING
        self.parent_rank = None
        self._deadline = now + self.settings.hello_timeout
        self._forget_internal()
        self._parent_heard = self._parent_sent = now
        out: list[Output] = [Dial(endpoint, self.identity)]
        out += self._guest_rpc("overlay.hello", {"rank": self.rank, "uuid": self.uuid,
                                                 "endpoint": self.endpoint},
                               parent, now, self._helloed)
        return out

    def _helloed(self, response: Response, now: float) -> list[Output]:
        if self.state is not State.ATTACHING:
            return []
        if response.errnum:
            if response.errnum == Errno.EEXIST:
                self._taken, self.claim = self.rank, None
                self._attempt = 0
                return [Notice("rank-taken", self.rank or -1)] + self._join(now)
            self._deadline = min(self._deadline, now)  # the next candidate at the next tick
            return [Notice("hello-failed", self.rank or -1, response.errnum)]
        try:
            body = read_json(response.payload)
            chain = body.get("ancestors")
            ancestors = [(_int({"r": r}, "r", 0), _str({"e": e}, "e")) for r, e in chain or ()]
            seq = _int(body, "seq", 0, 0xFFFFFFFF)
            size = _int(body, "size", 1, MAX_RANK + 1)
        except (ProtocolError, TypeError, ValueError):
            return self._attach(now)
        if not ancestors:
            return self._attach(now)
        self.ancestors = ancestors[:self.settings.max_ancestors]
        self.parent_rank = ancestors[0][0]
        self.size = max(self.size, size)
        self.state = State.ONLINE
        self.claim = self.rank
        out: list[Output] = [Notice("online", self.rank or 0,
                                    {"parent": self.parent_rank, "size": self.size})]
        self._failed = []
        for child in list(self.children.values()):
            out += self._report_attached(child, now)
        if not self._synced:
            self._synced = True
            self.seq = max(self.seq, seq)  # events before joining are not missed
        elif not self._replay_to:
            upto = max(seq, self._held[0].seq - 1 if self._held else 0)
            if upto > self.seq:
                out += self._fetch(self.seq + 1, upto, now)
            else:
                held, self._held = self._held, []
                for event in held:
                    out += self._event(event, encode(event), now)
        return out

    def _retry(self, now: float) -> list[Output]:
        if self.state is State.JOINING:
            return self._join(now)
        if 0 < self._attempt <= len(self._candidates):
            self._failed.append(self._candidates[self._attempt - 1][0])
        return self._attach(now)

    def _parent_lost(self, now: float, why: str) -> list[Output]:
        out: list[Output] = [Notice("parent-lost", self.parent_rank or 0, why)]
        out += self._fail_via(PARENT, f"the parent was lost ({why})")
        self._candidates = self.ancestors[1:]
        self._attempt = 0
        self.parent_rank = None
        return out + self._attach(now)

    def _child_lost(self, child: Child, now: float, why: str) -> list[Output]:
        self.children.pop(child.identity, None)
        if self.by_rank.get(child.rank) == child.identity:
            del self.by_rank[child.rank]
        out: list[Output] = [Notice("child-lost", child.rank, why)]
        out += self._fail_via(child.identity, f"rank {child.rank} was lost ({why})")
        if self.root:
            self.directory.lost(child.rank, child.uuid)
        elif self.state is State.ONLINE:
            out += self._internal_rpc("overlay.lost", {"rank": child.rank, "uuid": child.uuid},
                                      0, now, None)
        return out

    def _fail_via(self, link: bytes, why: str) -> list[Output]:
        """Answer EHOSTUNREACH to every request forwarded on ``link``."""
        out: list[Output] = []
        keys = self._via.pop(link, ())
        text = string_payload(why)
        for key in keys:
            pending = self._inflight.pop(key, None)
            if pending is None:
                continue
            _, routes, matchtag = key
            flags = _STREAMING if pending.streaming else 0
            out += self._route_response(Response(pending.topic, text, Errno.EHOSTUNREACH,
                                                 matchtag, flags, routes), 0.0)
        return out


_BUILTINS: dict[str, Callable[[FluxCore, Request, float], list[Output]]] = {
    "broker.ping": FluxCore._ping,
    "overlay.info": FluxCore._info,
    "overlay.join": FluxCore._join_request,
    "overlay.hello": FluxCore._hello_request,
    "overlay.attached": FluxCore._attached_request,
    "overlay.lost": FluxCore._lost_request,
    "event.pub": FluxCore._pub_request,
    "event.replay": FluxCore._replay_request,
}

