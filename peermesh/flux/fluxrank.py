"""One rank of a flux-core tree in flux mode, sans-io: ``FluxModeCore`` (its driver is
``peermesh.flux.fluxmode.FluxModeMember``; the module docstring there says what the wire
carries).

Route stacks are flux-core's (on the wire and in ``routes``, the newest hop first): a
message from a child carries the child's identity as its newest hop (what the ROUTER reads
it from); a request sent down gets this rank's UUID pushed, and the answer pops it again; a
request from the parent arrives with the parent's UUID as its newest hop, and its answer
goes up with the stack as it came. Requests are routed as
flux-core's broker routes them: to this rank's services when addressed to it (or to any
rank, or upstream from a child, and served here), down to the child whose subtree holds
the rank addressed, else up; rank 0 answers what nobody serves with ENOSYS.

Kept whole: one sans-io core (``FluxModeCore``): routing, hellos, events and monitors
all read and move the same route stacks and child table.
"""

from __future__ import annotations

import dataclasses
import errno as errnos
import json
import logging
import os
import uuid as uuids
from typing import Any, Optional, Sequence

from ..errors import ProtocolError
from ..wire.flux import (
    NODEID_ANY, NODEID_UPSTREAM, Control, ControlType, Errno, EventMessage, MsgFlag, Request,
    Response, Role,
    decode, encode, json_payload, read_json, service_of, string_payload,
)
from .bodies import int_field, ping_answer, str_field, unb64
from .errors import FluxStateError
from .fluxtree import FULL, LOST, OFFLINE, FluxChild, FluxTree, status_name, subtree_status
from .outputs import PARENT, Deliver, Emit, Notice, Output, Send

__all__ = ["FluxModeCore", "FLUX_VERSION", "STATUS_FULL", "SERVICES", "ROOT_SERVICES",
           "STATE_RUN", "STATE_SHUTDOWN"]

log = logging.getLogger(__name__)

#: the flux-core version this rank says it is (the parent compares MAJOR.MINOR)
FLUX_VERSION = (0, 88, 0)
#: subtree status "full" (flux-core's SUBTREE_STATUS_FULL)
STATUS_FULL = FULL
#: broker states a child's ``state-machine.monitor`` is told (flux-core's enum)
STATE_JOIN, STATE_RUN, STATE_SHUTDOWN = 1, 5, 7
_NORESPONSE, _STREAMING, _UPSTREAM = 0x04, 0x40, int(MsgFlag.UPSTREAM)
#: what every flux-mode rank serves itself
SERVICES = frozenset({"broker.ping", "attr.get", "overlay.health", "overlay.topology",
                      "state-machine.monitor", "config.get"})
#: what a flux-mode rank 0 serves besides: publishing, and what flux-core brokers below
#: send up without wanting an answer (group membership updates, log lines)
ROOT_SERVICES = frozenset({"event.publish", "groups.update", "log.append"})


class FluxModeCore:
    """One rank of a flux-core tree (rank 0, an interior rank or a leaf), sans-io.

    ``parents`` (every rank's parent, -1 for rank 0; None: rank 0's children are all
    the others) gives its children, ``hosts`` the hostname each rank must say hello
    with, ``config`` what ``config.get`` answers. Calls return outputs:
    ``Send(PARENT, frames)``, ``Send(identity, [identity, *frames])`` to a child,
    ``Deliver(0, message)`` (a request for a registered topic, an event, or a response
    to ``rpc``) and ``Notice(what, rank, detail)`` (``online``, ``refused``,
    ``parent-lost``, ``parent-shutdown``, ``child`` (a child's new status),
    ``drained``, ``left``)."""

    def __init__(self, rank: int, size: int, hostname: str, *,
                 parents: Optional[Sequence[int]] = None, hosts: Optional[Sequence[str]] = None,
                 config: Optional[dict[str, Any]] = None,
                 version: tuple[int, int, int] = FLUX_VERSION, heartbeat: float = 2.0,
                 max_pending: int = 1024, max_waiters: int = 1024, max_inflight: int = 65536,
                 uuid: Optional[str] = None, userid: Optional[int] = None) -> None:
        if not 0 <= rank < size:
            raise FluxStateError(f"rank {rank} is not a rank of {size}")
        if parents is None:
            parents = [-1] + [0] * (size - 1)
        if len(parents) != size or (hosts is not None and len(hosts) != size):
            raise FluxStateError(f"{len(parents)} parents and "
                                 f"{'no' if hosts is None else len(hosts)} hosts for {size} ranks")
        self.tree = FluxTree(parents, rank)
        self.rank, self.size, self.hostname = rank, size, hostname
        self.hosts = list(hosts) if hosts is not None else None
        # (as JSON would carry it: a TOML date becomes its text)
        self.config = json.loads(json.dumps(config or {}, default=str))
        self.uuid = uuid or str(uuids.uuid4())
        self.identity = self.uuid.encode()
        self.version = version
        #: the userid of this rank's own requests (flux-core's: the instance owner's)
        self.userid = os.getuid() if userid is None else userid
        self.heartbeat = heartbeat
        self.max_pending = max_pending
        #: streaming requests kept for updates (health, state), at most
        self.max_waiters = max_waiters
        #: requests sent to each child and not answered yet, kept to fail them
        #: (EHOSTUNREACH) if it goes, at most (past it, such a request is not kept)
        self.max_inflight = max_inflight
        self._inflight: dict[int, dict[tuple[int, tuple[bytes, ...]], Request]] = {}
        # hello -> online -> draining -> leaving -> stopped (rank 0: online at once)
        self.state = "detached"
        self.parent_uuid = ""
        self._parent_id = b""
        self.topics: set[str] = set()
        self.pending: dict[int, str] = {}  # matchtag -> topic, of this rank's own RPCs
        self.children = {r: FluxChild(r, self.hosts[r] if self.hosts else "")
                         for r in self.tree.child_ranks()}
        self._by_uuid: dict[bytes, FluxChild] = {}
        self.status = subtree_status(list(self.children.values())) if self.children else FULL
        self._since = 0.0
        self._health: list[Request] = []
        self._monitors: list[Request] = []
        self._next_tag = 1
        self._sent = 0.0
        self._seq = 0
        self._watch = -1   # the matchtag of this rank's watch of its parent's state
        self.stats = {"dropped": 0, "log_lines": 0, "heartbeats_sent": 0, "heartbeats_heard": 0}

    # --- what the driver calls ------------------------------------------------------

    def start(self, now: float) -> list[Output]:
        """Say hello to the parent (rank 0: be online)."""
        self._since = now
        for child in self.children.values():
            child.since = now
        if self.rank == 0:
            self.state = "online"
            return [Emit(Notice("online", 0, {"parent": None, "size": self.size}))]
        self.state = "hello"
        (major, minor, patch) = self.version
        body = {"rank": self.rank, "version": major << 16 | minor << 8 | patch,
                "uuid": self.uuid, "status": self.status, "hostname": self.hostname}
        return [self._up(Request("overlay.hello", json_payload(body), NODEID_ANY,
                                 self._tag("overlay.hello"), routes=(),
                                 rolemask=Role.OWNER), now)]

    def leave(self, now: float, force: bool = False) -> list[Output]:
        """Leave as a flux-core broker does: tell the children's ``state-machine.monitor``
        this rank shuts down and wait for their goodbyes (``Notice("drained")``), then
        ``overlay.goodbye`` to the parent (``Notice("left")`` once it answers). With
        ``force`` (the children took too long) it goes on without them."""
        if self.state in ("online", "hello"):
            self.state = "draining"
            out = self._tell_monitors(now)
            if not force and any(child.online for child in self.children.values()):
                return out
            return out + self._goodbye(now)
        if self.state == "draining" and force:
            return self._goodbye(now)
        if self.state in ("draining", "leaving"):
            return []
        self.state = "stopped"
        return [Emit(Notice("left", self.rank, "not online"))]

    def _goodbye(self, now: float) -> list[Output]:
        if self.rank == 0 or not self._parent_id:
            self.state = "stopped"
            return [Emit(Notice("drained", self.rank, None)), Emit(Notice("left", self.rank, 0))]
        self.state = "leaving"
        return [Emit(Notice("drained", self.rank, None)),
                self._up(Request("overlay.goodbye", None, NODEID_ANY,
                                 self._tag("overlay.goodbye"), routes=(),
                                 rolemask=Role.OWNER), now)]

    def rpc(self, topic: str, payload: Optional[bytes], nodeid: int, now: float,
            flags: int = 0) -> tuple[int, list[Output]]:
        """A request of this rank, routed as a flux-core broker routes its own; its
        matchtag (0: NORESPONSE)."""
        if self.state not in ("online", "draining"):
            raise FluxStateError("the rank is not online in the flux-core tree")
        if nodeid == NODEID_UPSTREAM:
            nodeid, flags = self.rank, flags | _UPSTREAM
        tag = 0 if flags & _NORESPONSE else self._tag(topic)
        request = Request(topic, payload, nodeid, tag, flags, (), self.userid, Role.OWNER)
        return tag, self._route(request, (), None, now)

    def publish(self, topic: str, payload: Optional[bytes], now: float) -> list[Output]:
        """An event of rank 0 to the whole tree (its next sequence number)."""
        if self.rank != 0:
            raise FluxStateError("events are numbered by rank 0: publish through it "
                                 "(rpc event.publish)")
        self._seq += 1
        return self._event(EventMessage(topic, payload, self._seq, routes=()), now)

    def respond(self, request: Request, payload: Optional[bytes], errnum: int,
                now: float) -> list[Output]:
        """Answer ``request`` (delivered earlier) back along its route stack."""
        if request.flags & _NORESPONSE or self.state == "detached":
            return []
        return self._answer(Response(request.topic, payload, errnum, request.matchtag,
                                     request.flags & _STREAMING, request.routes or ()), now)

    def timer(self, now: float) -> list[Output]:
        """A heartbeat when nothing went up for ``heartbeat`` seconds; call every second."""
        if self.rank and self.state in ("online", "draining") and \
                now - self._sent >= self.heartbeat:
            self.stats["heartbeats_sent"] += 1
            return [self._up(Control(ControlType.HEARTBEAT, 0, routes=()), now)]
        return []

    def receive(self, frames: list[bytes], now: float) -> list[Output]:
        """A message from the parent."""
        try:
            message = decode(frames)
        except ProtocolError as exc:
            return self._drop(f"malformed: {exc.reason}")
        stack = message.routes or ()
        if isinstance(message, Response):
            return self._answer(message, now, from_parent=True)
        if isinstance(message, Control):
            if message.ctype == ControlType.DISCONNECT and self.state != "stopped":
                was = self.state
                self.state = "stopped"
                out = self._tell_monitors(now)
                if was == "hello":
                    return out + [Emit(Notice("refused", self.rank, "DISCONNECT: the parent does "
                                         "not know this rank (its configuration or "
                                         "certificate?)"))]
                return out + [Emit(Notice("parent-lost", self.rank, "DISCONNECT"))]
            return []
        if self.state not in ("online", "draining", "leaving"):
            return self._drop(f"a {type(message).__name__} before hello was answered")
        if isinstance(message, EventMessage):
            return self._event(message, now)
        assert isinstance(message, Request)
        return self._route(message, stack, PARENT, now)

    def receive_child(self, identity: bytes, frames: list[bytes], now: float) -> list[Output]:
        """A message from a child (``identity``: its ZeroMQ routing id, its UUID)."""
        try:
            message = decode(frames)
        except ProtocolError as exc:
            return self._drop(f"malformed from a child: {exc.reason}")
        if message.routes is None:
            return self._drop("a message from a child without a route stack")
        child = self._by_uuid.get(identity)
        if child is None or not child.online:
            if isinstance(message, Request) and message.topic == "overlay.hello" \
                    and self.state in ("online", "hello"):
                return self._hello(identity, message, now)
            return [self._down(identity, Control(ControlType.DISCONNECT, 0, routes=()))]
        stack = (identity, *message.routes)
        if isinstance(message, Control):
            if message.ctype == ControlType.STATUS:
                if not FULL <= message.status <= OFFLINE:
                    return self._drop(f"rank {child.rank} sent status {message.status}")
                return self._set_status(child, message.status, "", now)
            if message.ctype == ControlType.HEARTBEAT:
                self.stats["heartbeats_heard"] += 1
            return []
        if isinstance(message, Request):
            if message.topic == "overlay.goodbye":
                out = self.respond(dataclasses.replace(message, routes=stack), None, 0, now)
                return out + self._set_status(child, OFFLINE, "administrative shutdown", now)
            return self._route(message, stack, identity, now)
        if isinstance(message, Response):
            if len(stack) < 2 or stack[1] != self.identity:
                return self._drop(f"a response from rank {child.rank} not through this rank")
            inflight = self._inflight.get(child.rank, {})
            key = (message.matchtag, stack[2:])
            asked = inflight.get(key)
            if asked is not None and (message.errnum or not asked.flags & _STREAMING):
                del inflight[key]
            return self._answer(dataclasses.replace(message, routes=stack[2:]), now)
        assert isinstance(message, EventMessage)     # an unpublished event goes up to rank 0
        if self.rank:
            return [self._up(dataclasses.replace(message, routes=()), now)]
        self._seq += 1
        return self._event(dataclasses.replace(message, seq=self._seq, routes=()), now)

    def child_lost(self, identity: bytes, now: float) -> list[Output]:
        """A send to child ``identity`` found its connection gone."""
        child = self._by_uuid.get(identity)
        if child is None or not child.online:
            return []
        return self._set_status(child, LOST, "lost connection", now)

    @property
    def seq(self) -> int:
        """The sequence number of the last event rank 0 published."""
        return self._seq

    def health(self, now: float) -> dict[str, Any]:
        """``overlay.health``'s answer: this rank's subtree status and its children's."""
        kids = []
        for child in self.children.values():
            entry: dict[str, Any] = {"rank": child.rank, "status": status_name(child.status),
                                     "duration": float(now - child.since)}
            if not child.online and child.error:
                entry["error"] = child.error
            kids.append(entry)
        return {"rank": self.rank, "status": status_name(self.status),
                "duration": float(now - self._since), "children": kids}

    # --- routing ---------------------------------------------------------------------

    def _route(self, request: Request, stack: tuple[bytes, ...], came: Optional[bytes],
               now: float) -> list[Output]:
        """Route ``request`` (its full route stack ``stack``; it ``came`` from PARENT, a
        child's identity, or None: this rank) as flux-core's broker and overlay do."""
        nodeid = request.nodeid
        upstream = bool(request.flags & _UPSTREAM)
        here = dataclasses.replace(request, routes=stack)
        if upstream and nodeid == self.rank:
            return self._forward_up(here, now)
        if (upstream and nodeid != self.rank) or nodeid == NODEID_ANY:
            if self._serves(request.topic):
                return self._serve(here, now)
            if came is PARENT or self.rank == 0:
                return self._no_service(here, now)
            return self._forward_up(here, now)
        if nodeid == self.rank:
            return self._serve(here, now) if self._serves(request.topic) else \
                self._no_service(here, now)
        below = self.tree.toward.get(nodeid)
        if below is not None:
            child = self.children[below]
            if not child.online:
                return self.respond(here, string_payload(
                    f"rank {below} ({child.hostname}) is {status_name(child.status)}"),
                    Errno.EHOSTUNREACH, now)
            if not request.flags & _NORESPONSE:
                inflight = self._inflight.setdefault(below, {})
                if len(inflight) < self.max_inflight:
                    inflight[(request.matchtag, stack)] = here
            return [self._down(child.uuid, dataclasses.replace(
                request, routes=(self.identity, *stack)))]
        if came is PARENT:
            return self.respond(here, None, Errno.EHOSTUNREACH, now)
        return self._forward_up(here, now)

    def _forward_up(self, request: Request, now: float) -> list[Output]:
        if self.rank == 0 or self.state not in ("online", "draining"):
            return self.respond(request, None, Errno.EHOSTUNREACH, now)
        return [self._up(request, now)]

    def _answer(self, response: Response, now: float, from_parent: bool = False
                ) -> list[Output]:
        """Send ``response`` to its next hop: this rank's own RPC (an empty stack), the
        parent (its UUID last) or a child (its identity last, popped for the ROUTER)."""
        stack = response.routes or ()
        if not stack:
            return self._own_response(response, now)
        last = stack[0]
        if not from_parent and self._parent_id and last == self._parent_id:
            return [self._up(response, now)]
        child = self._by_uuid.get(last)
        if child is not None and child.online:
            return [self._down(last, dataclasses.replace(response, routes=stack[1:]))]
        return self._drop(f"a response to {last[:36]!r}, no hop of this rank")

    def _own_response(self, response: Response, now: float) -> list[Output]:
        topic = self.pending.get(response.matchtag)
        if topic != response.topic:
            return self._drop(f"a response to no RPC ({response.matchtag})")
        if response.errnum or not (response.flags & _STREAMING
                                   or response.matchtag == self._watch):
            del self.pending[response.matchtag]
        if topic == "overlay.hello":
            return self._hello_answer(response, now)
        if topic == "overlay.goodbye":
            self.state = "stopped"
            return [Emit(Notice("left", self.rank, response.errnum))]
        if topic == "state-machine.monitor" and self._monitor_tag(response.matchtag):
            try:
                state = int_field(read_json(response.payload), "state", 0, 255)
            except ProtocolError:
                return []          # its end (ENODATA), or a parent that has no such service
            if state >= STATE_SHUTDOWN and self.state == "online":
                return [Emit(Notice("parent-shutdown", self.rank, state)), *self.leave(now)]
            return []
        return [Deliver((0, response))]

    def _hello_answer(self, response: Response, now: float) -> list[Output]:
        if response.errnum:
            self.state = "stopped"
            name = errnos.errorcode.get(response.errnum, str(response.errnum))
            text = (response.payload or b"").rstrip(b"\0").decode("utf-8", "replace")
            return self._tell_monitors(now) + [Emit(Notice(
                "refused", self.rank, f"{name} answering overlay.hello"
                + (f": {text}" if text else "")))]
        try:
            self.parent_uuid = str_field(read_json(response.payload), "uuid", 64)
        except ProtocolError as exc:
            self.state = "stopped"
            return [Emit(Notice("refused", self.rank, f"overlay.hello answer: {exc.reason}"))]
        self._parent_id = self.parent_uuid.encode()
        if self.state == "hello":
            self.state = "online"
        # the subtree's status now (the children that said hello meanwhile)
        # and, as a flux-core broker does, follow the parent's state: it shutting down
        # takes this rank down with it
        self._watch = self._tag("state-machine.monitor")
        monitor = Request("state-machine.monitor", json_payload({"final": STATE_SHUTDOWN}),
                          self.rank, self._watch,
                          _STREAMING | _UPSTREAM, (), self.userid, Role.OWNER)
        out: list[Output] = [self._up(Control(ControlType.STATUS, self.status, routes=()), now),
                             self._up(monitor, now),
                             Emit(Notice("online", self.rank, {"parent": self.parent_uuid,
                                                          "size": self.size}))]
        return out + self._tell_monitors(now)

    def _event(self, event: EventMessage, now: float) -> list[Output]:
        """Deliver an event here and send it to every online child."""
        out: list[Output] = [Deliver((0, event))]
        down = dataclasses.replace(event, routes=())
        for child in self.children.values():
            if child.online:
                out.append(self._down(child.uuid, down))
        return out

    # --- children --------------------------------------------------------------------

    def _hello(self, identity: bytes, request: Request, now: float) -> list[Output]:
        def reply(payload: Optional[bytes], errnum: int) -> Send:  # (not yet a known hop)
            return self._down(identity, Response(request.topic, payload, errnum,
                                                 request.matchtag, 0, request.routes))

        try:
            body = read_json(request.payload)
            rank = int_field(body, "rank", 0)
            version = int_field(body, "version", 0, 0xFFFFFF)
            uuid = str_field(body, "uuid", 64)
            status = int_field(body, "status", 0, 5)
            hostname = body.get("hostname")
        except ProtocolError as exc:
            return [reply(string_payload(exc.reason), Errno.EPROTO)]
        if uuid.encode() != identity:
            return [reply(string_payload("the hello's uuid is not the connection's identity"),
                          Errno.EPROTO)]
        configured = self.hosts[rank] if self.hosts and rank < len(self.hosts) else None
        if isinstance(hostname, str) and configured is not None and hostname != configured:
            return [reply(string_payload(
                f"{configured} is configured as rank {rank}: mismatched config?"), Errno.EINVAL)]
        child = self.children.get(rank)
        if child is None:
            return [reply(string_payload(
                f"rank {rank} is not a child of rank {self.rank}: mismatched config?"),
                Errno.EINVAL)]
        out: list[Output] = []
        if child.online:   # said hello again: it restarted
            out += self._set_status(child, LOST, "reconnected after crash", now)
        mine = self.version
        if (version >> 16 & 0xFF, version >> 8 & 0xFF) != mine[:2]:
            child.error = ("client (%d.%d.%d) version mismatched with server (%d.%d.%d)"
                           % (version >> 16 & 0xFF, version >> 8 & 0xFF, version & 0xFF, *mine))
            return out + [reply(string_payload(child.error), Errno.EINVAL)]
        self._by_uuid.pop(child.uuid, None)
        child.uuid = identity
        self._by_uuid[identity] = child
        out.append(reply(json_payload({"uuid": self.uuid}), 0))
        return out + self._set_status(child, status, "", now)

    def _set_status(self, child: FluxChild, status: int, why: str, now: float
                    ) -> list[Output]:
        out: list[Output] = []
        changed = status != child.status
        if changed:
            child.status, child.since = status, now
            out.append(Emit(Notice("child", child.rank, status_name(status))))
        child.error = why
        if not child.online:
            # what went down to it and is not answered fails now, as flux-core's tracker
            # fails it (EHOSTUNREACH), instead of waiting for ever
            for asked in self._inflight.pop(child.rank, {}).values():
                out += self._answer(Response(
                    asked.topic, string_payload(f"rank {child.rank} ({child.hostname}) is "
                                                f"{status_name(status)}"),
                    Errno.EHOSTUNREACH, asked.matchtag, 0, asked.routes), now)
            self._by_uuid.pop(child.uuid, None)
            self._monitors = [m for m in self._monitors if child.uuid not in (m.routes or ())]
            self._health = [h for h in self._health if child.uuid not in (h.routes or ())]
        mine = subtree_status(list(self.children.values()))
        if mine != self.status:
            self.status, self._since = mine, now
            if self.rank and self.state in ("online", "draining"):
                out.append(self._up(Control(ControlType.STATUS, mine, routes=()), now))
        if changed:
            for waiter in self._health:
                out += self.respond(waiter, json_payload(self.health(now)), 0, now)
        if self.state == "draining" and not any(c.online for c in self.children.values()):
            out += self._goodbye(now)
        return out

    # --- services --------------------------------------------------------------------

    def _serves(self, topic: str) -> bool:
        return topic in SERVICES or topic in self.topics or (
            self.rank == 0 and topic in ROOT_SERVICES)

    def _serve(self, request: Request, now: float) -> list[Output]:
        topic = request.topic
        if topic in self.topics:
            return [Deliver((0, request))]
        try:
            return self._builtin(request, now)
        except ProtocolError as exc:
            return self.respond(request, string_payload(exc.reason), Errno.EPROTO, now)

    def _builtin(self, request: Request, now: float) -> list[Output]:
        topic, stack = request.topic, request.routes or ()
        if topic == "broker.ping":
            return self.respond(request, ping_answer(
                request.payload, stack, self.uuid, self.rank, request.userid,
                request.rolemask), 0, now)
        if topic == "attr.get":
            name = str_field(read_json(request.payload), "name", 128)
            values = {"rank": str(self.rank), "size": str(self.size), "hostname": self.hostname,
                      "version": "%d.%d.%d" % self.version, "broker.uuid": self.uuid}
            if name not in values:
                return self.respond(request, None, Errno.ENOENT, now)
            return self.respond(request, json_payload({"value": values[name], "flags": 1}), 0,
                                now)
        if topic == "overlay.health":
            if request.flags & _STREAMING and not self._keep(self._health, request):
                return self._busy(request, now)
            return self.respond(request, json_payload(self.health(now)), 0, now)
        if topic == "overlay.topology":
            rank = int_field(read_json(request.payload), "rank", 0)
            if rank != self.rank and rank not in self.children:
                return self.respond(request, string_payload(
                    "requested rank is not this broker or its direct child"), Errno.ENOENT, now)
            return self.respond(request, json_payload(self.tree.subtree(rank)), 0, now)
        if topic == "state-machine.monitor":
            if request.flags & _STREAMING and not self._keep(self._monitors, request):
                return self._busy(request, now)
            return self._tell_monitor(request, now)
        if topic == "config.get":
            return self.respond(request, json_payload(self.config), 0, now)
        if topic == "event.publish":
            body = read_json(request.payload)
            event_topic = str_field(body, "topic", 255)
            payload = unb64(body.get("payload"))
            int_field(body, "flags", 0, 0xFF)
            out = self.publish(event_topic, payload, now)
            return out + self.respond(request, json_payload({"seq": self._seq}), 0, now)
        if topic == "log.append":       # a log line of a broker below: at debug, bounded
            self.stats["log_lines"] += 1
            if self.stats["log_lines"] <= 100:
                log.debug("flux-mode rank 0: a log line of %d octets from below",
                          len(request.payload or b""))
            return []
        # groups.update: group membership of the brokers below, which rank 0 does not
        # keep (no flux-core service of rank 0 asks it); it wants no answer
        return []

    def _no_service(self, request: Request, now: float) -> list[Output]:
        text = f"No service matching {request.topic} is registered"
        if self.rank == 0:   # (flux-core's tools print the first 100 or so characters)
            text += f" (a peermesh rank 0 has no {service_of(request.topic)} service)"
        return self.respond(request, string_payload(text), Errno.ENOSYS, now)

    def _keep(self, waiters: list[Request], request: Request) -> bool:
        if len(self._health) + len(self._monitors) >= self.max_waiters:
            return False
        waiters.append(request)
        return True

    def _busy(self, request: Request, now: float) -> list[Output]:
        return self.respond(request, string_payload(
            f"{self.max_waiters} streams kept (max_waiters)"), Errno.EAGAIN, now)

    def _machine_state(self) -> int:
        if self.state == "online":
            return STATE_RUN
        return STATE_JOIN if self.state in ("detached", "hello") else STATE_SHUTDOWN

    def _tell_monitor(self, request: Request, now: float) -> list[Output]:
        state = self._machine_state()
        out = self.respond(request, json_payload({"state": state}), 0, now)
        if state >= STATE_SHUTDOWN and request.flags & _STREAMING:
            out += self.respond(request, None, Errno.ENODATA, now)
        return out

    def _tell_monitors(self, now: float) -> list[Output]:
        """Tell every child's ``state-machine.monitor`` this rank's state (shutting down:
        the stream ends, and the child shuts down and says goodbye)."""
        out: list[Output] = []
        for request in self._monitors:
            out += self._tell_monitor(request, now)
        if self._machine_state() >= STATE_SHUTDOWN:
            self._monitors = []
        return out

    # --- inside ----------------------------------------------------------------------

    def _monitor_tag(self, matchtag: int) -> bool:
        """Whether ``matchtag`` is this rank's own watch of its parent's state (not an RPC
        of the program's to the same topic)."""
        return matchtag == self._watch

    def _tag(self, topic: str) -> int:
        if len(self.pending) >= self.max_pending:
            raise FluxStateError(f"{len(self.pending)} RPCs in flight (max_pending)")
        tag = self._next_tag
        while tag in self.pending or tag == 0:
            tag = tag % 0xFFFFFFFF + 1
        self._next_tag = tag % 0xFFFFFFFF + 1
        self.pending[tag] = topic
        return tag

    def _up(self, message: Any, now: float) -> Send:
        self._sent = now
        return Send(PARENT, encode(message))

    @staticmethod
    def _down(identity: bytes, message: Any) -> Send:
        return Send(identity, [identity, *encode(message)])

    def _drop(self, why: str) -> list[Output]:
        self.stats["dropped"] += 1
        if self.stats["dropped"] <= 100:
            log.debug("flux-mode rank %d dropped a message: %s", self.rank, why)
        return []
