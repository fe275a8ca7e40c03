"""The data side of one MTL gateway as a sans-io core: its data flow, and the copies of
confirmed content between gateways (the replication of ``peermesh.mtl.gateway``).

How it works
------------
``GatewayCore`` is what the gateway's data mailbox driver
(``peermesh.io.driver.Driver``) serves, on the core contract
(``peermesh.core``). Its links are of three kinds:

* a data connection's routing identity (``bytes``): one data command, taken by
  the ``DataFlow`` while the gateway serves (dropped while it stands by);
* ``Shouted(group, peer)``: a shout the node heard into a mesh group
  (``DataFlow.shouted``);
* a gateway's UUID: one replication whisper from it (``MTL-HANDOFF`` ...,
  ``peermesh.wire.mtl_replication``).

Nothing is answered per message: ``end_batch(now)`` (the driver's
``on_batch_end``) commits once per batch (``DataFlow.flush``: the group
commit behind ``confirm: full``), copies what the commit wrote to the
replicas, and returns what to do, in order: ``Deliver(MeshShouts)`` for what
writers sent into mesh groups, ``Deliver(Whisper)`` for the whispers to
other gateways, ``Send(identity, frames)`` for the data connections (those
to ``confirm: full`` links held until a replica acknowledged the batch's
mark, see ``peermesh.mtl.replication.Replicas``), ``Deliver(action)`` for
joins, leaves and single shouts, and ``Emit("replica")`` when a standby's
copy is complete.

The two conversations between gateways that span several messages are
state here, each with its deadline (``REPLICA_WAIT``) served by
``handle_timer``:

* **joining** (a standby): offer everything the store holds in acknowledged
  ``MTL-HANDOFF`` batches to the serving gateway, then ask it for a copy
  (``MTL-SYNC``, again each heartbeat until the copy starts; ``Follower``);
* **copying** (serving, one per standby that asked): the whole store in
  acknowledged batches (``MTL-REPL`` and ``MTL-MARK``); the last mark names the
  copy, and the standby is a replica from then on.

``handle_timer`` also runs the data flow's heartbeats, drops replicas that
leave a mark unanswered, and looks at the credentials (``credentials_changed``,
a port: users changed, their leases are revoked) every ``REFRESH_EVERY``
seconds. The store (``peermesh.mtl.store``) and the durable queues
(``peermesh.mtl.delivery``) are ports the core is given: it opens no file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Hashable, Optional, Sequence
from uuid import UUID

from ..core import Deliver, Emit, Output, Send
from ..errors import ProtocolError
from ..wire import mtl_replication as repl
from ..wire.mtl_replication import (Forget, Handoff, HandoffEnd, HandoffOk, Mark, MarkOk, Repl,
                                    Resync, Sync)
from .dataflow import DataFlow, MeshShouts
from .replication import CopyQueues, Follower, Offers, Replicas
from .store import ContentStore

__all__ = ["GatewayCore", "Shouted", "Whisper", "HANDOFF_BATCH", "REPLICA_WAIT"]

log = logging.getLogger(__name__)

#: contents per offered or copied batch
HANDOFF_BATCH = 256
#: seconds a batch, a mark or a copy under way may go unanswered
REPLICA_WAIT = 10.0
#: seconds between two looks at the credentials file
REFRESH_EVERY = 1.0
_FORGET_MAX = 4096     # content ids per MTL-FORGET
COPY_BATCH = 256       # contents per MTL-REPL
COPY_BYTES = 4 * 1024 * 1024   # octets per MTL-REPL, roughly (one content may pass it)

_Row = tuple[int, bytes, str, bytes, bytes]
_NOTHING: list[Output] = []    # (what ``receive`` returns: never appended to)
_Sends = list[tuple[bytes, list[bytes]]]


@dataclass(frozen=True, slots=True)
class Shouted:
    """The link of a shout heard into mesh group ``group`` from ``peer`` (UUID hex)."""

    group: str
    peer: str


@dataclass(frozen=True, slots=True)
class Whisper:
    """Whisper ``frames`` to the gateway ``peer`` (a ``Deliver`` item)."""

    peer: UUID
    frames: Sequence[bytes]


@dataclass(slots=True)
class _Transfer:
    """A batched conversation with ``peer``: the store read from ``cursor``; a batch up to
    ``after`` waits for ``awaited`` (an id, or a mark number) until ``deadline``."""

    peer: UUID
    copy: bytes = b""
    cursor: int = 0
    after: int = 0
    awaited: int = 0
    deadline: float = 0.0


class GatewayCore:
    """A gateway's data flow and replication (see the module docstring)."""

    def __init__(self, flow: DataFlow, store: Optional[ContentStore], *, active: bool,
                 queues: Optional[CopyQueues] = None,
                 serving_peer: Callable[[], Optional[UUID]] = lambda: None,
                 credentials_changed: Callable[[], bool] = lambda: False,
                 join: bool = True, name: str = "") -> None:
        """``store`` and ``queues`` (the data flow's durable queues, where copies are stored)
        are ports; ``serving_peer()``: the serving gateway as the node sees it (a standby
        joins it, if ``join``); ``credentials_changed()``: the port that re-reads the
        users."""
        self.flow = flow
        flow.other = self._other
        self.store = store
        self.active = False
        self._serve(active)
        self.serving_peer = serving_peer
        self.credentials_changed = credentials_changed
        self.join = join
        self.name = name
        self.follower = Follower(queues, REPLICA_WAIT) if queues is not None else None
        self.offers = Offers(queues) if queues is not None else None
        #: the standbys copied to, and the answers held for them
        self.replicas = Replicas(REPLICA_WAIT)
        self.copies: dict[UUID, _Transfer] = {}
        self.joining: Optional[_Transfer] = None
        if store is not None:
            store.record = active
        self._out: list[Output] = []
        self._acks: dict[UUID, int] = {}     # handovers to acknowledge after the commit
        self._refresh_at = float("-inf")
        self._deadline: Optional[float] = None

    # --- the core contract ----------------------------------------------------------

    def receive(self, link: Hashable, frames: list[bytes], now: float) -> list[Output]:
        """A data command (``link`` an identity), a shout (``Shouted``) or a whisper from a
        gateway (``link`` its UUID); what it asks for comes from ``end_batch``. (While
        serving, the instance's ``receive`` is ``DataFlow.take_command`` itself, which hands
        the other links to ``_other``: the hot path is one call.)"""
        if type(link) is not bytes:
            return self._other(link, frames, now)
        return _NOTHING      # standing by: data commands are dropped

    def _other(self, link: Hashable, frames: list[bytes], now: float) -> list[Output]:
        if type(link) is Shouted:
            if self.active:
                self.flow.shouted(link.group, frames, link.peer)  # type: ignore[union-attr]
        elif type(link) is UUID:
            self._whispered(link, frames, now)  # type: ignore[arg-type]
        return _NOTHING

    def _serve(self, active: bool) -> None:
        self.active = active
        if active:
            self.receive = self.flow.take_command  # type: ignore[method-assign, assignment]
        else:
            self.__dict__.pop("receive", None)

    def end_batch(self, now: float) -> list[Output]:
        """Commit what the batch brought, copy it to the replicas; everything to do."""
        committed = self._settle(now)
        acks, self._acks = self._acks, {}
        if committed:
            for peer, number in acks.items():
                self._whisper(peer, repl.handoff_ok(number))
        return self._take()

    def handle_timer(self, now: float) -> list[Output]:
        """Credentials, heartbeats, slow replicas, asking for a copy again, the joining and
        copying under way."""
        flow = self.flow
        if now >= self._refresh_at:
            self._refresh_at = now + REFRESH_EVERY
            if self.credentials_changed():
                flow.revoke_invalid(now)
        if self.active:
            flow.tick(now)
            self._settle(now)
            self._drop_slow_replicas(now)
        else:
            follower = self.follower
            if follower is not None and follower.upstream is not None \
                    and follower.due(now) == "ask":
                # the copy has not started: ask again (it may not have been serving yet);
                # one that stalled stopped, and is joined again below
                self._whisper(follower.upstream, repl.sync(follower.ask(now)))
            if self.join:
                self.join_later(now)  # (again, after an offer that stopped)
        joining = self.joining
        if joining is not None and joining.awaited and now >= joining.deadline:
            log.info("offering content to %s stopped: not acknowledged", joining.peer)
            self.joining = None
        for copy in [c for c in self.copies.values() if c.awaited and now >= c.deadline]:
            log.info("copy to %s stopped: not acknowledged", copy.peer)
            self._whisper(copy.peer, repl.resync())
            del self.copies[copy.peer]
        self._deadline = min(now + flow.heartbeat, self._refresh_at)
        return self._take()

    def next_deadline(self) -> Optional[float]:
        """The next heartbeat or look at the credentials (None before ``start``)."""
        return self._deadline

    # --- the gateway's requests ----------------------------------------------------

    def start(self, now: float) -> list[Output]:
        """Begin the timer."""
        self._deadline = now
        return []

    def changed(self, elected: bool, now: float) -> list[Output]:
        """The election changed: serve (``elected``) or stand by; a standby (again) joins
        the serving gateway."""
        if elected != self.active:
            self._serve(elected)
            store = self.store
            if store is not None:
                store.record = elected
                store.committed, store.deleted = [], []
            if self.follower is not None:
                self.follower.stop()
            if not elected:
                flow = self.flow
                for token in list(flow.grants):
                    flow.revoke(token)
                self._settle(now)
                self.copies.clear()
                self.replicas.clear()
                self._release()
        if not elected:
            self.join_later(now)
        return self._take()

    def peer_left(self, peer: UUID) -> list[Output]:
        """A gateway left the mesh: no replica, no copy to it."""
        self.replicas.forget(peer)
        self.copies.pop(peer, None)
        self._release()
        return self._take()

    def lost(self, peer: Optional[UUID]) -> None:
        """A whisper from ``peer`` was dropped before it was taken (a full queue): what it
        belonged to (a copy, an offered batch) fails."""
        if self.follower is not None:
            self.follower.lost()
        if self.offers is not None and peer is not None:
            self.offers.lost(peer)

    def join_later(self, now: float) -> None:
        """Join the serving gateway (offer, then ask for a copy), unless doing so."""
        follower = self.follower
        if self.active or follower is None or self.store is None:
            return
        target = self.serving_peer()
        if target is None or target == follower.upstream or self.joining is not None:
            return
        self.joining = _Transfer(target)
        self._offer(now)

    # --- whispers from other gateways ------------------------------------------------

    def _whispered(self, peer: UUID, frames: list[bytes], now: float) -> None:
        try:
            message = repl.decode(frames)
        except ProtocolError:
            return      # ill-formed: ignored (only gateways send these)
        offers = self.offers
        joining = self.joining
        if isinstance(message, HandoffOk):
            if joining is not None and joining.peer == peer and joining.awaited \
                    and message.number >= joining.awaited:
                joining.cursor, joining.awaited = joining.after, 0
                self._offer(now)
        elif isinstance(message, Handoff):
            if offers is not None:             # (also while not serving: never lost)
                offers.offer(peer, message)
        elif isinstance(message, HandoffEnd):
            if offers is not None and offers.ended(peer, message.count):
                self._acks[peer] = message.last
        elif isinstance(message, Resync) and self.active:
            self.replicas.discard(peer)          # a replica that could not store a copy
            self._release()
        elif isinstance(message, MarkOk):
            self.replicas.acknowledged(peer, message.number)
            copy = self.copies.get(peer)
            if copy is not None and copy.awaited \
                    and self.replicas.reached(peer, copy.awaited):
                copy.cursor, copy.awaited = copy.after, 0
                self._copy(copy, now)
            self._release()
        elif isinstance(message, Sync):
            self._copy_to(peer, message.copy, now)
        elif (follower := self.follower) is not None and peer == follower.upstream \
                and not self.active:
            follower.heard(now)
            if isinstance(message, Repl):
                follower.copied(message.frames)
            elif isinstance(message, Forget):
                follower.forgotten(message.blob)
            elif isinstance(message, Mark):
                self._marked(follower, peer, message.number, message.copy)
            elif isinstance(message, Resync):
                follower.stop()

    def _marked(self, follower: Follower, peer: UUID, number: bytes, copy: bytes) -> None:
        """A mark from the serving gateway: commit what came before it, acknowledge it."""
        if follower.broken:                   # something before the mark was not stored
            log.info("MTL gateway %s: a copied content could not be stored; copying again",
                     self.name)
            self._whisper(peer, repl.resync())
            follower.stop()
            return
        dropped = follower.complete(copy)
        if dropped is not None:               # the copy asked for is complete
            log.info("MTL gateway %s: a replica of the serving gateway (%d dropped as "
                     "confirmed there)", self.name, dropped)
            self._out.append(Emit("replica"))
        if self.flow.flush():
            self._whisper(peer, repl.mark_ok(number))

    # --- a standby joins the serving gateway ----------------------------------------

    def _offer(self, now: float) -> None:
        """Offer the next batch of the store to the gateway joined, or (all offered) ask it
        for a copy."""
        joining, store = self.joining, self.store
        assert joining is not None and store is not None
        while not self.active:
            rows, after = store.snapshot(joining.cursor, HANDOFF_BATCH)
            if after == joining.cursor:
                break
            if rows:
                target = joining.peer
                for number, cid, group, table, body in rows:
                    self._whisper(target, repl.handoff(group, number, cid, table, body))
                self._whisper(target, repl.handoff_end(rows[-1][0], len(rows)))
                joining.after, joining.awaited = after, rows[-1][0]
                joining.deadline = now + REPLICA_WAIT
                return
            joining.cursor = after
        self.joining = None
        if not self.active and self.follower is not None:
            self._whisper(joining.peer, repl.sync(self.follower.follow(joining.peer, now)))

    # --- the serving gateway copies its store to a standby ---------------------------

    def _copy_to(self, peer: UUID, copy: bytes, now: float) -> None:
        """A standby asked for a copy: send it (unless not serving, or sending it)."""
        if not self.active or self.store is None:
            return
        old = self.copies.get(peer)
        if old is not None and old.copy == copy:
            return                            # asked again: under way
        self.replicas.discard(peer)
        transfer = self.copies[peer] = _Transfer(peer, copy)
        self._copy(transfer, now)

    def _copy(self, copy: _Transfer, now: float) -> None:
        """Send the next batch of the copy and its mark, or (all sent) the mark that ends
        the copy: the standby is a replica from then on."""
        store = self.store
        assert store is not None
        if not self.active:
            return
        peer = copy.peer
        rows, after = store.snapshot(copy.cursor, HANDOFF_BATCH)
        if after == copy.cursor:          # all sent: what commits from now on goes live
            self.replicas.add(peer)
            self._mark(peer, copy.copy)
            del self.copies[peer]
            log.info("MTL gateway %s: %s holds a copy", self.name, peer)
            return
        self._send_copies([peer], rows)
        copy.after, copy.awaited = after, self._mark(peer)
        copy.deadline = now + REPLICA_WAIT

    def _send_copies(self, peers: Sequence[UUID], rows: list[_Row]) -> None:
        """Whisper ``rows`` to ``peers`` in ``MTL-REPL`` messages of up to ``COPY_BATCH``
        contents and about ``COPY_BYTES`` octets."""
        for frames in repl.repl_batches(rows, COPY_BATCH, COPY_BYTES):
            for peer in peers:
                self._whisper(peer, frames)

    def _mark(self, peer: UUID, copy: bytes = b"", number: int = 0) -> int:
        """Whisper ``peer`` its next mark (or mark ``number``); its number."""
        number = number or self.replicas.next_mark(peer)
        self._whisper(peer, repl.mark(number, copy))
        return number

    # --- commits and the answers that wait for a replica ------------------------------

    def _settle(self, now: float) -> bool:
        """Flush the data flow (commit), copy what changed to the replicas, queue the
        outputs; False if the commit failed."""
        flow = self.flow
        committed = flow.flush()
        out = self._out
        outgoing = flow.outgoing
        if outgoing:
            out += [Deliver(MeshShouts(group, bodies)) for group, bodies in outgoing.items()]
            outgoing.clear()
        sends, actions = flow.take()
        store = self.store
        if store is not None and store.record and (store.committed or store.deleted):
            new, store.committed = store.committed, []
            gone, store.deleted = store.deleted, []
            sends = self._replicate(new, gone, sends, now)
        elif self.replicas.holding and sends:
            sends = self._replicate([], [], sends, now)
        if sends:
            out += [Send(identity, frames) for identity, frames in sends]
        if actions:
            out += [Deliver(action) for action in actions]
        return committed

    def _replicate(self, new: list[_Row], gone: list[bytes], sends: _Sends, now: float
                   ) -> _Sends:
        """Copy a commit to the replicas; the sends that may go now (the others are held
        until a replica acknowledged)."""
        for frames in repl.forget_batches(gone, _FORGET_MAX):
            for peer in (*self.replicas, *self.copies):
                self._whisper(peer, frames)
        replicas = list(self.replicas)
        if not replicas:
            return sends
        self._send_copies(replicas, new)
        links = self.flow.links
        now_: _Sends = []
        later: _Sends = []
        for send in sends:
            link = links.get(send[0])
            (later if link is not None and link.grant.confirm == "full" else now_).append(send)
        if later:
            for peer, number in self.replicas.hold(later, now).items():
                self._mark(peer, number=number)
        return now_

    def _release(self) -> None:
        """Send the held answers a replica acknowledged (or that no replica can)."""
        for sends in self.replicas.release():
            self._out += [Send(identity, frames) for identity, frames in sends]

    def _drop_slow_replicas(self, now: float) -> None:
        """Replicas that left a mark unanswered for ``REPLICA_WAIT`` stop being ones."""
        for peer in self.replicas.late(now):
            log.warning("MTL gateway %s: replica %s did not answer in %g s; it copies "
                        "again", self.name, peer, REPLICA_WAIT)
            self._whisper(peer, repl.resync())
        self._release()

    def _whisper(self, peer: UUID, frames: Sequence[bytes]) -> None:
        self._out.append(Deliver(Whisper(peer, frames)))

    def _take(self) -> list[Output]:
        out = self._out
        if out:
            self._out = []
        return out
