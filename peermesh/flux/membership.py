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
from typing import Any, Optional, Protocol

from ..errors import ProtocolError
from ..wire.flux import MAX_RANK, Errno, Request, Response, error_message, read_json
from .bodies import int_field, str_field
from .children import Child
from .directory import Directory, Refusal
from .events import EventLog
from .routing import Routing
from .outputs import IDENTITY_SIZE, PARENT, Dial, Emit, Hangup, Notice, Output
from .settings import FluxSettings, State
from .topology import Topology, TopologyError

__all__ = ["Membership", "MembershipHost", "Child"]

#: answers to a join or hello that asking again cannot change: the peer does not
#: serve the method (ENOSYS) or refuses the body (EPROTO: another protocol or version)
_REFUSALS = frozenset({Errno.ENOSYS, Errno.EPROTO})

#: the core's own requests while joining and attaching
_OWN_RPCS = frozenset({"peermesh.join", "peermesh.hello"})


def _refusal_text(response: Response) -> str:
    """``ENOSYS: No service matching ...``: a refusal's errno name and its message."""
    name = errno.errorcode.get(response.errnum, str(response.errnum))
    text = error_message(response.payload)
    return f"{name} answering {response.topic}" + (f": {text}" if text else "")


class MembershipHost(Protocol):
    """What membership needs of its node (``FluxCore``): who it is, its place in the tree
    (which membership sets), rank 0's directory, the event log, and its life."""

    identity: bytes
    uuid: str
    endpoint: str
    settings: FluxSettings
    topology: Topology
    root: bool
    rank: Optional[int]
    claim: Optional[int]
    size: int
    state: State
    parent_rank: Optional[int]
    bootstrap: list[str]
    ancestors: list[tuple[int, str]]
    children: dict[bytes, Child]
    by_rank: dict[int, bytes]
    directory: Directory
    log: EventLog

    def stop(self, now: float) -> list[Output]:
        """Leave: DISCONNECT to every link."""
        ...

    def wake(self, at: float) -> None:
        """Have ``handle_timer`` called by ``at`` at the latest."""
        ...


class Membership:
    """Joining, attaching and losses of one node (see the module's docstring): the
    candidates tried, the deadline and backoff of the join or hello in progress are its
    own; the node's place in the tree it sets through ``node``, and it asks and answers
    through ``routing``."""

    def __init__(self, node: MembershipHost, routing: Routing) -> None:
        self.node = node
        self.routing = routing
        self.deadline = 0.0  # of the join or hello in progress
        self.backoff = node.settings.retry  # before trying again after a refused join or hello
        self.patience = node.settings.hello_timeout  # for the answer to a join or hello
        self.attempt = 0     # bootstrap endpoint / ancestor tried next
        self.candidates: list[tuple[int, str]] = []
        self.taken: Optional[int] = None  # a rank found taken, for rank 0 to skip
        self.failed: list[int] = []  # candidate parents that did not answer a hello

    def join_request(self, request: Request, now: float) -> list[Output]:
        """Rank 0 gives a rank (claimed or new) and names the parent to attach to."""
        node = self.node
        if not node.root:
            return self.routing.error(request, Errno.EHOSTUNREACH, "only rank 0 gives ranks", now)
        body = read_json(request.payload)
        claim = int_field(body, "rank", -1, node.settings.max_size - 1)
        uuid = str_field(body, "uuid", 64)
        endpoint = str_field(body, "endpoint")
        failed = body.get("failed")
        if isinstance(failed, list):
            for rank in failed[:node.settings.max_ancestors]:
                if isinstance(rank, int) and not isinstance(rank, bool):
                    node.directory.lost(rank)
        link = request.routes   # the connection the join came over, and its way here
        taken = body.get("taken")
        if isinstance(taken, int) and not isinstance(taken, bool):
            node.directory.taken(taken, now, link)
        given = node.directory.give(claim, uuid, endpoint, now, link)
        if isinstance(given, Refusal):
            return self.routing.error(request, given.errnum, given.text, now)
        rank, parent, parent_endpoint = given
        node.size = node.directory.size
        return self.routing.answer(request, {"rank": rank, "parent": parent, "size": node.size,
                                             "endpoint": parent_endpoint,
                                             "topology": str(node.topology)}, now)

    def hello_request(self, request: Request, now: float) -> list[Output]:
        """A node asks to attach as this node's child."""
        node = self.node
        link = request.routes[0] if request.routes else b""
        if len(link) != IDENTITY_SIZE:
            return self.routing.error(request, Errno.EINVAL, "hello comes from a child's link", now)
        if node.state not in (State.ONLINE, State.ATTACHING) or node.rank is None:
            return self.routing.error(request, Errno.EAGAIN, "not in the tree", now)
        body = read_json(request.payload)
        rank = int_field(body, "rank", 1, node.settings.max_size - 1)
        uuid = str_field(body, "uuid", 64)
        endpoint = str_field(body, "endpoint")
        if not node.topology.is_descendant(rank, node.rank):
            return self.routing.error(request, Errno.EINVAL,
                                      f"rank {rank} is not below rank {node.rank}", now)
        old_identity = node.by_rank.get(rank)
        if old_identity is not None and old_identity != link:
            old = node.children[old_identity]
            if old.uuid != uuid and now - old.heard < node.settings.torpid:
                return self.routing.error(request, Errno.EEXIST, f"rank {rank} is attached", now)
            out = self.child_lost(old, now, "replaced by a new hello")
        else:
            out = []
        if link not in node.children and len(node.children) >= node.settings.max_children:
            return out + self.routing.error(request, Errno.ENOSPC, "no room for children", now)
        node.children[link] = Child(link, rank, endpoint, uuid, now, now)
        node.by_rank[rank] = link
        node.size = max(node.size, rank + 1)
        out.append(Emit(Notice("child-attached", rank, endpoint)))
        chain = [[node.rank, node.endpoint]] + [[r, e] for r, e in node.ancestors]
        out += self.routing.answer(request, {"ancestors": chain[:node.settings.max_ancestors],
                                             "seq": node.log.seq, "size": node.size}, now)
        out += self.report_attached(node.children[link], now)
        return out

    def report_attached(self, child: Child, now: float) -> list[Output]:
        """Tell rank 0 where ``child`` listens (once this node is online itself)."""
        node = self.node
        note = {"rank": child.rank, "uuid": child.uuid, "endpoint": child.endpoint}
        if node.root:
            self.note_attached(note)
            return []
        if node.state is not State.ONLINE:
            return []  # reported when this node comes online
        return self.routing.internal_rpc("peermesh.attached", note, 0, now, None)

    def attached_request(self, request: Request, now: float) -> list[Output]:
        """Rank 0 notes where a child of another node listens (``peermesh.attached``)."""
        node = self.node
        if node.root:
            body = read_json(request.payload)
            self.note_attached({"rank": int_field(body, "rank", 1, node.settings.max_size - 1),
                                "uuid": str_field(body, "uuid", 64),
                                "endpoint": str_field(body, "endpoint")})
        return []

    def note_attached(self, body: dict) -> None:
        """Rank 0's directory takes an attached rank's uuid and endpoint."""
        node = self.node
        node.directory.attached(body["rank"], body["uuid"], body["endpoint"])
        node.size = node.directory.size

    def lost_request(self, request: Request, now: float) -> list[Output]:
        """Rank 0 marks a rank lost (``peermesh.lost``): offline, still reserved for it."""
        node = self.node
        if node.root:
            body = read_json(request.payload)
            node.directory.lost(int_field(body, "rank", 1), str_field(body, "uuid", 64), now)
        return []

    def join(self, now: float) -> list[Output]:
        """Ask rank 0 for a rank through the next bootstrap endpoint."""
        node = self.node
        if not node.bootstrap:
            node.state = State.DETACHED
            return [Hangup(PARENT)]
        endpoint = node.bootstrap[self.attempt % len(node.bootstrap)]
        self.attempt += 1
        node.state = State.JOINING
        node.parent_rank = None
        self.deadline = now + self.patience
        self.routing.forget_internal(_OWN_RPCS)
        body: dict[str, Any] = {"rank": -1 if node.claim is None else node.claim,
                                "uuid": node.uuid, "endpoint": node.endpoint}
        if self.taken is not None:
            body["taken"] = self.taken
        if self.failed:
            body["failed"] = self.failed[-node.settings.max_ancestors:]
            self.failed = []
        # a guest identity of its own: the parent's ROUTER (with ROUTER_HANDOVER) never sees
        # this node's identity move from one connection to another
        guest = bytes([node.identity[0] ^ 0xFF]) + node.identity[1:]
        out: list[Output] = [Dial(PARENT, endpoint, guest)]
        self.routing.parent_heard = self.routing.parent_sent = now
        out += self.routing.guest_rpc("peermesh.join", body, 0, now, self._joined)
        return out

    def _joined(self, response: Response, now: float) -> list[Output]:
        node = self.node
        if node.state is not State.JOINING:
            return []
        if response.errnum:
            if response.errnum == Errno.EEXIST and node.claim is not None:
                out: list[Output] = [Emit(Notice("rank-taken", node.claim))]
                node.claim = None
                return out + self.join(now)
            if response.errnum in _REFUSALS:
                return self.refused(now, _refusal_text(response))
            self._retry_soon(now)  # the next endpoint
            return [Emit(Notice("join-failed", -1, response.errnum))]
        try:
            body = read_json(response.payload)
            rank, parent = int_field(body, "rank", 1), int_field(body, "parent", 0)
            endpoint = str_field(body, "endpoint")
            size = int_field(body, "size", 1, MAX_RANK + 1)
            topology = Topology.parse(str_field(body, "topology", 32)) if "topology" in body \
                else node.topology  # (a rank 0 that does not say keeps this node's own)
        except (ProtocolError, TopologyError) as exc:
            return self.routing.drop(PARENT, f"join answer: {exc}")
        node.topology = topology  # the instance's, whatever this node was started with
        node.rank = rank
        node.size = max(node.size, size)
        self.taken = None
        # rank 0 may be another node (or restarted) with numbering of its own: the hello
        # answer gives the sequence to follow from
        node.log.restart()
        self.candidates = [(parent, endpoint)]
        self.attempt = 0
        return self.attach(now)

    def attach(self, now: float) -> list[Output]:
        """Say hello to the next candidate parent; join again when none is left."""
        node = self.node
        if self.attempt >= len(self.candidates):
            node.claim = node.rank
            self.attempt = 0
            return self.join(now)
        parent, endpoint = self.candidates[self.attempt]
        self.attempt += 1
        node.state = State.ATTACHING
        node.parent_rank = None
        self.deadline = now + self.patience
        self.routing.forget_internal(_OWN_RPCS)
        self.routing.parent_heard = self.routing.parent_sent = now
        out: list[Output] = [Dial(PARENT, endpoint, node.identity)]
        out += self.routing.guest_rpc("peermesh.hello", {"rank": node.rank, "uuid": node.uuid,
                                                         "endpoint": node.endpoint},
                                       parent, now, self._helloed)
        return out

    def _helloed(self, response: Response, now: float) -> list[Output]:
        node = self.node
        if node.state is not State.ATTACHING:
            return []
        if response.errnum:
            if response.errnum == Errno.EEXIST:
                self.taken, node.claim = node.rank, None
                self.attempt = 0
                return [Emit(Notice("rank-taken", node.rank or -1))] + self.join(now)
            if response.errnum in _REFUSALS:
                return self.refused(now, _refusal_text(response))
            self._retry_soon(now)  # the next candidate
            return [Emit(Notice("hello-failed", node.rank or -1, response.errnum))]
        try:
            body = read_json(response.payload)
            chain = body.get("ancestors")
            ancestors = [(int_field({"r": r}, "r", 0), str_field({"e": e}, "e"))
                         for r, e in chain or ()]
            seq = int_field(body, "seq", 0, 0xFFFFFFFF)
            size = int_field(body, "size", 1, MAX_RANK + 1)
        except (ProtocolError, TypeError, ValueError):
            return self.attach(now)
        if not ancestors:
            return self.attach(now)
        node.ancestors = ancestors[:node.settings.max_ancestors]
        node.parent_rank = ancestors[0][0]
        node.size = max(node.size, size)
        node.state = State.ONLINE
        node.claim = node.rank
        self.backoff = node.settings.retry
        self.patience = node.settings.hello_timeout
        out: list[Output] = [Emit(Notice("online", node.rank or 0,
                                         {"parent": node.parent_rank, "size": node.size,
                                          "topology": str(node.topology)}))]
        self.failed = []
        for child in list(node.children.values()):
            out += self.report_attached(child, now)
        return out + node.log.attached(seq, now)

    def refused(self, now: float, why: str) -> list[Output]:
        """Joining was refused for good (``_REFUSALS``, or DISCONNECT from the peer
        dialed): stop, with ``Notice("refused", rank, why)``, rather than ask again."""
        node = self.node
        self.routing.forget_internal(_OWN_RPCS)
        return [Emit(Notice("refused", -1 if node.rank is None else node.rank, why)),
                *node.stop(now)]

    def _retry_soon(self, now: float) -> None:
        """A join or hello was refused: try again after the backoff (doubled per refusal, at
        most ``heartbeat``), not at the next tick; the driver wakes at ``next_deadline``."""
        node = self.node
        self.deadline = min(self.deadline, now + self.backoff)
        self.backoff = min(self.backoff * 2, node.settings.heartbeat)
        node.wake(self.deadline)

    def retry(self, now: float) -> list[Output]:
        """The join or hello in progress timed out: the next endpoint or candidate parent."""
        # the next try waits longer for its answer: joins that all time out at once (a
        # loaded rank 0 answering hundreds) must not all be asked again, and again
        s = self.node.settings
        self.patience = min(self.patience * 2, s.hello_timeout + s.heartbeat)
        if self.node.state is State.JOINING:
            return self.join(now)
        if 0 < self.attempt <= len(self.candidates):
            self.failed.append(self.candidates[self.attempt - 1][0])
        return self.attach(now)

    def parent_lost(self, now: float, why: str) -> list[Output]:
        """The parent went: fail what went through it, hello to the next ancestor."""
        node = self.node
        out: list[Output] = [Emit(Notice("parent-lost", node.parent_rank or 0, why))]
        out += self.routing.fail_via(PARENT, f"the parent was lost ({why})")
        self.candidates = node.ancestors[1:]
        self.attempt = 0
        node.parent_rank = None
        return out + self.attach(now)

    def child_lost(self, child: Child, now: float, why: str) -> list[Output]:
        """A child went: fail what went to it, drop what came from it, tell rank 0."""
        node = self.node
        node.children.pop(child.identity, None)
        if node.by_rank.get(child.rank) == child.identity:
            del node.by_rank[child.rank]
        out: list[Output] = [Emit(Notice("child-lost", child.rank, why))]
        out += self.routing.fail_via(child.identity, f"rank {child.rank} was lost ({why})")
        out += self.routing.sender_gone(child.identity, now)
        if node.root:
            node.directory.lost(child.rank, child.uuid, now)
        elif node.state is State.ONLINE:
            out += self.routing.internal_rpc("peermesh.lost",
                                             {"rank": child.rank, "uuid": child.uuid},
                                             0, now, None)
        return out
