"""The driver service's ingest: the node's SHOUTs in its groups (and the MTL gateway's
hand-overs) appended, in arrival order and in batches, to the ``MessageLog``."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Optional

from ..errors import PeermeshError
from ..events import EventType
from .advert import ServiceStats
from .gateway import HandOver
from .log import MessageLog

__all__ = ["Ingest"]

log = logging.getLogger(__name__)

_INGEST_BATCH = 20_000              #: messages appended in one transaction, at most
_INGEST_BYTES = 64 * 1024 * 1024    #: payload bytes appended in one transaction, at most
_RETAIN_EVERY = 1.0                 #: seconds between two retention passes
_POLL_MS = 100
_GATEWAY_POLL_MS = 10   #: with a gateway: how soon its hand-overs are appended, at most


class Ingest:
    """The ingest thread's work for one ``DriverService``: ``run(writer)`` until ``stopping``.

    ``node`` is the started ``ThreadedNode``, ``gateway`` its MTL gateway (or None)
    handing writes over through ``handover``; ``retention`` / ``retention_bytes``
    bound the log at ``path`` (None: no bound).
    """

    def __init__(self, node: Any, gateway: Any, handover: HandOver, stats: ServiceStats,
                 stopping: threading.Event, path: Path, retention: Optional[float],
                 retention_bytes: Optional[int]) -> None:
        self.node = node
        self.gateway = gateway
        self.handover = handover
        self.stats = stats
        self.stopping = stopping
        self.path = path
        self.retention = retention
        self.retention_bytes = retention_bytes

    def run(self, writer: MessageLog) -> None:
        """Append the node's SHOUTs (and the gateway's hand-overs) to ``writer`` until the
        node stops or ``stopping`` is set; closes ``writer``."""
        recv = self.node.recv
        shout, stop, confirm = EventType.SHOUT, EventType.STOP, EventType.CONFIRM
        now = time.time
        stats = self.stats
        largest = writer.max_payload
        senders: dict[Any, tuple[str, dict]] = {}  # peer UUID -> (hex, HELLO headers)
        last_peer: Any = None  # the sender of the last SHOUT (often the next one's too)
        last_sender: tuple[str, dict] = ("", {})
        retain_at = time.monotonic()
        poll = (_POLL_MS if self.gateway is None else _GATEWAY_POLL_MS) / 1000
        try:
            while True:
                if time.monotonic() >= retain_at:
                    self._retain(writer)
                    retain_at = time.monotonic() + _RETAIN_EVERY
                if len(self.handover):
                    self._from_gateway(writer)
                event = recv(poll)
                if event is None:
                    if self.stopping.is_set():
                        return
                    continue
                batch = []
                size = 0
                stopped = False
                confirms = []
                while event is not None:
                    kind = event.type
                    if kind is confirm:  # answered once what came before it is stored
                        confirms.append(event.peer)
                        break
                    if kind is shout:
                        message = event.message
                        if len(message) > largest:
                            stats.rejected += 1
                            _log_rejected(event.group, event.peer, len(message), largest)
                        else:
                            peer = event.peer
                            if peer is last_peer:
                                sender = last_sender
                            else:
                                known = senders.get(peer)
                                if known is None:
                                    if len(senders) > 65536:
                                        senders.clear()
                                    known = senders[peer] = (peer.hex, self._headers_of(peer))
                                last_peer = peer
                                sender = last_sender = known
                            batch.append((event.group, sender[0], event.name, now(), message,
                                          sender[1]))
                            size += len(message)
                            if len(batch) >= _INGEST_BATCH or size >= _INGEST_BYTES:
                                break
                    elif kind is stop:
                        stopped = True
                        break
                    event = recv(0)
                if batch:
                    stats.messages += self._append(writer, batch)
                    stats.batches += 1
                for peer in confirms:
                    self._confirm(peer)
                if stopped:
                    return
        finally:
            writer.close()

    def _from_gateway(self, writer: MessageLog) -> None:
        """Append what the gateway handed over, then confirm it to its writers."""
        gateway = self.gateway
        queues = gateway.data.queues
        handed = self.handover.take()
        while handed is not None:
            records = handed[0]
            stored = self._append(writer, records)
            self.stats.messages += stored
            self.stats.batches += 1
            confirms = queues.appended(handed, stored == len(records))
            if confirms:
                try:
                    self.node.call(lambda node: gateway.answer(confirms))
                except PeermeshError:  # stopping: the writers send it again elsewhere
                    log.debug("could not confirm %d gateway writes", len(records))
            handed = self.handover.take()

    def _confirm(self, peer: Any) -> None:
        """Answer ``peer``'s PING: everything it sent before is in the log."""
        try:
            self.node.call(lambda node: node.confirm(peer))
        except PeermeshError:  # the node is stopping: the peer's flush says False
            log.debug("could not confirm to %s", peer)

    def _headers_of(self, peer: Any) -> dict:
        """The HELLO headers of ``peer`` ({} once it has left)."""
        try:
            return dict(self.node.peer_headers(peer))
        except PeermeshError:
            return {}

    def _append(self, writer: MessageLog, batch: list) -> int:
        """Append ``batch``, retrying what may pass later (a full disk); how many were stored.

        A message SQLite refuses outright (too big, even without its stored
        ``text``) is dropped with a logged reason and never holds up the others.
        """
        delay = 0.05
        texts = True
        while True:
            try:
                writer.append(batch, texts)
                return len(batch)
            except sqlite3.DataError as exc:
                if len(batch) == 1 and texts:
                    texts = False  # its text made it too big: leave the text to readers
                    continue
                if len(batch) == 1:
                    self.stats.rejected += 1
                    record = batch[0]
                    log.warning("a SHOUT to %s from %s (%d bytes) cannot be stored: %s",
                                record[0], record[2], len(record[4]), exc)
                    return 0
                half = len(batch) // 2
                return self._append(writer, batch[:half]) + self._append(writer, batch[half:])
            except Exception:
                # e.g. a full disk: keep the batch, let the node's queue push back on peers
                log.exception("appending %d messages to %s failed; retrying", len(batch),
                              self.path)
                if self.stopping.wait(delay):
                    return 0
                delay = min(delay * 2, 2.0)

    def _retain(self, writer: MessageLog) -> None:
        if self.retention is None and self.retention_bytes is None:
            return
        try:
            self.stats.trimmed += writer.retain(self.retention, self.retention_bytes)
        except sqlite3.Error:
            log.warning("the retention pass over %s failed; trying again later", self.path,
                        exc_info=True)


_last_rejected = 0.0


def _log_rejected(group: str, peer: Any, size: int, largest: int) -> None:
    """Say, at most once a minute, that a SHOUT was too large to store."""
    global _last_rejected
    moment = time.monotonic()
    if moment - _last_rejected >= 60.0:
        _last_rejected = moment
        log.warning("a SHOUT to %s from %s is %d bytes, more than the log can store in one "
                    "row (%d); it was dropped (counted in stats.rejected)", group, peer, size,
                    largest)
