"""How a Flux node finds its place in the tree: joining, attaching, losses, re-attaching.

How it works
------------
Identities and hello. Every node has a random 16-byte identity per start
(its DEALER's routing id). A node joins in two steps, both ordinary Flux
requests from the core's own handle (``@0``):

1. ``peermesh.join`` to rank 0 (``nodeid`` 0), sent from a bootstrap
   endpoint (any member of the instance: a parent list, or the root's
   endpoint from the ZRE mesh) with ``{"rank": R or -1, "uuid", "endpoint"}``.
   Rank 0 answers ``{"rank", "parent", "endpoint", "size", "topology"}``
   (the joining node takes the instance's ``kary:K``): a claimed rank
   R if no other live node holds it (else EEXIST), otherwise the next rank
   never given (ranks grow the instance while it runs: no restart, ``size``
   is the highest rank given + 1); the parent is the nearest formula
   ancestor rank 0 has given out and not heard lost (a parent may still be
   attaching itself: it accepts children already). A node that could reach
   none of its candidate parents says so when it joins again (``failed``),
   and rank 0 passes over those ranks.
2. ``peermesh.hello`` to that parent over a new DEALER, ``{"rank", "uuid",
   "endpoint"}``. The parent accepts a rank below it in the formula tree
   (EEXIST if a live child holds it, ENOSPC past ``max_children``) and
   answers ``{"ancestors": [[rank, endpoint], ...], "seq", "size"}``; it tells
   rank 0 with ``peermesh.attached`` (no response), so rank 0's directory
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
    JOINING,   DISCONNECT from the peer dialed, or       STOPPED     Notice refused (why),
    ATTACHING  ENOSYS / EPROTO answered                              DISCONNECT to all links
    ONLINE     parent lost (DISCONNECT, link down,       ATTACHING   fail RPCs via parent,
               silent for ``lost`` s)                                hello to the grandparent
    any        stop                                      STOPPED     DISCONNECT to all links

A refused join or hello is tried again after ``retry`` seconds, doubled per
refusal up to ``heartbeat``; an unanswered one after ``hello_timeout``, doubled per
try up to ``hello_timeout + heartbeat`` (until online: a rank 0 slow to answer hundreds of
joins at once is not asked again and again). A
refusal that asking again cannot change stops the node instead: the peer
dialed answers DISCONNECT (what a flux-core broker answers a stranger), or
ENOSYS or EPROTO (it does not serve ``peermesh.join``/``peermesh.hello``, or
not in this form or version); ``Notice("refused")`` says which, with the
peer's message.

Leaving and faults. A child that sends DISCONNECT, that a send finds gone
(ROUTER_MANDATORY: at once when its process died), or that is silent for
``lost`` seconds is lost: every request this node forwarded to it is
answered EHOSTUNREACH at once (the child, if alive, fails what it sent
through this node the same way), the requests that came from it are
dropped where they are served: each local service gets
``<service>.disconnect`` with the route stack ``(child,)``, which starts the
stack of everything that came through the child (``FluxHandle`` ends those
streams), and each request it sent on is forgotten and followed along its
link by a ``<service>.disconnect`` with that request's own stack; and rank 0
is told (``peermesh.lost``), which
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
"""

from __future__ import annotations

import errno
from typing import Any, Callable, Optional

from ..errors import ProtocolError
from ..wire.flux import (
    FLAG_NORESPONSE, MAX_RANK, NODEID_ANY, USERID_UNKNOWN, Errno, Request, Response, encode,
    json_payload, error_message, make_request, read_json, service_of,
)
from .bodies import int_field, str_field
from .children import Child
from .directory import Directory, Refusal
from .events import EventLog
from .routing import Routing
from .matchtags import Pending
from .outputs import (
    IDENTITY_SIZE, PARENT, SELF, Deliver, Dial, Emit, Hangup, Notice, Output, Send,
)
from .settings import State
from .topology import Topology, TopologyError

__all__ = ["Membership", "Child"]

#: answers to a join or hello that asking again cannot change: the peer does not
#: serve the method (ENOSYS) or refuses the body (EPROTO: another protocol or version)
_REFUSALS = frozenset({Errno.ENOSYS, Errno.EPROTO})


def _refusal_text(response: Response) -> str:
    """``ENOSYS: No service matching ...``: a refusal's errno name and its message."""
    name = errno.errorcode.get(response.errnum, str(response.errnum))
    text = error_message(response.payload)
    return f"{name} answering {response.topic}" + (f": {text}" if text else "")


class Membership(Routing):
    """Joining, attaching and losses of ``FluxCore`` (see the module's docstring)."""

    log: EventLog
    identity: bytes
    uuid: str
    endpoint: str
    bootstrap: list[str]
    claim: Optional[int]
    ancestors: list[tuple[int, str]]
    directory: Directory
    _attempt: int
    _candidates: list[tuple[int, str]]
    _deadline: float
    _backoff: float
    _patience: float
    _next: float
    _failed: list[int]
    _taken: Optional[int]

    def _join_request(self, request: Request, now: float) -> list[Output]:
        """Rank 0 gives a rank (claimed or new) and names the parent to attach to."""
        if not self.root:
            return self.error(request, Errno.EHOSTUNREACH, "only rank 0 gives ranks", now)
        body = read_json(request.payload)
        claim = int_field(body, "rank", -1, self.settings.max_size - 1)
        uuid = str_field(body, "uuid", 64)
        endpoint = str_field(body, "endpoint")
        failed = body.get("failed")
        if isinstance(failed, list):
            for rank in failed[:self.settings.max_ancestors]:
                if isinstance(rank, int) and not isinstance(rank, bool):
                    self.directory.lost(rank)
        link = request.routes   # the connection the join came over, and its way here
        taken = body.get("taken")
        if isinstance(taken, int) and not isinstance(taken, bool):
            self.directory.taken(taken, now, link)
        given = self.directory.give(claim, uuid, endpoint, now, link)
        if isinstance(given, Refusal):
            return self.error(request, given.errnum, given.text, now)
        rank, parent, parent_endpoint = given
        self.size = self.directory.size
        return self.answer(request, {"rank": rank, "parent": parent, "size": self.size,
                                      "endpoint": parent_endpoint,
                                      "topology": str(self.topology)}, now)

    def _hello_request(self, request: Request, now: float) -> list[Output]:
        """A node asks to attach as this node's child."""
        link = request.routes[0] if request.routes else b""
        if len(link) != IDENTITY_SIZE:
            return self.error(request, Errno.EINVAL, "hello comes from a child's link", now)
        if self.state not in (State.ONLINE, State.ATTACHING) or self.rank is None:
            return self.error(request, Errno.EAGAIN, "not in the tree", now)
        body = read_json(request.payload)
        rank = int_field(body, "rank", 1, self.settings.max_size - 1)
        uuid = str_field(body, "uuid", 64)
        endpoint = str_field(body, "endpoint")
        if not self.topology.is_descendant(rank, self.rank):
            return self.error(request, Errno.EINVAL,
                               f"rank {rank} is not below rank {self.rank}", now)
        old_identity = self.by_rank.get(rank)
        if old_identity is not None and old_identity != link:
            old = self.children[old_identity]
            if old.uuid != uuid and now - old.heard < self.settings.torpid:
                return self.error(request, Errno.EEXIST, f"rank {rank} is attached", now)
            out = self._child_lost(old, now, "replaced by a new hello")
        else:
            out = []
        if link not in self.children and len(self.children) >= self.settings.max_children:
            return out + self.error(request, Errno.ENOSPC, "no room for children", now)
        self.children[link] = Child(link, rank, endpoint, uuid, now, now)
        self.by_rank[rank] = link
        self.size = max(self.size, rank + 1)
        out.append(Emit(Notice("child-attached", rank, endpoint)))
        chain = [[self.rank, self.endpoint]] + [[r, e] for r, e in self.ancestors]
        out += self.answer(request, {"ancestors": chain[:self.settings.max_ancestors],
                                      "seq": self.log.seq, "size": self.size}, now)
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
        return self.internal_rpc("peermesh.attached", note, 0, now, None)

    def _attached_request(self, request: Request, now: float) -> list[Output]:
        if self.root:
            body = read_json(request.payload)
            self._attached({"rank": int_field(body, "rank", 1, self.settings.max_size - 1),
                            "uuid": str_field(body, "uuid", 64),
                            "endpoint": str_field(body, "endpoint")})
        return []

    def _attached(self, body: dict) -> None:
        self.directory.attached(body["rank"], body["uuid"], body["endpoint"])
        self.size = self.directory.size

    def _lost_request(self, request: Request, now: float) -> list[Output]:
        if self.root:
            body = read_json(request.payload)
            self.directory.lost(int_field(body, "rank", 1), str_field(body, "uuid", 64), now)
        return []

    def _join(self, now: float) -> list[Output]:
        """Ask rank 0 for a rank through the next bootstrap endpoint."""
        if not self.bootstrap:
            self.state = State.DETACHED
            return [Hangup(PARENT)]
        endpoint = self.bootstrap[self._attempt % len(self.bootstrap)]
        self._attempt += 1
        self.state = State.JOINING
        self.parent_rank = None
        self._deadline = now + self._patience
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
        out: list[Output] = [Dial(PARENT, endpoint, guest)]
        self._parent_heard = self._parent_sent = now
        out += self._guest_rpc("peermesh.join", body, 0, now, self._joined)
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
                    if p.topic in ("peermesh.join", "peermesh.hello")]:
            state.release(tag)
            self._internal.pop(tag, None)

    def _joined(self, response: Response, now: float) -> list[Output]:
        if self.state is not State.JOINING:
            return []
        if response.errnum:
            if response.errnum == Errno.EEXIST and self.claim is not None:
                out: list[Output] = [Emit(Notice("rank-taken", self.claim))]
                self.claim = None
                return out + self._join(now)
            if response.errnum in _REFUSALS:
                return self._refused(now, _refusal_text(response))
            self._retry_soon(now)  # the next endpoint
            return [Emit(Notice("join-failed", -1, response.errnum))]
        try:
            body = read_json(response.payload)
            rank, parent = int_field(body, "rank", 1), int_field(body, "parent", 0)
            endpoint = str_field(body, "endpoint")
            size = int_field(body, "size", 1, MAX_RANK + 1)
            topology = Topology.parse(str_field(body, "topology", 32)) if "topology" in body \
                else self.topology  # (a rank 0 that does not say keeps this node's own)
        except (ProtocolError, TopologyError) as exc:
            return self._drop(PARENT, f"join answer: {exc}")
        self.topology = topology  # the instance's, whatever this node was started with
        self.rank = rank
        self.size = max(self.size, size)
        self._taken = None
        # rank 0 may be another node (or restarted) with numbering of its own: the hello
        # answer gives the sequence to follow from
        self.log.restart()
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
        self._deadline = now + self._patience
        self._forget_internal()
        self._parent_heard = self._parent_sent = now
        out: list[Output] = [Dial(PARENT, endpoint, self.identity)]
        out += self._guest_rpc("peermesh.hello", {"rank": self.rank, "uuid": self.uuid,
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
                return [Emit(Notice("rank-taken", self.rank or -1))] + self._join(now)
            if response.errnum in _REFUSALS:
                return self._refused(now, _refusal_text(response))
            self._retry_soon(now)  # the next candidate
            return [Emit(Notice("hello-failed", self.rank or -1, response.errnum))]
        try:
            body = read_json(response.payload)
            chain = body.get("ancestors")
            ancestors = [(int_field({"r": r}, "r", 0), str_field({"e": e}, "e"))
                         for r, e in chain or ()]
            seq = int_field(body, "seq", 0, 0xFFFFFFFF)
            size = int_field(body, "size", 1, MAX_RANK + 1)
        except (ProtocolError, TypeError, ValueError):
            return self._attach(now)
        if not ancestors:
            return self._attach(now)
        self.ancestors = ancestors[:self.settings.max_ancestors]
        self.parent_rank = ancestors[0][0]
        self.size = max(self.size, size)
        self.state = State.ONLINE
        self.claim = self.rank
        self._backoff = self.settings.retry
        self._patience = self.settings.hello_timeout
        out: list[Output] = [Emit(Notice("online", self.rank or 0,
                                    {"parent": self.parent_rank, "size": self.size,
                                     "topology": str(self.topology)}))]
        self._failed = []
        for child in list(self.children.values()):
            out += self._report_attached(child, now)
        return out + self.log.attached(seq, now)

    def stop(self, now: float) -> list[Output]:
        raise NotImplementedError  # (FluxCore's)

    def _refused(self, now: float, why: str) -> list[Output]:
        """Joining was refused for good (``_REFUSALS``, or DISCONNECT from the peer
        dialed): stop, with ``Notice("refused", rank, why)``, rather than ask again."""
        self._forget_internal()
        return [Emit(Notice("refused", -1 if self.rank is None else self.rank, why)),
                *self.stop(now)]

    def _retry_soon(self, now: float) -> None:
        """A join or hello was refused: try again after the backoff (doubled per refusal, at
        most ``heartbeat``), not at the next tick; the driver wakes at ``next_deadline``."""
        self._deadline = min(self._deadline, now + self._backoff)
        self._backoff = min(self._backoff * 2, self.settings.heartbeat)
        self._next = min(self._next, self._deadline)

    def _retry(self, now: float) -> list[Output]:
        # the next try waits longer for its answer: joins that all time out at once (a
        # loaded rank 0 answering hundreds) must not all be asked again, and again
        s = self.settings
        self._patience = min(self._patience * 2, s.hello_timeout + s.heartbeat)
        if self.state is State.JOINING:
            return self._join(now)
        if 0 < self._attempt <= len(self._candidates):
            self._failed.append(self._candidates[self._attempt - 1][0])
        return self._attach(now)

    def _parent_lost(self, now: float, why: str) -> list[Output]:
        out: list[Output] = [Emit(Notice("parent-lost", self.parent_rank or 0, why))]
        out += self._fail_via(PARENT, f"the parent was lost ({why})")
        self._candidates = self.ancestors[1:]
        self._attempt = 0
        self.parent_rank = None
        return out + self._attach(now)

    def _sender_gone(self, link: bytes, now: float) -> list[Output]:
        """Disconnects for what came from ``link`` (see the module's docstring)."""
        gone = (link,)
        out: list[Output] = [
            Deliver((handle, make_request(service + ".disconnect", None, NODEID_ANY, 0,
                                         FLAG_NORESPONSE, gone, USERID_UNKNOWN, 0)))
            for service, handle in self.services.items()]
        told: set[tuple[bytes, str, int, tuple[bytes, ...]]] = set()
        for key in [k for k in self._inflight if k[1][:1] == gone]:
            pending = self._inflight.pop(key)
            target, routes, _ = key
            via = self._via.get(target)
            if via is not None:
                via.discard(key)
                if not via:
                    del self._via[target]
            service = service_of(pending.topic)
            if (target, service, pending.nodeid, routes) in told:
                continue
            told.add((target, service, pending.nodeid, routes))
            frames = encode(Request(service + ".disconnect", None, pending.nodeid, 0,
                                    FLAG_NORESPONSE, routes))
            out.append(self._to_parent(frames, now) if target == PARENT
                       else Send(target, [target, *frames]))
        return out

    def _child_lost(self, child: Child, now: float, why: str) -> list[Output]:
        self.children.pop(child.identity, None)
        if self.by_rank.get(child.rank) == child.identity:
            del self.by_rank[child.rank]
        out: list[Output] = [Emit(Notice("child-lost", child.rank, why))]
        out += self._fail_via(child.identity, f"rank {child.rank} was lost ({why})")
        out += self._sender_gone(child.identity, now)
        if self.root:
            self.directory.lost(child.rank, child.uuid, now)
        elif self.state is State.ONLINE:
            out += self.internal_rpc("peermesh.lost", {"rank": child.rank, "uuid": child.uuid},
                                      0, now, None)
        return out
