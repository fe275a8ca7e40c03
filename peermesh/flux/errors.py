"""Errors of the Flux overlay."""

from __future__ import annotations

import errno as _errno
import os

from ..errors import PeermeshError

__all__ = ["FluxOverlayError", "FluxError", "FluxStateError"]


class FluxOverlayError(PeermeshError):
    """Base class of the Flux overlay's errors (``FluxError`` is an RPC's own)."""


class FluxError(FluxOverlayError):
    """An RPC failed: ``errnum`` (a Linux errno: ENOSYS 38, EHOSTUNREACH 113, ...) and
    the message the responder sent, if any."""

    def __init__(self, errnum: int, message: str = "", topic: str = "") -> None:
        self.errnum = errnum
        self.message = message or (os.strerror(errnum) if errnum else "")
        self.topic = topic
        name = _errno.errorcode.get(errnum, str(errnum))
        where = f"{topic}: " if topic else ""
        super().__init__(f"{where}{self.message} ({name})")


class FluxStateError(FluxOverlayError):
    """The call needs the overlay in another state (e.g. online) or was misused."""
