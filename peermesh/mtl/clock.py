"""The gateway's clock: its transport's, read as Unix time.

The MTL cores take ``now`` in Unix seconds (a user's ``expires`` is a Unix
time). ``UnixClock`` is the transport with ``now()`` shifted by the
difference between Unix time and the transport's clock, measured once: its
timers run on the transport's clock (on ``peermesh.sim``, virtual time that
starts at the Unix time the simulation was set up); everything else is the
transport's.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["UnixClock"]


class UnixClock:
    """``transport`` with ``now()`` in Unix seconds (see the module docstring)."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self._now = transport.now
        self.offset = time.time() - transport.now()
        self.sleep = transport.sleep

    def now(self) -> float:
        """The transport's clock, as Unix time."""
        return self._now() + self.offset

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)
