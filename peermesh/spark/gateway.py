"""The driver's MTL gateway: executors that cannot join the mesh write into the log through it.

How it works
------------
``start_service(..., gateway=...)`` attaches an 11/MTL ``Gateway``
(``run="always"``) to the driver's node, with a credentials file of its own
holding one user made for the service (a random password, write access to
the logged groups only). ``DriverService.options()`` hands the control
endpoint, that user and its password to Spark's workers (options
``gateway``, ``gatewayUser``, ``gatewayPassword``), as it hands them the
log's token; a write with option ``gateway`` set goes through it
(``executor.GatewayWriter``) instead of a mesh node.

The gateway's ``confirm: full`` side is ``LogQueues``: content a writer
sends into a logged group is not kept in the gateway's content store.
``written`` stages it (and shouts it into the group for its other members:
the driver's node never hears its own shouts, so it is logged once);
``flush``, at the end of each batch of data commands, hands the staged
records and, per writer link, the highest sequence they cover to the
service's ingest thread (``hand``). The ingest appends them to the log in
order with the mesh's shouts and only then calls ``Gateway.answer`` on the
node's hub with the writers' Confirms (``multiple``). So a writer's Confirm
means the content is in the log: nothing confirmed is lost. Content not
confirmed (the driver stopped, the link went) is sent again by the writer
after it reconnects: delivery is at least once across such a failure.
Only ``confirm: full`` leases reach the log (the executors always take
one): content of a ``confirm: none`` lease is only shouted into the group,
which the driver's own node does not hear.

Bounds: content handed to the ingest and not yet appended is at most
``max_pending`` bytes (default 256 MiB); beyond that a writer's content is
rejected with ``recycle`` (the client sends it again), so a burst pushes
back on writers instead of growing memory. Content larger than the log's
largest record, and content for a group the driver does not log, is
rejected without ``recycle``.

Service calls: content to ``remotecalls.CALLS`` is a Safir-Darbaan request,
and a confirmed reader of a ``remotecalls.REPLIES`` queue gets the replies;
``LogQueues`` hands both to the ``CallRelay`` (``relay``) and its calls to
``call`` (``remotecalls.submit`` on the driver's channel) instead of the log.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..mtl.delivery import DurableQueues
from ..wire.mtl import Confirm, Reject, encode_data, encode_table
from .remotecalls import CALLS, Call, CallRelay, is_local

if TYPE_CHECKING:
    from ..mtl.dataflow import DataFlow, LeaseLink
    from ..mtl.store import ContentStore
    from ..wire.mtl import Content

__all__ = ["LogQueues", "HandOver", "Handed", "parse_gateway", "GATEWAY_USER", "MAX_PENDING", "write_patterns",
           "new_password"]

log = logging.getLogger(__name__)

#: the user the service makes for its executors
GATEWAY_USER = "spark-executors"
#: bytes of content handed to the ingest and not yet in the log, at most
MAX_PENDING = 256 * 1024 * 1024

#: one hand-over: log records in order, and (link identity, highest sequence, bytes)
Handed = tuple[list[tuple], list[tuple[bytes, int]], int]


def write_patterns(groups: list[str]) -> list[str]:
    """Credential patterns that match exactly ``groups`` (shell wildcards escaped)."""
    return ["".join(f"[{c}]" if c in "*?[" else c for c in group) for group in groups]


def new_password() -> str:
    """A fresh random password for the service's gateway user."""
    return secrets.token_urlsafe(24)


class LogQueues(DurableQueues):
    """``confirm: full`` into the driver's log (see the module doc)."""

    def __init__(self, store: "ContentStore", *, logged: Callable[[str], bool],
                 hand: Callable[[Handed], None], sender: str, largest: int,
                 stats: Any = None, max_pending: int = MAX_PENDING,
                 relay: Optional[CallRelay] = None,
                 call: Optional[Callable[[Call], None]] = None) -> None:
        """``stats``: the service's ``ServiceStats`` (``gateway_refused`` counts refusals).
        ``relay`` and ``call``: service calls (see the module doc; None: refused)."""
        super().__init__(store)
        self.relay = relay
        self.call = call
        self.logged = logged
        self.hand = hand
        self.sender = sender
        self.largest = largest
        self.max_pending = max_pending
        self._records: list[tuple] = []
        self._confirms: dict[bytes, int] = {}
        self._bytes = 0
        #: bytes handed to the ingest, not yet in the log (written by both threads)
        self._pending = 0
        self._lock = threading.Lock()
        self._headers: dict[str, tuple[str, dict[str, str]]] = {}
        self.stats = stats

    def written(self, flow: "DataFlow", link: "LeaseLink", key: tuple[str, str], command: "Content",
                now: float) -> None:
        """Stage a writer's content for the log; its Confirm follows the append."""
        body = command.body
        group = key[1]
        if group == CALLS and self.relay is not None and self.call is not None:
            sends, call = self.relay.request(link, command, now)
            flow.sends += sends
            if call is not None:
                self.call(call)
            return
        if key[0] != "mesh" or not self.logged(group) or len(body) > self.largest:
            self._refuse(flow, link, command.sequence, False)
            return
        if self._pending + self._bytes + len(body) > self.max_pending:
            self._refuse(flow, link, command.sequence, True)
            return
        user = link.grant.user.name
        sender = self._headers.get(user)
        if sender is None:
            if len(self._headers) >= 1024:
                self._headers.clear()
            sender = self._headers[user] = (f"mtl:{user}", {"X-PM-MTL-USER": user})
        self._records.append((group, self.sender, sender[0], now, body, sender[1]))
        self._bytes += len(body)
        self._confirms[link.identity] = command.sequence
        flow.route(key, body, None, encode_table(command.properties)
                   if command.properties else b"\x00\x00")

    def _refuse(self, flow: "DataFlow", link: "LeaseLink", sequence: int, recycle: bool) -> None:
        if self.stats is not None:
            self.stats.gateway_refused += 1
        flow.sends.append((link.identity, encode_data(Reject(sequence, False, recycle))))

    def flush(self, flow: "DataFlow") -> bool:
        """Commit the store's side; hand what was staged to the ingest."""
        committed = super().flush(flow)
        if self._records:
            records, confirms, size = self._records, self._confirms, self._bytes
            self._records, self._confirms, self._bytes = [], {}, 0
            with self._lock:
                self._pending += size
            self.hand((records, list(confirms.items()), size))
        return committed

    # --- reply queues: the relay's, not the store's --------------------------------

    def summoned(self, flow: "DataFlow", link: "LeaseLink", key: tuple[str, str], now: float) -> None:
        """A reply queue goes to the relay; other groups are the store's."""
        if is_local(key[1]):
            if self.relay is not None:
                self.relay.summoned(link, key[1])
            return
        super().summoned(flow, link, key, now)

    def dismissed(self, flow: "DataFlow", link: "LeaseLink", key: tuple[str, str]) -> None:
        """(See ``summoned``.)"""
        if is_local(key[1]):
            if self.relay is not None:
                self.relay.gone(link)
            return
        super().dismissed(flow, link, key)

    def confirmed(self, flow: "DataFlow", link: "LeaseLink", sequence: int, multiple: bool,
                  now: float) -> None:
        """Replies need no confirm (a lost one is the client's timeout)."""
        if self.relay is None or link not in self.relay.readers:
            super().confirmed(flow, link, sequence, multiple, now)

    def rejected(self, flow: "DataFlow", link: "LeaseLink", sequence: int, multiple: bool,
                 recycle: bool, now: float) -> None:
        """(See ``confirmed``.)"""
        if self.relay is None or link not in self.relay.readers:
            super().rejected(flow, link, sequence, multiple, recycle, now)

    def unbound(self, flow: "DataFlow", link: "LeaseLink") -> None:
        """A link went: a reply queue's replies go nowhere until it is summoned again."""
        if self.relay is not None:
            self.relay.gone(link)
        super().unbound(flow, link)

    def appended(self, handed: Handed, stored: bool) -> list[tuple[bytes, list[bytes]]]:
        """The ingest appended ``handed`` (``stored``) or gave up (stopping): the
        writers' Confirms to send, or nothing (they send again after reconnecting)."""
        with self._lock:
            self._pending -= handed[2]
        if not stored:
            return []
        return [(identity, encode_data(Confirm(sequence, True)))
                for identity, sequence in handed[1]]


class HandOver:
    """What the gateway hands the ingest thread, in order (thread-safe, unbounded here:
    ``LogQueues.max_pending`` bounds it)."""

    def __init__(self) -> None:
        self._items: deque[Handed] = deque()

    def put(self, handed: Handed) -> None:
        """From the node's hub."""
        self._items.append(handed)

    def take(self) -> Optional[Handed]:
        """From the ingest thread: the oldest hand-over, or None."""
        try:
            return self._items.popleft()
        except IndexError:
            return None

    def __len__(self) -> int:
        return len(self._items)


def parse_gateway(value: Any) -> tuple[str, int]:
    """``start_service``'s ``gateway`` as (bind address or "", control port): True (the
    log server's address, any port), ``"HOST"`` or ``"HOST:PORT"``."""
    if value is True:
        return "", 0
    if not isinstance(value, str) or not value:
        raise ValueError(f"gateway must be True, 'HOST' or 'HOST:PORT', not {value!r}")
    host, colon, port = value.rpartition(":")
    if not colon:
        return value, 0
    if not port.isdigit() or not 1 <= int(port) <= 65534:
        raise ValueError(f"gateway port must be 1..65534 (the data port is the next one), "
                         f"not {port!r}")
    return host, int(port)
