"""How a Flux node routes requests and responses (RFC 3), and what it keeps in flight.

How it works
------------
Request routing (RFC 3; ``me`` is this node's rank)::

    nodeid                condition                                  action
    --------------------  -----------------------------------------  -------------------
    ANY, UPSTREAM != me   a local handle serves the service and is    deliver to it
                          not the sender
    ANY                   built-in service (overlay, event, broker,   answer here
                          attr, peermesh)
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

The common cases never decode a message: a request for another rank (from
the parent, a child or a rankless client) and a response for a child or the
parent go on as they came, the route pushed or popped (``Routing.pass_through``,
from the PROTO and route frames alone); an RPC of a local handle for another
rank is framed directly, and a ping for this rank is answered from the
request's frames (flux's JSON ping with its answer, ``bodies.ping_answer``, as
the node's built-in ``broker.ping`` gives it; any other body echoed). Everything else (and
anything malformed, which is then dropped) is decoded first. With the C extension a
node's driver hands each batch read to ``flux_take`` first (``peermesh.io.zmqbatch``):
the same forwards and echoes, with the same checks and bookkeeping, read from
``take_shape`` and sent in the call; ``pass_through`` takes what it leaves (and
everything without the extension).

Kept whole: the table above and what is kept in flight are one job, as each forward
records in the same pass what the loss of its link must answer.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Protocol

from ..errors import ProtocolError
from ..wire.flux import (
    FLAG_NORESPONSE as _NORESPONSE, FLAG_ROUTE as _ROUTE, FLAG_STREAMING as _STREAMING,
    FLAG_UPSTREAM as _UPSTREAM, FRAME_BITS as _FRAMES, MAGIC, MAGIC_VERSION as _MAGIC_VERSION,
    MATCHTAG_NONE, MAX_RANK, NODEID_ANY, NODEID_UPSTREAM, USERID_UNKNOWN, VERSION, Errno,
    Request, Response, encode, json_payload, make_request, make_response, service_of,
    string_payload, pack_proto as _pack_proto, peek_credentials as _peek_credentials,
    peek_proto as _peek_proto, unpack_proto as _unpack_proto, read_json,
)
from .bodies import int_field, ping_answer
from .clients import ClientTable
from .errors import FluxStateError
from .children import Child
from .matchtags import Handle, Pending
from .outputs import BUILTIN_SERVICES, IDENTITY_SIZE, PARENT, SELF, Deliver, Output, Send
from .settings import FluxSettings, State
from .topology import Topology


__all__ = ["Routing", "RoutingHost", "BUILTIN_SERVICES", "InflightKey", "Forwarded"]

log = logging.getLogger(__name__)


_NORESPONSE_STREAMING = _NORESPONSE | _STREAMING  # invalid together

#: a request forwarded on a link: ``(link, its matchtag, *its routes)`` (one flat tuple: the
#: thousands in flight at once are a third fewer objects for the garbage collector to count)
InflightKey = tuple[Any, ...]
#: what is kept of it until its final response: (topic, nodeid, streaming) (a plain tuple:
#: quick to make, and the thousands in flight cost the garbage collector nothing)
Forwarded = tuple[str, int, bool]


#: methods every service has: a handle ends its streams itself unless it serves them
_STREAM_ENDS = frozenset({".cancel", ".disconnect"})

#: built-ins any node answers for NODEID_ANY (a client's requests among them)
_ANSWERED_ANYWHERE = frozenset({"broker.ping", "attr.get", "peermesh.info",
                                "peermesh.client", "event.subscribe", "event.unsubscribe"})


def _rerouted(response: Response, routes: tuple[bytes, ...]) -> Response:
    """``response`` with another route stack."""
    return make_response(response.topic, response.payload, response.errnum, response.matchtag,
                         response.flags, routes, response.userid, response.rolemask)


class RoutingHost(Protocol):
    """What routing needs of its node (``FluxCore``): its place in the tree, whom it serves
    (handles, services, children, clients), its counters, and the built-in services."""

    rank: Optional[int]
    uuid: str
    root: bool
    size: int
    state: State
    parent_rank: Optional[int]
    settings: FluxSettings
    topology: Topology
    children: dict[bytes, Child]
    clients: ClientTable
    by_rank: dict[int, bytes]
    placed: dict[int, bytes]
    handles: dict[int, Handle]
    services: dict[str, int]
    methods: dict[str, int]
    stats: dict[str, int]
    rpcs: dict[str, int]

    def builtin(self, request: Request, now: float,
                wire: Optional[list[bytes]] = None) -> list[Output]:
        """Answer a request for a built-in service."""
        ...


class Routing:
    """Request and response routing of one node (see the module's docstring): what is in
    flight, the core's own RPCs waiting for answers and when the parent was last heard
    and sent to are its own; the node's place in the tree it reads through ``node``."""

    def __init__(self, node: RoutingHost) -> None:
        self.node = node
        #: requests forwarded on a link, until their final response (the link is the
        #: key's first item: ``via`` groups them per link when one is lost)
        self.inflight: dict[InflightKey, Forwarded] = {}
        #: the callbacks of the core's own RPCs (handle 0), by matchtag
        self.internal: dict[int, Callable[[Response, float], list[Output]]] = {}
        self.parent_heard = self.parent_sent = 0.0

    @property
    def via(self) -> dict[bytes, set[InflightKey]]:
        """The keys of ``inflight`` per link (made when asked: only a lost link needs it,
        so forwarding a request does not pay for it)."""
        via: dict[bytes, set[InflightKey]] = {}
        for key in self.inflight:
            keys = via.get(key[0])
            if keys is None:
                keys = via[key[0]] = set()
            keys.add(key)
        return via

    def rpc(self, handle: int, topic: str, payload: Optional[bytes], nodeid: int,
            flags: int, now: float) -> tuple[int, list[Output]]:
        """Send a request from ``handle``; its matchtag (0 with NORESPONSE) and outputs."""
        node = self.node
        state = node.handles[handle]
        if handle:  # (0: the node's own)
            node.rpcs["sent"] += 1
        if nodeid == NODEID_UPSTREAM:
            if node.rank is None:
                raise FluxStateError("NODEID_UPSTREAM needs a rank: the node is not online")
            nodeid, flags = node.rank, flags | _UPSTREAM
        if flags & _NORESPONSE:
            tag = MATCHTAG_NONE
        else:
            if len(state.pending) >= node.settings.max_pending:
                raise FluxStateError(f"{len(state.pending)} RPCs already in flight on this "
                                     f"handle (max_pending)")
            tag = state.allocate()
            state.pending[tag] = Pending(topic, nodeid, bool(flags & _STREAMING))
        route = b"@%d" % handle
        target = self._next_hop(nodeid, flags, route)
        if target is not None and topic and (payload is None or type(payload) is bytes) \
                and 0 <= flags <= 0xFF and flags & _NORESPONSE_STREAMING != _NORESPONSE_STREAMING \
                and (flags & _NORESPONSE or self._track(target, (route,), tag, topic, nodeid,
                                                        flags)):
            # for another rank, valid as it is: the frames straight away (what encode makes;
            # when max_inflight are tracked already, the full path answers EAGAIN)
            frames = [route, b"", topic.encode()]
            wire_flags = (int(flags) & ~_FRAMES) | _ROUTE | 1
            if payload is not None:
                frames.append(payload)
                wire_flags |= 2
            frames.append(_pack_proto(MAGIC, VERSION, 1, wire_flags, USERID_UNKNOWN, 0, nodeid,
                                      tag))
            node.stats["forwarded"] += 1
            if target == PARENT:
                return tag, [self.to_parent(frames, now)]
            return tag, self._send_down(target, [target, *frames], now)
        request = make_request(topic, payload, nodeid, tag, flags, (route,), USERID_UNKNOWN, 0)
        return tag, self.route_request(request, route, now)

    def respond(self, handle: int, request: Request, payload: Optional[bytes], errnum: int,
                now: float, streaming: bool = False) -> list[Output]:
        """Answer ``request`` (delivered to ``handle``); nothing with NORESPONSE."""
        if request.flags & _NORESPONSE:
            return []
        self.node.rpcs["errors" if errnum else "answered"] += 1
        flags = _STREAMING if request.flags & _STREAMING else 0
        response = make_response(request.topic, payload, errnum, request.matchtag, flags,
                                 request.routes, USERID_UNKNOWN, 0)
        return self.route_response(response, now)

    def cancel(self, handle: int, matchtag: int, now: float) -> list[Output]:
        """Ask the server of a streaming RPC to end it: ``<service>.cancel`` with
        ``{"matchtag"}`` (no response) to the same rank; the stream still ends
        with its final response."""
        pending = self.node.handles[handle].pending.get(matchtag)
        if pending is None or not pending.streaming:
            return []
        topic = service_of(pending.topic) + ".cancel"
        _, out = self.rpc(handle, topic, json_payload({"matchtag": matchtag}), pending.nodeid,
                          _NORESPONSE, now)
        return out

    def pass_through(self, link: bytes, frames: list[bytes],
                     now: float) -> Optional[list[Output]]:
        """Route the common messages from their PROTO and route frames alone: a
        request for another rank (from the parent, a child or a client) and a
        response for a child or the parent are
        forwarded as they came (the route pushed or popped), a ping for this rank
        is answered from its frames, a response for a local handle is built once.
        None for everything else (and for anything malformed): ``receive`` decodes
        it then."""
        node = self.node
        if not frames:
            return None
        proto = frames[-1]
        if type(proto) is not bytes or len(proto) != 20:
            return None
        head, kind, flags, aux1, aux2 = _peek_proto(proto)
        if head != _MAGIC_VERSION or kind > 2 or not flags & _ROUTE \
                or flags & _NORESPONSE_STREAMING == _NORESPONSE_STREAMING:
            return None
        end = len(frames) - 1
        try:
            d = frames.index(b"", 0, end)
        except ValueError:
            return None
        if not flags & 1 or end - d - 2 != (flags >> 1 & 1) or not frames[d + 1]:
            return None  # no topic, an empty one, or frames no flag announces
        try:
            topic = frames[d + 1].decode()
        except UnicodeDecodeError:
            return None
        client = None
        if link == PARENT:
            child = None
        else:
            child = node.children.get(link)
            if child is not None and topic == "peermesh.attached":
                return None  # (the full path learns where that rank is: ``_placed``)
            if child is None:
                client = node.clients.get(link)
                if client is None or kind == 2:
                    return None  # a stranger's, or a response from a client: the full path
        # (the two forwards, a hop's whole work, are written out here: no call per step)
        if kind == 2:
            top = frames[0] if d else b""
            if len(top) == IDENTITY_SIZE or top == PARENT:
                if top == PARENT and node.parent_rank is None:
                    return None  # (the full path drops it)
                if not flags & _STREAMING or aux1:   # final: what was kept of it goes
                    self.inflight.pop((link, aux2, *frames[:d]), None)
                if top == PARENT:
                    self.parent_sent = now
                    out: Optional[list[Output]] = [Send(PARENT, frames[1:])]
                else:
                    below = node.children.get(top)
                    if below is not None:
                        below.sent = now
                    out = [Send(top, frames)]
            elif top[:1] == b"@" and top[1:].isdigit():
                out = self._response_here(link, frames, d, topic, now)
            else:
                return None  # to no handle: the full path
        elif aux1 == node.rank:
            out = self._ping_here(link, frames, d, topic, flags, aux1, aux2, now)
        else:   # a request for another rank (``_track`` written out)
            target = self._next_hop(aux1, flags, link)
            if target is None:
                return None
            if not flags & _NORESPONSE:
                inflight = self.inflight
                if len(inflight) >= node.settings.max_inflight:
                    return None  # (the full path answers EAGAIN)
                inflight[(target, aux2, link, *frames[:d])] = (
                    topic, aux1, flags & _STREAMING != 0)
            node.stats["forwarded"] += 1
            if target == PARENT:
                self.parent_sent = now
                out = [Send(PARENT, [link, *frames])]
            else:
                below = node.children.get(target)
                if below is not None:
                    below.sent = now
                out = [Send(target, [target, link, *frames])]
        if out is not None:
            if client is not None:
                client.heard = now
                if not flags & _NORESPONSE:
                    service = topic.partition(".")[0]
                    if service not in BUILTIN_SERVICES:
                        node.clients.arm(client, service, aux1, flags & _UPSTREAM)
            elif child is None:
                self.parent_heard = now
            else:
                child.heard = now
                child.torpid = False
        return out

    def take_shape(self, router: int, dealer: int) -> tuple[Any, ...]:
        """What ``flux_take`` (``peermesh.io.zmqbatch``, ``pass_through`` in C over a
        batch read, sending as it goes on the ROUTER's and the parent DEALER's handles
        ``router`` and ``dealer``) reads of this node, as it is now."""
        node = self.node
        return (router, dealer, PARENT, self, self.inflight, node.children, node.by_rank,
                node.rank, node.topology.k, node.size if node.root else 1 << 32,
                node.parent_rank is not None, node.placed, node.settings.max_inflight)

    def _response_here(self, link: bytes, frames: list[bytes], d: int, topic: str,
                       now: float) -> list[Output]:
        """``pass_through`` of a response to a local handle (``frames[0]``: ``@n``)."""
        _, _, _, flags, userid, rolemask, errnum, matchtag = _unpack_proto(frames[-1])
        routes = tuple(frames[:d])
        self._settle_key(link, routes, matchtag, flags, errnum)
        response = make_response(topic, frames[d + 2] if flags & 2 else None, errnum, matchtag,
                                 flags & ~_FRAMES, routes[1:], userid, rolemask)
        return self._to_handle(int(routes[0][1:]), response, now)

    def _ping_here(self, link: bytes, frames: list[bytes], d: int, topic: str, flags: int,
                   nodeid: int, matchtag: int, now: float) -> Optional[list[Output]]:
        """``pass_through`` of a request for this rank: a ping is answered from its frames."""
        node = self.node
        if node.state is not State.ONLINE or flags & _UPSTREAM or topic != "broker.ping":
            return None
        if flags & _NORESPONSE:
            return []
        proto = frames[-1]
        frames = frames[:-1]  # the same routes and topic: only payload and PROTO change
        if flags & 2 and frames[d + 2][:1] == b"{":  # flux's JSON ping: its answer
            userid, rolemask = _peek_credentials(proto)
            try:
                frames[d + 2] = ping_answer(frames[d + 2], (link, *frames[:d]), node.uuid,
                                            nodeid, userid, rolemask)
            except ProtocolError:
                return None  # (the full path answers EPROTO)
        frames.append(_pack_proto(MAGIC, VERSION, 2, flags & _FRAMES, USERID_UNKNOWN, 0, 0,
                                  matchtag))
        if link == PARENT:
            return [self.to_parent(frames, now)]
        return self._send_down(link, [link, *frames], now)

    def _next_hop(self, nodeid: int, flags: int, came_from: bytes) -> Optional[bytes]:
        """The link a request for rank ``nodeid`` (not this one) goes on: a child on
        its path, else the parent; None when it is to be answered here instead."""
        node = self.node
        if nodeid == NODEID_ANY or nodeid == NODEID_UPSTREAM or nodeid == node.rank \
                or flags & _UPSTREAM or nodeid > MAX_RANK or node.root and nodeid >= node.size:
            return None
        target = self._child_toward(nodeid)
        if target is None:
            if node.parent_rank is None or node.state is not State.ONLINE \
                    or came_from == PARENT:  # never back up: no request bounces
                return None
            target = PARENT
        return target

    def _send_down(self, identity: bytes, frames: list[bytes], now: float) -> list[Output]:
        """Send ``frames`` (the first: ``identity``) to a child or guest on the ROUTER."""
        child = self.node.children.get(identity)
        if child is not None:
            child.sent = now
        return [Send(identity, frames)]

    def route_request(self, request: Request, came_from: bytes, now: float,
                      wire: Optional[list[bytes]] = None) -> list[Output]:
        """Deliver, answer or forward ``request`` (``wire``: its frames, if at hand)."""
        node = self.node
        nodeid = request.nodeid
        me = node.rank
        topic = request.topic
        service = service_of(topic)
        upstream = request.flags & _UPSTREAM
        if topic == "peermesh.attached" and came_from in node.children:
            self._placed(request.payload, came_from)
        if nodeid == NODEID_ANY or upstream:
            if not (upstream and nodeid == me):  # UPSTREAM: never on the sending rank
                owner = node.services.get(service)
                if owner is not None and came_from != b"@%d" % owner:
                    return self._deliver_request(owner, request, now)
                if service in BUILTIN_SERVICES and self._answers_here(topic):
                    return node.builtin(request, now, wire)
            if node.parent_rank is not None and node.state is State.ONLINE:
                return self._forward(PARENT, request, now, wire)
            if node.root:
                return self.error(request, Errno.ENOSYS,
                                  f"No service matching {topic} is registered", now)
            return self.error(request, Errno.EHOSTUNREACH, "not attached to the tree", now)
        if nodeid == me and node.state is State.ONLINE or (
                topic in ("peermesh.hello", "peermesh.join") and nodeid == me):
            owner = node.services.get(service)
            if owner is not None:
                return self._deliver_request(owner, request, now)
            if service in BUILTIN_SERVICES:
                return node.builtin(request, now, wire)
            return self.error(request, Errno.ENOSYS,
                              f"No service matching {topic} is registered", now)
        if nodeid > MAX_RANK or node.root and nodeid >= node.size:
            return self.error(request, Errno.EHOSTUNREACH, f"no rank {nodeid}", now)
        child = self._child_toward(nodeid)
        if child is not None:
            return self._forward(child, request, now, wire)
        if node.parent_rank is not None and node.state is State.ONLINE \
                and came_from != PARENT:  # never back up: no request bounces
            return self._forward(PARENT, request, now, wire)
        return self.error(request, Errno.EHOSTUNREACH, f"rank {nodeid} is unreachable", now)

    def _placed(self, payload: Optional[bytes], child: bytes) -> None:
        """A ``peermesh.attached`` report passing up from ``child``: the rank it names is
        below that child, wherever its formula puts it (a node that attached to an
        ancestor while its formula parent could not answer). At most ``max_size`` ranks."""
        try:
            rank = int_field(read_json(payload), "rank", 1, self.node.settings.max_size - 1)
        except (ProtocolError, AttributeError, TypeError, ValueError):
            return
        self.node.placed[rank] = child

    def _answers_here(self, topic: str) -> bool:
        """Built-ins that any node answers for NODEID_ANY (the rest belong to rank 0)."""
        return topic in _ANSWERED_ANYWHERE or self.node.root

    def _child_toward(self, rank: int) -> Optional[bytes]:
        """The child whose subtree holds ``rank`` (walking up from it), if any: a rank
        that attached out of its formula place goes where its report came up (``placed``)."""
        node = self.node
        by_rank = node.by_rank
        if not by_rank:
            return None
        me = node.rank
        k = node.topology.k
        placed = node.placed
        if not placed:   # (the usual case: every rank in its formula place)
            while rank > 0 and rank != me:
                identity = by_rank.get(rank)
                if identity is not None:
                    return identity
                rank = 0 if k == 0 else (rank - 1) // k
            return None
        while rank > 0 and rank != me:
            identity = by_rank.get(rank)
            if identity is not None:
                return identity
            identity = placed.get(rank)   # (a rank out of its formula place)
            if identity is not None and identity in node.children:
                return identity
            rank = 0 if k == 0 else (rank - 1) // k
        return None

    def _forward(self, link: bytes, request: Request, now: float,
                 wire: Optional[list[bytes]] = None) -> list[Output]:
        """Send ``request`` (routes already pushed; ``wire``: its frames) on ``link``,
        tracking it until answered."""
        if not request.flags & _NORESPONSE and not self._track(
                link, request.routes or (), request.matchtag, request.topic, request.nodeid,
                request.flags):
            return self.error(request, Errno.EAGAIN, "too many requests in flight", now)
        self.node.stats["forwarded"] += 1
        frames = wire if wire is not None else encode(request)
        if link == PARENT:
            return [self.to_parent(frames, now)]
        return self._send_down(link, [link, *frames], now)

    def _track(self, link: bytes, routes: tuple[bytes, ...], matchtag: int, topic: str,
               nodeid: int, flags: int) -> bool:
        """Remember a request forwarded on ``link`` until its final response; False
        when ``max_inflight`` are tracked already."""
        inflight = self.inflight
        if len(inflight) >= self.node.settings.max_inflight:
            return False
        inflight[(link, matchtag, *routes)] = (topic, nodeid, bool(flags & _STREAMING))
        return True

    def settle(self, link: bytes, response: Response) -> None:
        """A response came back on ``link``: forget its request once it is final."""
        self._settle_key(link, response.routes or (), response.matchtag, response.flags,
                         response.errnum)

    def _settle_key(self, link: bytes, routes: tuple[bytes, ...], matchtag: int, flags: int,
                    errnum: int) -> None:
        if flags & _STREAMING and not errnum:
            return
        self.inflight.pop((link, matchtag, *routes), None)

    def route_response(self, response: Response, now: float,
                       wire: Optional[list[bytes]] = None) -> list[Output]:
        """Pop the top route and send ``response`` that way (``wire``: its frames)."""
        routes = response.routes or ()
        if not routes:
            return self.drop(b"", "a response with no route left")
        top = routes[0]
        if top == PARENT:
            if self.node.parent_rank is None:
                return self.drop(top, "a response for a parent this node has not")
            return [self.to_parent(wire[1:] if wire is not None else
                                   encode(_rerouted(response, routes[1:])), now)]
        if len(top) != IDENTITY_SIZE:  # "@n": a local handle
            if top[:1] != b"@" or not top[1:].isdigit():
                return self.drop(top, "a response to no handle")
            return self._to_handle(int(top[1:]), _rerouted(response, routes[1:]), now)
        # the ROUTER takes the top route as the address
        return self._send_down(top, wire if wire is not None else encode(response), now)

    def _to_handle(self, number: int, response: Response, now: float) -> list[Output]:
        node = self.node
        state = node.handles.get(number)
        if state is None:
            return []
        pending = state.pending.get(response.matchtag)
        if pending is None:
            return self.drop(b"@%d" % number, f"a response to no RPC ({response.matchtag})")
        final = not pending.streaming or response.errnum != 0
        if final:
            state.release(response.matchtag)
        if number == 0:
            callback = self.internal.pop(response.matchtag, None) if final else \
                self.internal.get(response.matchtag)
            return callback(response, now) if callback is not None else []
        if not pending.topic:  # abandoned
            return []
        node.rpcs["responses"] += 1
        return [Deliver((number, response))]

    def _deliver_request(self, handle: int, request: Request, now: float) -> list[Output]:
        node = self.node
        topic = request.topic
        if topic in node.methods or topic[len(service_of(topic)):] in _STREAM_ENDS:
            node.rpcs["received"] += 1
            return [Deliver((handle, request))]
        return self.error(request, Errno.ENOSYS, f"No method {topic} is registered", now)

    def error(self, request: Request, errnum: int, text: str, now: float) -> list[Output]:
        """Answer ``request`` with ``errnum`` and ``text`` (nothing with NORESPONSE)."""
        if request.flags & _NORESPONSE:
            return []
        self.node.rpcs["errors"] += 1
        flags = _STREAMING if request.flags & _STREAMING else 0
        return self.route_response(Response(request.topic, string_payload(text), errnum,
                                            request.matchtag, flags, request.routes), now)

    def answer(self, request: Request, obj: dict, now: float) -> list[Output]:
        """Answer ``request`` with the JSON object ``obj`` (nothing with NORESPONSE)."""
        if request.flags & _NORESPONSE:
            return []
        return self.route_response(Response(request.topic, json_payload(obj), 0,
                                            request.matchtag, 0, request.routes), now)

    def to_parent(self, frames: list[bytes], now: float) -> Send:
        """Send ``frames`` to the parent, noting when."""
        self.parent_sent = now
        return Send(PARENT, frames)

    def drop(self, link: bytes, why: str) -> list[Output]:
        """Count a dropped message and say why at debug (rate-limited)."""
        node = self.node
        node.stats["dropped"] += 1
        if node.stats["dropped"] <= 100 or node.stats["dropped"] % 1000 == 0:
            log.debug("flux rank %s dropped a message from %r: %s", node.rank, link[:16], why)
        return []

    def internal_rpc(self, topic: str, obj: dict, nodeid: int, now: float,
                     callback: Optional[Callable[[Response, float], list[Output]]],
                     streaming: bool = False) -> list[Output]:
        """An RPC of the node itself (handle 0); ``callback`` gets its response."""
        flags = _NORESPONSE if callback is None else 0
        tag, out = self.rpc(0, topic, json_payload(obj), nodeid, flags, now)
        if callback is not None and tag in self.node.handles[0].pending:
            self.internal[tag] = callback
        return out

    def fail_via(self, link: bytes, why: str) -> list[Output]:
        """Answer EHOSTUNREACH to every request forwarded on ``link``."""
        out: list[Output] = []
        keys = [key for key in self.inflight if key[0] == link]
        text = string_payload(why)
        for key in keys:
            forwarded = self.inflight.pop(key, None)
            if forwarded is None:
                continue
            topic, _, streaming = forwarded
            matchtag, routes = key[1], key[2:]
            self.node.rpcs["errors"] += 1
            flags = _STREAMING if streaming else 0
            out += self.route_response(Response(topic, text, Errno.EHOSTUNREACH,
                                                matchtag, flags, routes), 0.0)
        return out

    def guest_rpc(self, topic: str, body: dict, nodeid: int, now: float,
                  callback: Callable[[Response, float], list[Output]]) -> list[Output]:
        """A request from the core straight to the DEALER (not routed: not attached yet)."""
        state = self.node.handles[0]
        tag = state.allocate()
        state.pending[tag] = Pending(topic, nodeid, False)
        self.internal[tag] = callback
        request = Request(topic, json_payload(body), nodeid, tag, 0, (SELF,))
        return [self.to_parent(encode(request), now)]

    def forget_internal(self, topics: frozenset[str]) -> None:
        """Drop the core's own requests on ``topics`` still unanswered."""
        state = self.node.handles[0]
        for tag in [t for t, p in state.pending.items() if p.topic in topics]:
            state.release(tag)
            self.internal.pop(tag, None)

    def sender_gone(self, link: bytes, now: float) -> list[Output]:
        """What came from ``link`` (a lost child) is dropped where it is served: each local
        service gets ``<service>.disconnect`` with the route stack ``(link,)``, and each
        request it sent on is forgotten and followed along its link by a
        ``<service>.disconnect`` with that request's own stack."""
        gone = (link,)
        out: list[Output] = [
            Deliver((handle, make_request(service + ".disconnect", None, NODEID_ANY, 0,
                                          _NORESPONSE, gone, USERID_UNKNOWN, 0)))
            for service, handle in self.node.services.items()]
        told: set[tuple[bytes, str, int, tuple[bytes, ...]]] = set()
        for key in [k for k in self.inflight if k[2:3] == gone]:
            topic, nodeid, _ = self.inflight.pop(key)
            target, routes = key[0], key[2:]
            service = service_of(topic)
            if (target, service, nodeid, routes) in told:
                continue
            told.add((target, service, nodeid, routes))
            frames = encode(Request(service + ".disconnect", None, nodeid, 0,
                                    _NORESPONSE, routes))
            out.append(self.to_parent(frames, now) if target == PARENT
                       else Send(target, [target, *frames]))
        return out
