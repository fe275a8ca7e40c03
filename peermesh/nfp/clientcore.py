"""The NFP client's links as one sans-io core: its broker's and one per worker.

``ClientCore`` is a core of ``peermesh.core`` for the client's one driver.
What arrives on the link ``BROKER`` (the client's DEALER to the elected
broker) is decoded and, if a broker sent it, handed to the client as
``Deliver(msg)`` (RESPONSE, EVENT, OPEN; malformed or foreign messages are
dropped, logged at debug). Every other link is a worker reached without a
broker, named by the worker: its messages, and the timer, go to the client's
``Dispatcher``, whose sends come back as ``Send`` outputs.
"""

from __future__ import annotations

import logging
from typing import Hashable, Optional

from ..core import Deliver, Output
from ..errors import ProtocolError
from ..wire import nfp
from .dispatch import Dispatcher

__all__ = ["ClientCore", "BROKER"]

log = logging.getLogger(__name__)

#: the name of the link to the broker (a tuple: no worker's name can equal it)
BROKER = ("broker",)


class ClientCore:
    """The client's broker link and its brokerless dispatcher, as one core."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher

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
        """The dispatcher's deadlines (the broker link has none)."""
        return self.dispatcher.handle_timer(now)

    def next_deadline(self) -> Optional[float]:
        """The dispatcher's next deadline."""
        return self.dispatcher.next_deadline()
