"""The NFP client's links as one sans-io core: its broker's and one per worker.

``ClientCore`` is a core of ``peermesh.core`` for the client's one driver.
What arrives on the link ``BROKER`` (the client's DEALER to the elected
broker) is decoded and, if a broker sent it, handed to the client as
``Deliver(msg)`` (RESPONSE, EVENT, OPEN; malformed or foreign messages are
dropped, logged at debug). Every other link is a worker reached without a
broker, named by the worker: its messages, and the timer, go to the client's
``Dispatcher``, whose sends come back as ``Send`` outputs.

Requests sent to the broker have deadlines here too: ``expect(rid, deadline)``
when one is sent, ``settle(rid)`` once answered, and a request still open at
its deadline is handed to the client as ``Deliver(Expired(rid))`` by
``handle_timer``. ``next_deadline()`` is the earlier of the dispatcher's and the
first open request's, so the driver's timer wakes only when something is due
(an answered request costs no wake-up).
"""

from __future__ import annotations

import heapq
import logging
from typing import Hashable, NamedTuple, Optional

from ..core import Deliver, Output
from ..errors import ProtocolError
from ..wire import nfp
from .dispatch import Dispatcher

__all__ = ["ClientCore", "BROKER", "Expired"]

log = logging.getLogger(__name__)

#: the name of the link to the broker (a tuple: no worker's name can equal it)
BROKER = ("broker",)


class Expired(NamedTuple):
    """The broker did not answer request ``rid`` by its deadline."""

    rid: str


class ClientCore:
    """The client's broker link and its brokerless dispatcher, as one core."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        #: requests to the broker still open: rid -> deadline
        self.pending: dict[str, float] = {}
        self._expiry: list[tuple[float, str]] = []   # (deadline, rid), answered ones too

    def expect(self, rid: str, deadline: float) -> None:
        """Request ``rid`` went to the broker: ``Expired(rid)`` at ``deadline`` unless
        settled first."""
        self.pending[rid] = deadline
        heapq.heappush(self._expiry, (deadline, rid))

    def settle(self, rid: str) -> None:
        """Request ``rid`` was answered (or given up): no expiry for it."""
        self.pending.pop(rid, None)

    def receive(self, link: Hashable, frames: list[bytes], now: float) -> list[Output]:
        """A message on the broker link, or from a worker (to the dispatcher)."""
        if link != BROKER:
            return self.dispatcher.receive(link, frames, now)
        try:
            msg = nfp.decode(frames)
        except ProtocolError as exc:
            log.debug("client: dropped a malformed message from the broker: %s", exc.reason)
            return []
        if msg.role is not nfp.BROKER:
            return []
        return [Deliver(msg)]

    def handle_timer(self, now: float) -> list[Output]:
        """The dispatcher's deadlines, then ``Expired`` for each broker request due."""
        out = self.dispatcher.handle_timer(now)
        expiry, pending = self._expiry, self.pending
        while expiry and expiry[0][0] <= now:
            rid = heapq.heappop(expiry)[1]
            if pending.get(rid, now + 1) <= now:
                del pending[rid]
                out.append(Deliver(Expired(rid)))
        return out

    def next_deadline(self) -> Optional[float]:
        """The earlier of the dispatcher's next deadline and the first open request's."""
        expiry, pending = self._expiry, self.pending
        while expiry and expiry[0][1] not in pending:    # answered: forgotten lazily
            heapq.heappop(expiry)
        mine = expiry[0][0] if expiry else None
        theirs = self.dispatcher.next_deadline()
        if mine is None:
            return theirs
        return mine if theirs is None or mine < theirs else theirs
