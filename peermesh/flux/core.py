"""One node of a Flux instance as a sans-io state machine: routing, events, the tree.

How it works
------------
``FluxCore`` owns no socket and reads no clock: a core of ``peermesh.core``'s
contract. The driver feeds it what arrives, ``receive(link, frames, now)``,
the calls of local handles (``rpc``, ``respond``, ``publish``, ...),
``link_down(link, now)`` when a send found a link gone, and
``handle_timer(now)`` at ``next_deadline()``; every call returns a list of
``peermesh.core`` outputs: ``Send(link, frames)``, ``Deliver((handle,
message))``, ``Dial(PARENT, endpoint, identity)`` (replace the link to the
parent), ``Hangup(PARENT)`` and ``Emit(Notice(what, rank, detail))``.

Links. ``PARENT`` is the one DEALER this node connects (to its parent, or
while joining to a bootstrap endpoint); every other link is the identity
of a peer on this node's ROUTER (children, and guests that are joining).
Frames sent to a child start with its identity (the ROUTER's address).

The node's work is split by job into parts, one module each, that
``FluxCore`` holds (it inherits from none of them):

* ``routing``: ``Routing``, held as ``routing``: requests and responses;
  its own state is what is in flight, the core's own RPCs and when the
  parent was last heard and sent to;
* ``events``: ``EventLog``, held as ``log``: numbering, fan-out, replay;
  its own state is the sequence followed and the events kept or held;
* ``membership``: ``Membership``, held as ``membership``: joining,
  attaching, losses; its own state is the candidates tried and the deadline
  and backoff of the join or hello in progress (rank 0's ``directory``
  of ranks is the node's).

Each part reaches the node through a narrow protocol the node implements
(``RoutingHost``, ``EventHost``, ``MembershipHost``), and membership asks
and answers through ``routing``'s public methods. ``matchtags`` holds a
local handle's RPCs, ``outputs`` the outputs, ``settings`` the settings and
states. This module holds the node's shared state (its place in the tree,
its handles, children and clients, its counters), its life (start, stop),
the calls of local handles, the entry points (``receive``, ``link_down``,
``handle_timer``) and the built-in services.

Bounds on what remote senders can grow (``FluxSettings``): children per
node, ranks in rank 0's directory (``max_size``), requests tracked in
flight per node (``max_inflight``; past it EAGAIN), events held or kept
(``recent_events``), ancestors kept (``max_ancestors``), replayed events per
answer (``replay_batch``), rankless clients (``max_clients``), their
subscriptions (``client_prefixes``) and the services told when they go
(``client_services``; see ``peermesh.flux.clients``); message
size is bounded by the driver (``max_message``). Local handles are bounded
by ``max_pending`` RPCs.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Optional, Sequence

from .. import __version__
from ..errors import ProtocolError
from ..wire.flux import (
    FLAG_NORESPONSE as _NORESPONSE, FLAG_UPSTREAM as _UPSTREAM, FRAME_BITS as _FRAMES, MAGIC,
    USERID_UNKNOWN, VERSION, Control, ControlType, Errno, EventMessage, Request, Response, decode,
    encode, json_payload, make_request, make_response, pack_proto, read_json, service_of,
    string_payload,
)
from .bodies import ping_answer, publish_body, str_field
from .clients import ClientTable
from .directory import Directory
from .events import EventLog
from .errors import FluxStateError
from .children import Child
from .matchtags import Handle, Pending
from .membership import Membership
from .outputs import (
    IDENTITY_SIZE, MAX_OFFLINE, PARENT, SELF, Deliver, Dial, Emit, Hangup, Notice, Output, Send,
)
from .routing import BUILTIN_SERVICES, Routing
from .settings import FluxSettings, State

__all__ = ["FluxCore", "FluxSettings", "State", "Send", "Deliver", "Emit", "Dial", "Hangup", "Notice",
           "Output", "PARENT", "SELF", "IDENTITY_SIZE", "BUILTIN_SERVICES"]


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
        #: rank -> the child whose ``peermesh.attached`` report of it came up this way: where
        #: a rank attached out of its formula place really is (at most one per rank)
        self.placed: dict[int, bytes] = {}
        self.clients = ClientTable(settings.max_clients, settings.client_prefixes,
                                   settings.client_services)
        self.handles: dict[int, Handle] = {0: Handle()}
        self._next_handle = 1
        self.services: dict[str, int] = {}
        self.methods: dict[str, int] = {}
        # events
        #: the events part: numbering, fan-out, replay (its own state)
        self.log: EventLog = EventLog(self, settings.recent_events, synced=root)
        #: rank 0's directory of ranks
        self.directory = Directory(settings.topology, settings.max_size, endpoint, self.uuid,
                                   settings.max_joining, settings.joins_per_link)
        #: the routing part: requests and responses, what is in flight (its own state)
        self.routing: Routing = Routing(self)
        #: the membership part: joining, attaching, losses (its own state)
        self.membership: Membership = Membership(self, self.routing)
        self._tick = settings.heartbeat
        self._next = 0.0  # when handle_timer is next due (``next_deadline``)
        self.stats = {"dropped": 0, "forwarded": 0, "replayed": 0}
        #: RPCs of this node: requests its handles sent and were delivered, responses
        #: its handles sent and got, error responses made here (``flux_rpcs_total``)
        self.rpcs = {"sent": 0, "received": 0, "answered": 0, "errors": 0, "responses": 0}
        #: events its handles published, numbered here (rank 0), delivered to its
        #: handles, sent on to children and clients (``flux_events_total``)
        self.events = {"published": 0, "sequenced": 0, "delivered": 0, "forwarded": 0}

    def start(self, now: float) -> list[Output]:
        """Begin: the root is online at once, others join through the bootstrap endpoints."""
        self._next = now + self._tick
        if self.root:
            self.state = State.ONLINE
            return [Emit(Notice("online", 0, {"size": self.size, "topology": str(self.topology)}))]
        return self.membership.join(now) if self.bootstrap else []

    def set_bootstrap(self, endpoints: Sequence[str], now: float) -> list[Output]:
        """New bootstrap endpoints (e.g. the root's, from the mesh); joins if detached."""
        self.bootstrap = [e for e in endpoints if e != self.endpoint]
        if self.state is State.DETACHED and self.bootstrap:
            return self.membership.join(now)
        return []

    def stop(self, now: float) -> list[Output]:
        """Leave: DISCONNECT to the parent and every child; local RPCs fail."""
        out: list[Output] = []
        bye = encode(Control(ControlType.DISCONNECT))
        clients = list(self.clients.clients)
        for identity in clients:  # the services its clients used hear of it first
            out += self._client_gone(identity, now)
        if self.state in (State.ONLINE, State.ATTACHING, State.JOINING) and not self.root:
            out.append(Send(PARENT, bye))
        for identity in [*self.children, *clients]:
            out.append(Send(identity, [identity, *bye]))
        for link in dict.fromkeys(key[0] for key in self.routing.inflight):
            out += self.routing.fail_via(link, "the node left")
        self.children.clear()
        self.by_rank.clear()
        self.placed.clear()
        self.state = State.STOPPED
        out.append(Hangup(PARENT))
        return out

    @property
    def seq(self) -> int:
        """The last event number this node took (``EventLog.seq``)."""
        return self.log.seq

    @seq.setter
    def seq(self, seq: int) -> None:
        self.log.seq = seq

    @property
    def recent(self) -> deque[EventMessage]:
        """The events rank 0 keeps for replay (``EventLog.recent``)."""
        return self.log.recent

    @property
    def online(self) -> bool:
        return self.state is State.ONLINE

    def wake(self, at: float) -> None:
        """Have ``handle_timer`` called by ``at`` at the latest."""
        self._next = min(self._next, at)

    def rpc(self, handle: int, topic: str, payload: Optional[bytes], nodeid: int,
            flags: int, now: float) -> tuple[int, list[Output]]:
        """Send a request from ``handle``; its matchtag (0 with NORESPONSE) and outputs."""
        return self.routing.rpc(handle, topic, payload, nodeid, flags, now)

    def respond(self, handle: int, request: Request, payload: Optional[bytes], errnum: int,
                now: float, streaming: bool = False) -> list[Output]:
        """Answer ``request`` (delivered to ``handle``); nothing with NORESPONSE."""
        return self.routing.respond(handle, request, payload, errnum, now, streaming)

    def cancel(self, handle: int, matchtag: int, now: float) -> list[Output]:
        """Ask the server of a streaming RPC to end it (``Routing.cancel``)."""
        return self.routing.cancel(handle, matchtag, now)

    def error(self, request: Request, errnum: int, text: str, now: float) -> list[Output]:
        """Answer ``request`` with ``errnum`` and ``text``."""
        return self.routing.error(request, errnum, text, now)

    def answer(self, request: Request, obj: dict, now: float) -> list[Output]:
        """Answer ``request`` with the JSON object ``obj``."""
        return self.routing.answer(request, obj, now)

    def internal_rpc(self, topic: str, obj: dict, nodeid: int, now: float,
                     callback: Optional[Callable[[Response, float], list[Output]]],
                     streaming: bool = False) -> list[Output]:
        """An RPC of the node itself (handle 0); ``callback`` gets its response."""
        return self.routing.internal_rpc(topic, obj, nodeid, now, callback, streaming)

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

    def abandon(self, handle: int, matchtag: int) -> None:
        """Forget a pending RPC whose response is no longer wanted (its matchtag is
        only reused after that; a late response is dropped)."""
        state = self.handles.get(handle)
        if state is not None and matchtag in state.pending:
            # marks it abandoned; released on its final response
            pending = state.pending[matchtag]
            state.pending[matchtag] = Pending("", pending.nodeid, pending.streaming)

    def publish(self, handle: int, topic: str, payload: Optional[bytes],
                now: float) -> tuple[int, list[Output]]:
        """Publish an event (through rank 0); the matchtag answers with its sequence."""
        self.events["published"] += 1
        return self.routing.rpc(handle, "event.publish", json_payload(publish_body(topic, payload)),
                        0, 0, now)

    def receive(self, link: Any, frames: list[bytes], now: float) -> list[Output]:
        """A message arrived on ``link`` (bytes: ``PARENT``, or a ROUTER identity, frames
        without it)."""
        if self.state is State.STOPPED:
            return []
        if len(link) != IDENTITY_SIZE and link != PARENT:
            return self._stranger(link, frames)
        passed = self.routing.pass_through(link, frames, now)
        if passed is not None:
            return passed
        try:
            message = decode(frames)
        except ProtocolError as exc:
            return self.routing.drop(link, f"malformed: {exc.reason}")
        child = client = None
        if link == PARENT:
            self.routing.parent_heard = now
        else:
            child = self.children.get(link)
            if child is not None:
                child.heard = now
                if child.torpid:
                    child.torpid = False
            else:
                client = self.clients.get(link)
                if client is not None:
                    client.heard = now
        kind = type(message)
        if kind is Request:
            assert isinstance(message, Request)
            if child is None and link != PARENT and client is None and message.topic not in (
                    "peermesh.join", "peermesh.hello", "peermesh.client"):
                return self.routing.drop(link, "a request from a stranger")
            if client is not None and not message.flags & _NORESPONSE:
                service = service_of(message.topic)
                if service not in BUILTIN_SERVICES:
                    self.clients.arm(client, service, message.nodeid, message.flags & _UPSTREAM)
            routes = (link,) + (message.routes or ())
            request = make_request(message.topic, message.payload, message.nodeid,
                                   message.matchtag, message.flags, routes, message.userid,
                                   message.rolemask)
            # the frames as they are, the route pushed: forwarded without encoding again
            wire = [link, *frames] if message.routes is not None else None
            return self.routing.route_request(request, link, now, wire)
        if kind is Response:
            assert isinstance(message, Response)
            if child is None and link != PARENT:
                return self.routing.drop(link, "a response from a stranger")
            if not message.routes:
                return self.routing.drop(link, "a response without routes")
            self.routing.settle(link, message)
            return self.routing.route_response(message, now, frames)
        if kind is EventMessage:
            assert isinstance(message, EventMessage)
            if link != PARENT or self.state is not State.ONLINE:
                return self.routing.drop(link, "an event not from the parent")
            return self.log.event(message, frames, now)
        assert isinstance(message, Control)
        if message.ctype == ControlType.DISCONNECT:
            if link == PARENT and self.state is State.ONLINE:
                return self.membership.parent_lost(now, "the parent left")
            if link == PARENT and self.state in (State.JOINING, State.ATTACHING):
                return self.membership.refused(now, _REFUSED_BY_PEER)
            if child is not None:
                return self.membership.child_lost(child, now, "the child left")
            if client is not None:
                return self._client_gone(link, now)
        return []

    def _stranger(self, link: bytes, frames: list[bytes]) -> list[Output]:
        """A peer whose identity is not a member's: a flux-core broker's ``overlay.hello``
        (its identity is its 36-character UUID) is refused with EPROTO and a message
        saying why, on which that broker stops; anything else is dropped."""
        try:
            message = decode(frames)
        except ProtocolError:
            message = None
        if type(message) is not Request or message.topic != "overlay.hello" \
                or message.flags & _NORESPONSE:
            return self.routing.drop(link, "an identity that is not 16 bytes")
        refusal = make_response(message.topic, string_payload(FLUX_CORE_CHILD_REFUSED),
                                Errno.EPROTO, message.matchtag, 0, message.routes or (),
                                USERID_UNKNOWN, 0)
        return [Send(link, [link, *encode(refusal)])]

    def link_down(self, link: bytes, now: float) -> list[Output]:
        """A send found ``link`` gone (its peer's connection closed)."""
        if link == PARENT:
            return self.membership.parent_lost(now, "the link is down") if self.online else []
        child = self.children.get(link)
        if child is None:
            return self._client_gone(link, now)
        return self.membership.child_lost(child, now, "the link is down")

    def next_deadline(self) -> float:
        """When ``handle_timer`` is next due."""
        return self._next

    def handle_timer(self, now: float) -> list[Output]:
        """Heartbeats, torpid and lost links, timed-out joins; call at ``next_deadline()``."""
        out: list[Output] = []
        s = self.settings
        self._next = now + self._tick
        if self.state is State.STOPPED:
            return out
        if self.state is State.ONLINE and not self.root:
            if now - self.routing.parent_heard >= s.lost:
                out += self.membership.parent_lost(now, f"silent for {s.lost:g} s")
            elif now - self.routing.parent_sent >= s.heartbeat:
                out.append(self.routing.to_parent(encode(Control(ControlType.HEARTBEAT)), now))
        elif self.state in (State.JOINING, State.ATTACHING) and now >= self.membership.deadline:
            out += self.membership.retry(now)
        if self.state in (State.JOINING, State.ATTACHING):
            self._next = min(self._next, self.membership.deadline)
        if self.root:
            self.directory.expire(now, s.lost, s.reclaim)
        heartbeat: Optional[list[bytes]] = None
        for child in list(self.children.values()):
            silent = now - child.heard
            if silent >= s.lost:
                out += self.membership.child_lost(child, now, f"silent for {s.lost:g} s")
                continue
            if silent >= s.torpid and not child.torpid:
                child.torpid = True
                out.append(Emit(Notice("child-torpid", child.rank, silent)))
            if now - child.sent >= s.heartbeat:
                if heartbeat is None:
                    heartbeat = encode(Control(ControlType.HEARTBEAT))
                child.sent = now
                out.append(Send(child.identity, [child.identity, *heartbeat]))
        if self.clients.clients:
            out += self._tend_clients(now)
        return out

    def _tend_clients(self, now: float) -> list[Output]:
        """Forget the clients silent for ``lost`` seconds; heartbeat the others when due."""
        s = self.settings
        out: list[Output] = []
        for client in self.clients.silent_since(now - s.lost):
            out += self._client_gone(client.identity, now)
        heartbeat = encode(Control(ControlType.HEARTBEAT))
        for client in self.clients.clients.values():
            if now - client.sent >= s.heartbeat:
                client.sent = now
                out.append(Send(client.identity, [client.identity, *heartbeat]))
        return out

    def _client_gone(self, identity: bytes, now: float) -> list[Output]:
        """Forget a client; each service it sent requests to gets ``<service>.disconnect``
        (NORESPONSE), routed as from the client (see ``peermesh.flux.clients``)."""
        client = self.clients.forget(identity)
        if client is None:
            return []
        out: list[Output] = []
        for service, nodeid, upstream in client.targets:
            request = make_request(service + ".disconnect", None, nodeid, 0,
                                   _NORESPONSE | upstream, (identity,), USERID_UNKNOWN, 0)
            out += self.routing.route_request(request, identity, now)
        return out

    def builtin(self, request: Request, now: float,
                wire: Optional[list[bytes]] = None) -> list[Output]:
        topic = request.topic
        if topic == "broker.ping":
            return self._ping(request, now, wire)
        handler = _BUILTINS.get(topic)
        if handler is None:
            return self.error(request, Errno.ENOSYS, f"No method {topic} is registered", now)
        try:
            return handler(self, request, now)
        except ProtocolError as exc:
            return self.error(request, Errno.EPROTO, exc.reason, now)

    def _ping(self, request: Request, now: float,
              wire: Optional[list[bytes]] = None) -> list[Output]:
        """flux-core's ``broker.ping``: a JSON object answered with ``route``, ``userid``,
        ``rolemask`` and ``rank`` added. Any other payload (none included) is echoed
        as it is, from the request's frames when at hand (the same routes, topic and
        payload: only PROTO changes): peermesh's raw ping, where flux-core answers
        EPROTO."""
        if request.flags & _NORESPONSE:
            return []
        payload = request.payload
        if payload is not None and payload[:1] == b"{":
            try:
                answer = ping_answer(payload, request.routes or (), self.uuid, self.rank or 0,
                                     request.userid, request.rolemask)
            except ProtocolError as exc:
                return self.error(request, Errno.EPROTO, exc.reason, now)
            return self.routing.route_response(
                make_response(request.topic, answer, 0, request.matchtag, 0, request.routes,
                              USERID_UNKNOWN, 0), now)
        response = make_response(request.topic, payload, 0, request.matchtag, 0,
                                 request.routes, USERID_UNKNOWN, 0)
        if wire is not None:
            flags = wire[-1][3] & _FRAMES
            wire = wire[:-1]
            wire.append(pack_proto(MAGIC, VERSION, 2, flags, USERID_UNKNOWN, 0, 0,
                                    request.matchtag))
        return self.routing.route_response(response, now, wire)

    def _client_request(self, request: Request, now: float) -> list[Output]:
        """A rankless client on this node's ROUTER says hello (see ``peermesh.flux.clients``)."""
        link = request.routes[0] if request.routes else b""
        if len(link) != IDENTITY_SIZE or link in self.children:
            return self.error(request, Errno.EINVAL, "peermesh.client comes from a client", now)
        if self.state is not State.ONLINE:
            return self.error(request, Errno.EAGAIN, "not in the tree", now)
        if not self.clients.accept(link, now):
            return self.error(request, Errno.ENOSPC, "no room for clients (max_clients)", now)
        return self.answer(request, {"rank": self.rank, "size": self.size, "seq": self.log.seq,
                                      "topology": str(self.topology),
                                      "heartbeat": self.settings.heartbeat}, now)

    def _subscribe_request(self, request: Request, now: float) -> list[Output]:
        """``event.subscribe`` / ``event.unsubscribe`` ``{"topic": prefix}`` from a client."""
        client = self.clients.get(request.routes[0]) if request.routes else None
        if client is None:
            return self.error(request, Errno.EPROTO, "only a client subscribes by request", now)
        prefix = str_field(read_json(request.payload), "topic")
        if request.topic == "event.unsubscribe":
            self.clients.unsubscribe(client, prefix)
        elif not self.clients.subscribe(client, prefix):
            return self.error(request, Errno.EAGAIN, f"at most {self.clients.max_prefixes} "
                               "subscriptions per client (client_prefixes)", now)
        return self.answer(request, {}, now)

    def _attr_request(self, request: Request, now: float) -> list[Output]:
        """``attr.get`` ``{"name"}`` as flux-core answers it, ``{"value": text, "flags"}``,
        for the attributes a peermesh member has (``ATTRIBUTES``); ENOENT for others."""
        name = str_field(read_json(request.payload), "name", 128)
        if name not in ATTRIBUTES:
            return self.error(request, Errno.ENOENT, f"no attribute {name}", now)
        return self.answer(request, {"value": ATTRIBUTES[name](self), "flags": 0}, now)

    def _info(self, request: Request, now: float) -> list[Output]:
        return self.answer(request, self.info(), now)

    def info(self) -> dict[str, Any]:
        """This node's place in the tree."""
        return {"rank": self.rank, "size": self.size, "parent": self.parent_rank,
                "state": self.state.value, "seq": self.log.seq,
                "children": sorted(c.rank for c in self.children.values()),
                "torpid": sorted(c.rank for c in self.children.values() if c.torpid),
                "topology": str(self.topology), "clients": len(self.clients),
                **({"offline": self.directory.offline(MAX_OFFLINE)} if self.root else {})}


#: why joining stopped when the peer dialed answered DISCONNECT
_REFUSED_BY_PEER = ("DISCONNECT: the peer at that endpoint refuses this node (not a peermesh "
                    "member, e.g. a flux-core broker, or one that does not know it)")

#: the answer to a flux-core broker's ``overlay.hello``
FLUX_CORE_CHILD_REFUSED = ("a peermesh member takes no flux-core broker as its child: "
                           "flux-core brokers join a flux-core parent or a peermesh rank "
                           "in flux mode (FluxModeMember)")

#: the broker attributes a member serves (``attr.get``), under flux-core's names
ATTRIBUTES: dict[str, Callable[[FluxCore], str]] = {
    "rank": lambda core: str(core.rank),
    "size": lambda core: str(core.size),
    "tbon.topo": lambda core: str(core.topology),
    "version": lambda core: __version__,
    "broker.uuid": lambda core: core.uuid,
}

_BUILTINS: dict[str, Callable[[FluxCore, Request, float], list[Output]]] = {
    "attr.get": FluxCore._attr_request,
    "broker.ping": FluxCore._ping,
    "peermesh.info": FluxCore._info,
    "peermesh.join": lambda core, request, now: core.membership.join_request(request, now),
    "peermesh.hello": lambda core, request, now: core.membership.hello_request(request, now),
    "peermesh.attached": lambda core, request, now: core.membership.attached_request(request, now),
    "peermesh.lost": lambda core, request, now: core.membership.lost_request(request, now),
    "peermesh.client": FluxCore._client_request,
    "event.subscribe": FluxCore._subscribe_request,
    "event.unsubscribe": FluxCore._subscribe_request,
    "event.publish": lambda core, request, now: core.log.publish_request(request, now),
    "peermesh.replay": lambda core, request, now: core.log.replay_request(request, now),
}

