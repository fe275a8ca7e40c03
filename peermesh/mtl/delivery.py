"""``confirm: full`` for the data flow: content through the durable ``ContentStore``.

How it works
------------
Each mesh group with confirmed content is a durable queue in the store
(``peermesh.mtl.store``): content is handed to one confirmed reader at a
time and deleted when that reader confirms it.

* A writer's content (lease ``confirm: full``) is appended to the group's
  queue, shouted into the group and handed to the gateway's unconfirmed
  readers at once. The writer's Confirm (``multiple``: everything up to the
  highest sequence) goes out only in ``flush``, after the store committed:
  the driver flushes once per batch of commands drained from its sockets
  (group commit), so nothing confirmed is lost when the process dies.
  Content the store cannot hold (``StoreFull``) or whose commit fails is
  rejected (Reject, ``recycle`` false): the writer may send it again.
* A group becomes durable when a confirmed reader summons it (or when the
  store holds content for it at start-up); from then on the group's shouts
  from mesh peers are appended too.
* A confirmed reader holds at most ``window`` unconfirmed contents; it is
  topped up after each Summon, Confirm, Reject and commit. Confirm deletes
  (``multiple`` as the spec says), Reject with ``recycle`` puts content back
  at the head of its queue, Reject without it drops it. When a reader's
  link goes (dead, reconnected, revoked) everything it held goes back.

What was handed out but not confirmed is delivered again, to the same
client after it reconnects or to another reader: at least once, and never
again once its confirm was committed.

Copies from other gateways (``received``): content another gateway handed
over or replicated keeps its content id, and is stored only if the store does
not know it (``ContentStore.knows``: held here, or held and deleted since), so
a second copy, or one of content a reader confirmed, is not stored again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import StoreError
from ..wire.mtl import (EMPTY_TABLE, Confirm, Content, Reject, content_frames, encode_data,
                        encode_table)
from .leases import LeaseLink
from .store import ContentStore, StoreFull

if TYPE_CHECKING:
    from .dataflow import DataFlow

__all__ = ["DurableQueues", "WINDOW"]

log = logging.getLogger(__name__)

#: unconfirmed contents one confirmed reader holds at most
WINDOW = 1000


class DurableQueues:
    """The store-backed side of ``DataFlow`` for leases with ``confirm: full``."""

    def __init__(self, store: ContentStore, window: int = WINDOW) -> None:
        self.store = store
        self.window = window
        #: groups whose shouts are stored
        self.durable: set[str] = set(store.resources())
        #: group -> its confirmed readers
        self.readers: dict[str, dict[LeaseLink, None]] = {}
        #: writer link -> the highest sequence stored and not yet confirmed
        self.unconfirmed: dict[LeaseLink, int] = {}
        self.fresh: set[str] = set()

    def wants(self, key: tuple[str, str]) -> bool:
        """True if shouts into this group are stored."""
        return key[1] in self.durable

    # --- writers ----------------------------------------------------------------

    def written(self, flow: "DataFlow", link: LeaseLink, key: tuple[str, str], command: Content,
                now: float) -> None:
        """Store a writer's content; its Confirm follows the next commit."""
        table = encode_table(command.properties) if command.properties else EMPTY_TABLE
        try:
            self.store.append(key[1], command.body, table)
        except StoreFull as full:
            log.debug("rejected content for %s: %s", key[1], full)
            self._confirm_writer(flow, link)  # (Confirm multiple must not cover the reject)
            flow.sends.append((link.identity, encode_data(Reject(command.sequence))))
            return
        self.unconfirmed[link] = command.sequence
        self.fresh.add(key[1])
        flow.route(key, command.body, None, table)

    def _confirm_writer(self, flow: "DataFlow", link: LeaseLink) -> None:
        if link in self.unconfirmed:
            self.flush(flow)

    def shouted(self, flow: "DataFlow", key: tuple[str, str], body: bytes, table: bytes) -> None:
        """Store a shout into a durable group."""
        try:
            self.store.append(key[1], body, table)
        except StoreFull as full:
            log.debug("dropped a shout into %s: %s", key[1], full)
            return
        self.fresh.add(key[1])

    def flush(self, flow: "DataFlow") -> bool:
        """Commit; then confirm writers and hand fresh content to confirmed readers.
        False if the commit failed (writers get Reject instead)."""
        unconfirmed, self.unconfirmed = self.unconfirmed, {}
        try:
            self.store.commit()
        except StoreError as error:
            log.warning("%s", error)
            for link, sequence in unconfirmed.items():
                flow.sends.append((link.identity, encode_data(Reject(sequence, True))))
            return False
        for link, sequence in unconfirmed.items():
            flow.sends.append((link.identity, encode_data(Confirm(sequence, True))))
        fresh, self.fresh = self.fresh, set()
        for group in fresh:
            for reader in list(self.readers.get(group, ())):
                self.pump(flow, reader)
        return True

    # --- readers ----------------------------------------------------------------

    def summoned(self, flow: "DataFlow", link: LeaseLink, key: tuple[str, str], now: float) -> None:
        """A confirmed reader summoned a group: it becomes durable; hand out what waits."""
        self.durable.add(key[1])
        self.readers.setdefault(key[1], {})[link] = None
        self.pump(flow, link)

    def dismissed(self, flow: "DataFlow", link: LeaseLink, key: tuple[str, str]) -> None:
        """A confirmed reader stopped reading a group (what it holds stays held)."""
        readers = self.readers.get(key[1])
        if readers is not None:
            readers.pop(link, None)
            if not readers:
                del self.readers[key[1]]

    def confirmed(self, flow: "DataFlow", link: LeaseLink, sequence: int, multiple: bool,
                  now: float) -> None:
        """The reader confirmed content: delete it, hand out more."""
        if self.store.confirm(link.grant.token, sequence, multiple):
            self.pump(flow, link)

    def rejected(self, flow: "DataFlow", link: LeaseLink, sequence: int, multiple: bool,
                 recycle: bool, now: float) -> None:
        """The reader rejected content: put it back (``recycle``) or drop it."""
        if self.store.reject(link.grant.token, sequence, multiple, recycle):
            for group in {key[1] for key in link.summoned.values()}:
                for reader in list(self.readers.get(group, ())):
                    self.pump(flow, reader)

    def unbound(self, flow: "DataFlow", link: LeaseLink) -> None:
        """The reader's link went: everything it held goes back to its queues."""
        if self.store.release(link.grant.token):
            self.fresh.update(self.readers)

    def pump(self, flow: "DataFlow", link: LeaseLink) -> None:
        """Hand ``link`` pending content of the groups it summoned, up to the window."""
        token = link.grant.token
        sends = flow.sends
        for name, key in list(link.summoned.items()):
            room = self.window - self.store.held(token)
            if room <= 0:
                return
            deliveries = self.store.take(token, key[1], room)
            for delivery in deliveries:
                sends.append((link.identity, content_frames(
                    delivery.sequence, flow.encoded_name(name), delivery.body,
                    delivery.properties or EMPTY_TABLE)))
            flow.delivered += len(deliveries)

    # --- copies from other gateways -------------------------------------------

    def received(self, group: str, body: bytes, table: bytes, cid: bytes) -> bool:
        """Store a copy of content ``cid`` from another gateway unless it is known here
        (committed by the next ``flush``); False if the store cannot hold it."""
        if self.store.knows(cid):
            return True
        try:
            self.store.append(group, body, table, cid)
        except StoreFull as full:
            log.debug("content for %s from another gateway refused: %s", group, full)
            return False
        self.durable.add(group)
        self.fresh.add(group)
        return True

    def close(self) -> None:
        """Commit what is due and close the store."""
        self.store.close()
