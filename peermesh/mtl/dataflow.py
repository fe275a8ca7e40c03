"""The MTL data flow as a sans-io core: leases, links, summon/dismiss, content, heartbeats.

How it works
------------
The control flow grants a lease (``grant``): a random token naming a user,
a profile, a direction (read or write), the resources and the confirm model.
A client opens a data connection (a DEALER to the gateway's data ROUTER) and
presents the token in a Lease command; that binds the connection (a *link*,
keyed by its ROUTER identity) to the lease. Nothing else is accepted from a
connection before a Lease: Summon and Dismiss get Response 403, anything
else is dropped, and no state is kept for it.

Each data command goes through one table, ``HANDLERS``, keyed by the
link's direction (``None`` before a Lease) and the command type::

    (None,  Lease)    bind the lease            -> Response 200 / 403
    (any,   Lease)    a second lease            -> Response 400
    (READ,  Summon)   subscribe to a resource   -> Response 200 / 400
    (READ,  Dismiss)  unsubscribe               -> Response 200 / 400
    (WRITE, Content)  route the content         -> (Reject if it cannot go anywhere)
    (READ,  Confirm)  delivered content is safe -> (no answer)
    (READ,  Reject)   refused content           -> re-sent later when ``recycle``
    (any,   Ping)     heartbeat                 -> Pong
    (None,  Summon/Dismiss)                     -> Response 403
    everything else is dropped silently (the spec's rule for ill-formed input)

Ordering: the core answers in the order it is fed and appends to one outbox,
so a Summon's Response is queued before any Content of that resource, and
after a Dismiss's Response the link is no longer a reader of it.

Routing: readers are indexed by ``(profile, resource)``; the resource of a
mesh lease is the ZRE group (the virtual host's prefix + the name the
client uses). A writer's content goes to every local reader of the key and,
for ``mesh``, out into the group (a ``MeshShout`` action, or with ``batch_shouts``
gathered per group in ``outgoing`` for the driver to shout after the batch);
the driver joins a group while a
local reader summons it (``MeshJoin`` / ``MeshLeave`` actions) and feeds the
group's shouts back through ``shouted``. Unconfirmed content without
properties to a resource the link wrote before is routed on its header's
bytes (``LeaseLink.passthrough``), without decoding it.

Confirmed content (``confirm: full``) goes through a ``DurableQueues``
(``peermesh.mtl.delivery``); without one, ``full`` is not offered.

Time: ``tick(now)`` sends Ping to every link not heard from for
``heartbeat`` seconds, unbinds a link silent for ``heartbeat * liveness``
(its lease survives ``lease_ttl`` more seconds, so a client can reconnect
and present it again) and forgets unbound leases past their expiry. It
returns the next time it wants to be called.

On the core contract (``peermesh.core``): ``receive(identity, frames, now)``
takes one command and returns what it asks for as outputs (``Send`` on the
data mailbox, ``Deliver`` of a mesh action); ``handle_timer`` is ``tick`` and
a ``flush``; ``next_deadline`` is None while no lease is granted;
``end_batch`` commits a batch (``flush``) and returns the Confirms and
contents that waited for it, with what ``outgoing`` gathered
(``Deliver(MeshShouts)``). ``take_command`` is the hot path of a driver that
takes the outputs once per batch (``peermesh.mtl.gatewaycore``). The older
surface (``handle``, ``tick``, ``flush``, ``take``) stays.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Protocol, Union

from ..core import Deliver, Output, Send
from ..errors import ProtocolError
from ..wire.mtl import (COMMAND_HEAD_SIZE, CONTENT_TYPE, EMPTY_TABLE, PING_FRAMES,
                        PONG_FRAMES, Confirm, Content, Direction, Dismiss, Lease, Ping, Reject,
                        Summon, content_frames, decode_data, encode_data, encode_table,
                        response_frames)
from .leases import Grant, LeaseLink
from .profiles import Profile

if TYPE_CHECKING:
    from .credentials import User

__all__ = ["DataFlow", "Grant", "LeaseLink", "Queues", "MeshShout", "MeshShouts", "MeshJoin",
           "MeshLeave", "MeshAction"]

log = logging.getLogger(__name__)

_PING = PING_FRAMES
_PONG = PONG_FRAMES
_HEAD = COMMAND_HEAD_SIZE
_EMPTY_TABLE = EMPTY_TABLE
_PEER_TABLES_MAX = 1024
_NOTHING: list[Output] = []    # (what ``take_command`` returns: never appended to)


def _other(link: Any, frames: list[bytes], now: float) -> list[Output]:
    log.debug("a message on %r, no data connection: dropped", link)
    return _NOTHING


@dataclass(frozen=True, slots=True)
class MeshShout:
    """Shout ``frames`` into mesh group ``group``."""

    group: str
    frames: list[bytes]


@dataclass(frozen=True, slots=True)
class MeshJoin:
    """Join mesh group ``group`` (a local reader summoned it)."""

    group: str


@dataclass(frozen=True, slots=True)
class MeshLeave:
    """Leave mesh group ``group`` (no local reader left)."""

    group: str


@dataclass(frozen=True, slots=True)
class MeshShouts:
    """Shout each of ``bodies`` into mesh group ``group`` (one SHOUT each, in order)."""

    group: str
    bodies: list[bytes]


MeshAction = Union[MeshShout, MeshJoin, MeshLeave]
_Key = tuple[str, str]


class Queues(Protocol):
    """What the data flow asks of its store-backed side for leases with ``confirm: full``
    (``peermesh.mtl.delivery.DurableQueues``, which imports this module)."""

    def wants(self, key: _Key) -> bool:
        """True if shouts into this group are stored."""

    def written(self, flow: "DataFlow", link: LeaseLink, key: _Key, command: Content,
                now: float) -> None:
        """Store a writer's content."""

    def shouted(self, flow: "DataFlow", key: _Key, body: bytes, table: bytes) -> None:
        """Store a shout into a durable group."""

    def summoned(self, flow: "DataFlow", link: LeaseLink, key: _Key, now: float) -> None:
        """A confirmed reader summoned a group."""

    def dismissed(self, flow: "DataFlow", link: LeaseLink, key: _Key) -> None:
        """A confirmed reader stopped reading a group."""

    def confirmed(self, flow: "DataFlow", link: LeaseLink, sequence: int, multiple: bool,
                  now: float) -> None:
        """The reader confirmed content."""

    def rejected(self, flow: "DataFlow", link: LeaseLink, sequence: int, multiple: bool,
                 recycle: bool, now: float) -> None:
        """The reader rejected content."""

    def unbound(self, flow: "DataFlow", link: LeaseLink) -> None:
        """The reader's link went."""

    def flush(self, flow: "DataFlow") -> bool:
        """Commit, then answer; False if the commit failed."""

    def close(self) -> None:
        """Commit what is due and close the store."""


class DataFlow:
    """The gateway's data flow: feed it commands and time, read ``sends`` and ``actions``."""

    def __init__(self, *, still_valid: Callable[["User", float], bool],
                 heartbeat: float = 1.0, liveness: int = 3, lease_ttl: float = 30.0,
                 queues: Optional[Queues] = None, batch_shouts: bool = False) -> None:
        """``batch_shouts``: content into mesh groups is gathered in ``outgoing`` (group ->
        bodies, in order; the driver's hot path) instead of one ``MeshShout`` action each."""
        self.still_valid = still_valid
        #: group -> bodies to shout, one SHOUT each (with ``batch_shouts``)
        self.outgoing: Optional[dict[str, list[bytes]]] = {} if batch_shouts else None
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.lease_ttl = lease_ttl
        self.queues = queues
        self.grants: dict[str, Grant] = {}
        self.links: dict[bytes, LeaseLink] = {}
        #: (profile, resource) -> the links reading it, in summon order
        self.readers: dict[tuple[str, str], dict[LeaseLink, str]] = {}
        self.joined: dict[str, int] = {}
        #: (identity, frames) to send on the data socket, in order
        self.sends: list[tuple[bytes, list[bytes]]] = []
        #: what the driver does on the mesh, in order
        self.actions: list[MeshAction] = []
        self._names: dict[str, bytes] = {}
        self._peer_tables: dict[str, bytes] = {}
        #: contents taken from writers, and sent to readers (``mtl_contents_total``)
        self.received = 0
        self.delivered = 0
        self._deadline: Optional[float] = None   # the next ``tick`` (None: nothing to watch)
        #: what takes messages on links that are no data connection (see ``take_command``)
        self.other: Callable[[Any, list[bytes], float], list[Output]] = _other

    # --- leases (from the control flow) -------------------------------------

    def confirms(self, profile: Profile) -> frozenset[str]:
        """The confirm models ``profile`` offers on this gateway."""
        if self.queues is None:
            return profile.confirms - {"full"}
        return profile.confirms

    def grant(self, session: bytes, user: "User", profile: Profile, namespace: str,
              direction: Direction, resources: tuple[str, ...], confirm: str,
              now: float) -> Grant:
        """A new lease; it expires ``lease_ttl`` seconds from now unless a link binds it."""
        token = secrets.token_urlsafe(18)
        grant = Grant(token, session, user, profile, namespace, direction, resources, confirm,
                      now + self.lease_ttl)
        self.grants[token] = grant
        if self._deadline is None:
            self._deadline = now + self.heartbeat
        return grant

    def revoke(self, token: str) -> None:
        """Forget a lease and unbind its link (the client's next Lease gets 403)."""
        grant = self.grants.pop(token, None)
        if grant is not None and grant.link is not None:
            link = grant.link
            self._unbind(link)
            self.links.pop(link.identity, None)

    def revoke_invalid(self, now: float) -> list[str]:
        """Revoke every lease whose user is no longer valid; the tokens revoked."""
        stale = [g.token for g in self.grants.values() if not self.still_valid(g.user, now)]
        for token in stale:
            self.revoke(token)
        return stale

    # --- data commands ----------------------------------------------------------

    def handle(self, identity: bytes, frames: list[bytes], now: float) -> None:
        """Take one data command from the connection ``identity``."""
        self.handle_batch(((identity, frames),), now)

    def handle_batch(self, batch: Iterable[tuple[bytes, Optional[list[bytes]]]],
                     now: float) -> None:
        """Take data commands ``(identity, frames)`` in order, as read from the data
        socket (frames None: over its limits, dropped). A command that raises (a bug) is
        logged; the others are still taken."""
        take = self.take_command
        for identity, frames in batch:
            if frames is not None:
                take(identity, frames, now)

    def take_command(self, identity: Any, frames: list[bytes], now: float) -> list[Output]:
        """Take one data command from the connection ``identity`` (what it asks for waits
        in ``sends`` and ``actions``; a command that raises, a bug, is logged); returns
        nothing (an empty list). A message on a link that is no connection (not ``bytes``)
        goes to ``other(link, frames, now)``. The ``receive`` of a core that takes the
        outputs once per batch (``peermesh.mtl.gatewaycore``): the hot path."""
        if type(identity) is not bytes:
            return self.other(identity, frames, now)
        link = self.links.get(identity)
        if link is not None:
            link.heard = now
            passthrough = link.passthrough
            if passthrough and len(frames) == 2:
                # the hot path: unconfirmed content to a resource this link wrote
                # before, without properties: routed on the header's bytes, nothing
                # decoded; into a mesh group with no local reader, straight to
                # ``outgoing``
                header, body = frames
                key = passthrough.get(header[_HEAD:]) \
                    if header[:1] == CONTENT_TYPE and len(header) > _HEAD else None
                if key is not None and type(body) is bytes:
                    self.received += 1
                    outgoing = self.outgoing
                    if outgoing is not None and key[0] == "mesh" and key not in self.readers:
                        bodies = outgoing.get(key[1])
                        if bodies is None:
                            outgoing[key[1]] = [body]
                        else:
                            bodies.append(body)
                    else:
                        self.route(key, body, None, _EMPTY_TABLE)
                    return _NOTHING
        try:
            self._command(identity, link, frames, now)
        except Exception:
            log.exception("handling a data command from %r failed", identity[:16])
        return _NOTHING

    def _command(self, identity: bytes, link: Optional[LeaseLink], frames: list[bytes],
                 now: float) -> None:
        """One data command, decoded, to its handler in ``HANDLERS``."""
        try:
            command = decode_data(frames)
        except ProtocolError as error:
            log.debug("dropped an ill-formed data command from %r: %s", identity[:16],
                      error.reason)
            return
        direction = link.grant.direction if link is not None else None
        handler = HANDLERS.get((direction, type(command)))
        if handler is None:
            handler = HANDLERS.get((ANY, type(command)))
        if handler is not None:
            handler(self, identity, link, command, now)

    def _respond(self, identity: bytes, sequence: int, code: int) -> None:
        self.sends.append((identity, response_frames(sequence, code)))

    def _lease(self, identity: bytes, link: Optional[LeaseLink], command: Lease, now: float) -> None:
        grant = self.grants.get(command.lease)
        if grant is None or not self.still_valid(grant.user, now):
            self._respond(identity, command.sequence, 403)
            return
        if grant.link is not None:  # the client reconnected: the new connection takes over
            old = grant.link
            self._unbind(old)
            self.links.pop(old.identity, None)
        link = LeaseLink(identity, grant, now)
        grant.link = link
        self.links[identity] = link
        self._respond(identity, command.sequence, 200)

    def _second_lease(self, identity: bytes, link: Optional[LeaseLink], command: Lease,
                      now: float) -> None:
        self._respond(identity, command.sequence, 400)

    def _not_leased(self, identity: bytes, link: Optional[LeaseLink],
                    command: Union[Summon, Dismiss], now: float) -> None:
        self._respond(identity, command.sequence, 403)

    def _wrong_way(self, identity: bytes, link: Optional[LeaseLink],
                   command: Union[Summon, Dismiss], now: float) -> None:
        self._respond(identity, command.sequence, 400)

    def _key(self, grant: Grant, name: str, write: bool, now: float
             ) -> Optional[tuple[str, str]]:
        """The routing key of resource ``name`` for ``grant``, or None if not allowed."""
        if grant.resources:
            if name not in grant.resources:
                return None
        elif not grant.profile.knows(name):
            return None
        user = grant.user
        if not (user.may_write(name) if write else user.may_read(name)):
            return None
        resource = grant.namespace + name
        if len(resource.encode("utf-8")) > 255:
            return None
        return grant.profile.name, resource

    def _summon(self, identity: bytes, link: LeaseLink, command: Summon, now: float) -> None:
        name = command.resource
        key = None if name in link.summoned else self._key(link.grant, name, False, now)
        if key is None:
            self._respond(identity, command.sequence, 400)
            return
        link.summoned[name] = key
        readers = self.readers.setdefault(key, {})
        readers[link] = name
        self._respond(identity, command.sequence, 200)
        if link.grant.profile.mesh and len(readers) == 1:
            self._join(key[1])
        if link.grant.confirm == "full" and self.queues is not None:
            self.queues.summoned(self, link, key, now)

    def _dismiss(self, identity: bytes, link: LeaseLink, command: Dismiss, now: float) -> None:
        key = link.summoned.pop(command.resource, None)
        if key is None:
            self._respond(identity, command.sequence, 400)
            return
        self._drop_reader(link, key)
        self._respond(identity, command.sequence, 200)

    def _drop_reader(self, link: LeaseLink, key: tuple[str, str]) -> None:
        readers = self.readers.get(key)
        if readers is None:
            return
        readers.pop(link, None)
        if not readers:
            del self.readers[key]
            if link.grant.profile.mesh:
                self._leave(key[1])
        if link.grant.confirm == "full" and self.queues is not None:
            self.queues.dismissed(self, link, key)

    def _join(self, group: str) -> None:
        count = self.joined.get(group, 0)
        self.joined[group] = count + 1
        if not count:
            self.actions.append(MeshJoin(group))

    def _leave(self, group: str) -> None:
        count = self.joined.get(group, 0) - 1
        if count > 0:
            self.joined[group] = count
        else:
            self.joined.pop(group, None)
            self.actions.append(MeshLeave(group))

    def _write(self, identity: bytes, link: LeaseLink, command: Content, now: float) -> None:
        grant = link.grant
        self.received += 1
        name = command.resource
        if not name and len(grant.resources) == 1:
            name = grant.resources[0]
        key = link.writable.get(name)
        if key is None:
            key = self._key(grant, name, True, now) if name else None
            if key is None:
                self.sends.append((identity, encode_data(Reject(command.sequence))))
                return
            if len(link.writable) < 1024:
                link.writable[name] = key
        if grant.confirm == "full" and self.queues is not None:
            self.queues.written(self, link, key, command, now)
            return
        if not command.properties and len(link.passthrough) < 1024:
            # the same header bytes (after the sequence) route alike from now on
            link.passthrough[self.encoded_name(command.resource) + _EMPTY_TABLE] = key
        self.route(key, command.body, command.properties)

    def route(self, key: tuple[str, str], body: bytes, properties: Any,
              table: Optional[bytes] = None) -> None:
        """Hand content to the local readers of ``key`` and, for a mesh profile, the group."""
        if key[0] == "mesh":
            outgoing = self.outgoing
            if outgoing is not None:
                bodies = outgoing.get(key[1])
                if bodies is None:
                    outgoing[key[1]] = [body]
                else:
                    bodies.append(body)
            else:
                self.actions.append(MeshShout(key[1], [body]))
        if key in self.readers:
            self.deliver(key, body, table if table is not None
                         else encode_table(properties) if properties else _EMPTY_TABLE)

    def deliver(self, key: tuple[str, str], body: bytes, table: bytes) -> None:
        """Send content to every local reader of ``key`` (confirmed readers: queued)."""
        readers = self.readers.get(key)
        if not readers:
            return
        sends = self.sends
        for link, name in readers.items():
            if link.grant.confirm == "full":
                continue  # confirmed readers read from their durable queue
            link.sequence += 1
            sends.append((link.identity, content_frames(link.sequence, self.encoded_name(name),
                                                        body, table)))
            self.delivered += 1

    def shouted(self, group: str, frames: list[bytes], peer: str) -> None:
        """A shout from mesh peer ``peer`` (UUID hex) into ``group``: deliver it."""
        key = ("mesh", group)
        if key not in self.readers and (self.queues is None or not self.queues.wants(key)):
            return
        table = self._peer_tables.get(peer)
        if table is None:
            if len(self._peer_tables) >= _PEER_TABLES_MAX:
                self._peer_tables.clear()
            table = self._peer_tables[peer] = encode_table({"peer": peer})
        body = frames[0] if frames else b""
        if len(frames) > 1:
            table = encode_table({"peer": peer, "more": list(frames[1:])})
        if self.queues is not None and self.queues.wants(key):
            self.queues.shouted(self, key, body, table)
        self.deliver(key, body, table)

    def encoded_name(self, name: str) -> bytes:
        """``name`` as a short string (cached)."""
        encoded = self._names.get(name)
        if encoded is None:
            if len(self._names) >= 4096:
                self._names.clear()
            data = name.encode("utf-8")
            encoded = self._names[name] = bytes((len(data),)) + data
        return encoded

    def _confirm(self, identity: bytes, link: LeaseLink, command: Confirm, now: float) -> None:
        if link.grant.confirm == "full" and self.queues is not None:
            self.queues.confirmed(self, link, command.sequence, command.multiple, now)

    def _reject(self, identity: bytes, link: LeaseLink, command: Reject, now: float) -> None:
        if link.grant.confirm == "full" and self.queues is not None:
            self.queues.rejected(self, link, command.sequence, command.multiple,
                                 command.recycle, now)

    def _ping(self, identity: bytes, link: Optional[LeaseLink], command: Any, now: float) -> None:
        self.sends.append((identity, _PONG))

    # --- time -------------------------------------------------------------------

    def _unbind(self, link: LeaseLink) -> None:
        for key in list(link.summoned.values()):
            self._drop_reader(link, key)
        link.summoned.clear()
        grant = link.grant
        if grant.link is link:
            grant.link = None
        if grant.confirm == "full" and self.queues is not None:
            self.queues.unbound(self, link)

    def tick(self, now: float) -> float:
        """Heartbeats, dead links, expired leases; the next time to call ``tick``."""
        dead = now - self.heartbeat * self.liveness
        quiet = now - self.heartbeat
        for identity, link in list(self.links.items()):
            if link.heard < dead:
                log.debug("data link %r silent for %.1f s: unbound", identity[:16],
                          now - link.heard)
                self._unbind(link)
                del self.links[identity]
                link.grant.expires = now + self.lease_ttl
            elif link.heard <= quiet:
                self.sends.append((identity, _PING))
        for token, grant in list(self.grants.items()):
            if grant.link is None and grant.expires <= now:
                del self.grants[token]
        self._deadline = now + self.heartbeat if self.grants or self.links else None
        return now + self.heartbeat

    def flush(self) -> bool:
        """End of a batch: commit confirmed content, confirm writers, top up readers;
        False if the store's commit failed."""
        return self.queues.flush(self) if self.queues is not None else True

    def take(self) -> tuple[list[tuple[bytes, list[bytes]]], list[MeshAction]]:
        """What to send and do now; empties both lists."""
        sends, actions = self.sends, self.actions
        self.sends, self.actions = [], []
        return sends, actions

    # --- the core contract (``peermesh.core``) ------------------------------------

    def receive(self, link: bytes, frames: list[bytes], now: float) -> list[Output]:
        """One data command from the connection ``link``; what to send and do now (the
        batch's commit, and the answers that wait for it, come from ``end_batch``)."""
        self.take_command(link, frames, now)
        return self.outputs() if self.sends or self.actions else []

    def end_batch(self, now: float) -> list[Output]:
        """A batch of commands was taken: commit (``flush``); what to send and do."""
        self.flush()
        return self.outputs(shouts=True)

    def handle_timer(self, now: float) -> list[Output]:
        """``tick`` and ``flush``; what to send and do."""
        self.tick(now)
        self.flush()
        return self.outputs(shouts=True)

    def next_deadline(self) -> Optional[float]:
        """When ``handle_timer`` is next due (None while no lease is granted)."""
        return self._deadline

    def outputs(self, shouts: bool = False) -> list[Output]:
        """What ``take`` gives, as core outputs: with ``shouts`` first what ``outgoing``
        gathered (``Deliver(MeshShouts)``), then ``Send(identity, frames)`` for the data
        mailbox, then ``Deliver(action)`` for the mesh."""
        out: list[Output] = []
        outgoing = self.outgoing
        if shouts and outgoing:
            out += [Deliver(MeshShouts(group, bodies)) for group, bodies in outgoing.items()]
            outgoing.clear()
        sends, actions = self.take()
        if sends:
            out += [Send(identity, frames) for identity, frames in sends]
        if actions:
            out += [Deliver(action) for action in actions]
        return out


ANY = object()
_Handler = Callable[[DataFlow, bytes, Any, Any, float], None]
#: (link direction, or None before a Lease, or ANY) and command type -> handler
HANDLERS: dict[tuple[Any, type], _Handler] = {
    (None, Lease): DataFlow._lease,
    (Direction.READ, Lease): DataFlow._second_lease,
    (Direction.WRITE, Lease): DataFlow._second_lease,
    (Direction.READ, Summon): DataFlow._summon,
    (Direction.READ, Dismiss): DataFlow._dismiss,
    (Direction.WRITE, Summon): DataFlow._wrong_way,
    (Direction.WRITE, Dismiss): DataFlow._wrong_way,
    (None, Summon): DataFlow._not_leased,
    (None, Dismiss): DataFlow._not_leased,
    (Direction.WRITE, Content): DataFlow._write,
    (Direction.READ, Confirm): DataFlow._confirm,
    (Direction.READ, Reject): DataFlow._reject,
    (ANY, Ping): DataFlow._ping,
}
