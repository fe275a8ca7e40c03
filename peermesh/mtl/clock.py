"""The gateway's clock: its transport's, and how far that is from Unix time.

The MTL cores run on the gateway's transport clock (``transport.now``: on
``peermesh.sim``, virtual time). A user's ``expires`` is a Unix time, so
where a user's validity is checked ``now`` is shifted by ``unix_offset``,
the difference between Unix time and the transport's clock, measured once
when the gateway starts (on the simulator, virtual time then starts at the
Unix time the gateway was set up).
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["unix_offset"]


def unix_offset(now: Callable[[], float]) -> float:
    """Seconds to add to the clock ``now`` to read Unix time."""
    return time.time() - now()
