"""Copies of confirmed content between gateways, as sans-io cores: the serving gateway's
replicas and the answers that wait for them (``Replicas``), a standby's copy
(``Follower``), what a gateway is offered (``Offers``).

How it works
------------
A standby gateway that holds a copy of the serving gateway's content and
follows its commits is a *replica* (see ``peermesh.mtl.gateway`` for the
copy and the whispers). After each commit the serving gateway sends its
replicas what the commit wrote, then a numbered *mark* to each; a replica
acknowledges a mark once it has committed everything before it. Answers to
``confirm: full`` links from that commit (a writer's Confirm, a reader's
Content, a Pong) are *held* until one replica acknowledged its mark, so that
a Confirm means the content is committed on two gateways.

``Replicas`` keeps that state and decides; the gateway whispers the marks it
numbers and sends the answers it releases:

* ``hold(answers, now)`` - the marks to send now (one per replica); the
  answers wait in order behind any held before;
* ``acknowledged(peer, number)`` then ``release()`` - the answers that may
  go: those a replica acknowledged, or that no replica in step can any more
  (it stopped being one, or left);
* ``late(now)`` - replicas that left the oldest held mark unanswered for
  ``wait`` seconds: no longer replicas (the gateway tells them to copy
  again), so what they held up can be released.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator, Optional, Protocol, Sequence, TypeVar
from uuid import UUID

from ..errors import ProtocolError
from ..wire.mtl_replication import (CID_BYTES, HANDOFF, Handoff, content_group, decode,
                                    encode_number, split_cids)

__all__ = ["Replicas", "Follower", "Offers", "CopyQueues", "content_group"]

A = TypeVar("A")


class CopyStore(Protocol):
    """What a copy asks of the store (``peermesh.mtl.store.ContentStore``)."""

    def forget(self, cids: list[bytes]) -> int: ...

    def all_cids(self) -> set[bytes]: ...


class CopyQueues(Protocol):
    """The port copies between gateways are stored through
    (``peermesh.mtl.delivery.DurableQueues``)."""

    @property
    def store(self) -> CopyStore: ...

    def received(self, group: str, body: bytes, table: bytes, cid: bytes) -> bool:
        """Store a copy of content ``cid`` unless known; False if it cannot be held."""
        ...


class Replicas:
    """Replicas in step, the marks sent to each standby and acknowledged, held answers."""

    def __init__(self, wait: float) -> None:
        """``wait``: seconds a replica may leave a mark unanswered before it stops being one."""
        self.wait = wait
        self._in_step: set[UUID] = set()
        self._marks: dict[UUID, int] = {}     # last mark numbered for each standby
        self._acks: dict[UUID, int] = {}      # last mark each standby acknowledged
        self._held: deque[tuple[dict[UUID, int], list, float]] = deque()

    # --- who is a replica ---------------------------------------------------------

    def __contains__(self, peer: object) -> bool:
        return peer in self._in_step

    def __iter__(self) -> Iterator[UUID]:
        return iter(list(self._in_step))

    def __len__(self) -> int:
        return len(self._in_step)

    def add(self, peer: UUID) -> None:
        """``peer`` holds a complete copy: it follows every commit from now on."""
        self._in_step.add(peer)

    def discard(self, peer: UUID) -> None:
        """``peer`` is no replica any more (its marks still count if it answers them)."""
        self._in_step.discard(peer)

    def clear(self) -> None:
        """No standby is a replica any more (the gateway stopped serving)."""
        self._in_step.clear()

    def forget(self, peer: UUID) -> None:
        """``peer`` left the mesh: no replica, no marks."""
        self._in_step.discard(peer)
        self._marks.pop(peer, None)
        self._acks.pop(peer, None)

    # --- marks --------------------------------------------------------------------

    def next_mark(self, peer: UUID) -> int:
        """The number of the next mark to send ``peer`` (a replica, or a standby being
        copied)."""
        number = self._marks[peer] = self._marks.get(peer, 0) + 1
        return number

    def acknowledged(self, peer: UUID, number: int) -> None:
        """``peer`` committed everything up to its mark ``number``."""
        if number > self._acks.get(peer, 0):
            self._acks[peer] = number

    def reached(self, peer: UUID, number: int) -> bool:
        """True once ``peer`` acknowledged mark ``number`` (or a later one)."""
        return self._acks.get(peer, 0) >= number

    # --- held answers ---------------------------------------------------------------

    @property
    def holding(self) -> bool:
        """True while some answers wait for a replica."""
        return bool(self._held)

    def hold(self, answers: list[A], now: float) -> dict[UUID, int]:
        """Hold ``answers`` until a replica acknowledges the marks returned (one per
        replica, to send now)."""
        marks = {peer: self.next_mark(peer) for peer in self._in_step}
        self._held.append((marks, answers, now))
        return marks

    def release(self) -> list[list]:
        """The held answers that may go now, oldest first: acknowledged by a replica,
        or waiting for none still in step."""
        out = []
        held = self._held
        while held:
            marks, answers, _ = held[0]
            if not any(self.reached(peer, number) for peer, number in marks.items()) \
                    and any(peer in self._in_step for peer in marks):
                break                              # a replica in step has yet to answer
            held.popleft()
            out.append(answers)
        return out

    def late(self, now: float) -> list[UUID]:
        """Replicas that left the oldest held mark unanswered for ``wait`` seconds: they
        stop being replicas (``release`` may then let answers go)."""
        if not self._held or now - self._held[0][2] < self.wait:
            return []
        slow = [peer for peer, number in self._held[0][0].items()
                if peer in self._in_step and not self.reached(peer, number)]
        for peer in slow:
            self._in_step.discard(peer)
        return slow


class Follower:
    """A standby's side of the copy: it follows one serving gateway (``upstream``).

    ``follow(peer, now)`` starts a copy and gives the number to ask for it with
    (``MTL-SYNC``); then ``copied`` (``MTL-REPL``) and ``forgotten``
    (``MTL-FORGET``) change the store. At each mark the driver checks ``broken``
    (a content before it could not be stored: stop, and tell the serving gateway
    to copy again), then ``complete(copy)`` (the mark that ends the copy asked
    for: what the store holds beyond it was confirmed meanwhile and goes), then
    commits and acknowledges. ``due(now)`` says when to ask again (nothing
    heard since asking) or to give up (silent for ``wait`` seconds)."""

    def __init__(self, queues: CopyQueues, wait: float) -> None:
        self.queues = queues
        self.wait = wait
        #: the serving gateway followed (None: none, or the copy stopped)
        self.upstream: Optional[UUID] = None
        self.broken = False                  # a copied content could not be stored
        self._seen: Optional[set[bytes]] = None   # content ids of the copy under way
        self._number = 0                     # of the copy asked for
        self._asked = self._heard = 0.0

    @property
    def copying(self) -> bool:
        """True from ``follow`` until the copy is complete (or stopped)."""
        return self._seen is not None

    def follow(self, peer: UUID, now: float) -> bytes:
        """Copy from ``peer`` from scratch; the number to ask for the copy with."""
        self.upstream, self._seen, self.broken = peer, set(), False
        self._number += 1
        return self.ask(now)

    def ask(self, now: float) -> bytes:
        """The number of the copy asked for (asked again now)."""
        self._asked = now
        return encode_number(self._number)

    def stop(self) -> None:
        """Follow no one (the copy stopped, or this gateway serves now)."""
        self.upstream = self._seen = None
        self.broken = False

    def heard(self, now: float) -> None:
        """Something came from ``upstream``."""
        self._heard = now

    def lost(self) -> None:
        """A content copied or offered was dropped before it was taken."""
        self.broken = True

    def copied(self, frames: Sequence[bytes]) -> None:
        """Store the contents of an ``MTL-REPL`` (its frames after the first, four per
        content: group, content id, field table, body)."""
        if not frames or len(frames) % 4:
            self.broken = True
            return
        received = self.queues.received
        checked: tuple[bytes, bytes, Optional[str]] = (b"", b"", None)  # (a batch's are alike)
        for at in range(0, len(frames), 4):
            group_bytes, cid, table, body = frames[at:at + 4]
            if (group_bytes, table) != checked[:2]:
                checked = (group_bytes, table, content_group(group_bytes, table))
            group = checked[2] if len(cid) == CID_BYTES else None
            if group is None or not received(group, body, table, cid):
                self.broken = True
            elif self._seen is not None:
                self._seen.add(cid)

    def forgotten(self, blob: bytes) -> None:
        """Delete the contents whose ids an ``MTL-FORGET`` names (confirmed or dropped
        on the serving gateway)."""
        cids = split_cids(blob)
        if cids is not None:
            self.queues.store.forget(cids)

    def complete(self, copy: bytes) -> Optional[int]:
        """A mark naming copy ``copy``: if it ends the copy under way, drop what the store
        holds that the copy did not (confirmed meanwhile) and return how many; else None."""
        if self._seen is None or copy != encode_number(self._number):
            return None
        store = self.queues.store
        stale = store.all_cids() - self._seen
        store.forget(list(stale))
        self._seen = None
        return len(stale)

    def due(self, now: float) -> Optional[str]:
        """While copying: "ask" when nothing came since the copy was asked for, "stalled"
        when ``upstream`` has been silent for ``wait`` seconds (the copy stops); else
        None."""
        if self._seen is None:
            return None
        if self._heard < self._asked:
            return "ask"
        if now - self._heard > self.wait:
            self.stop()
            return "stalled"
        return None


class Offers:
    """What other gateways offer this one (``MTL-HANDOFF``, in batches): stored unless
    known here, and counted, so that a batch is acknowledged only when all of it was."""

    def __init__(self, queues: CopyQueues) -> None:
        self.queues = queues
        self._stored: dict[UUID, int] = {}   # contents stored of the batch under way

    def offered(self, peer: UUID, frames: Sequence[bytes]) -> None:
        """One ``MTL-HANDOFF`` from ``peer`` (its frames after the first: group, id,
        content id, field table, body); an ill-formed one is not counted."""
        try:
            message = decode([HANDOFF, *frames])
        except ProtocolError:
            return
        assert isinstance(message, Handoff)
        self.offer(peer, message)

    def offer(self, peer: UUID, message: Handoff) -> None:
        """One ``MTL-HANDOFF`` from ``peer``, decoded; not counted if its group or field
        table is ill-formed."""
        group = content_group(message.group, message.table)
        if group is not None and self.queues.received(group, message.body, message.table,
                                                      message.cid):
            self._stored[peer] = self._stored.get(peer, 0) + 1

    def ended(self, peer: UUID, count: int) -> bool:
        """``peer``'s batch of ``count`` contents ended: True if all were stored (then the
        batch is acknowledged once committed)."""
        return self._stored.pop(peer, 0) == count

    def lost(self, peer: UUID) -> None:
        """Something ``peer`` offered was dropped before it was taken: its batch fails."""
        self._stored.pop(peer, None)
