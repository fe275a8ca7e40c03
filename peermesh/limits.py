"""Counting what a remote sender pushed past a limit, logged once per interval.

Every bound on what a remote sender controls (services per INTR, NFP
target names, agent connections, ...) reports each refusal to a
``LimitCounter``: the refusal is counted under the limit's name and logged
as a warning at most once per ``interval`` seconds per limit, with how many
refusals the line stands for, so a flood costs one log line per interval,
not one per message. Time is read from ``clock`` unless the caller passes
``now`` (sans-io cores pass the time they were given).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable, Optional

__all__ = ["LimitCounter", "LOG_INTERVAL"]

#: seconds between two log lines about the same limit
LOG_INTERVAL = 10.0


class LimitCounter:
    """Counts refusals per limit name; logs each limit at most once per ``interval``."""

    __slots__ = ("_log", "interval", "_clock", "counts", "_logged_at", "_unlogged")

    def __init__(self, logger: logging.Logger, interval: float = LOG_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self.interval = interval
        self._clock = clock
        #: refusals so far, by limit name
        self.counts: dict[str, int] = {}
        self._logged_at: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def over(self, limit: str, detail: str, now: Optional[float] = None) -> None:
        """Count one refusal under ``limit``; ``detail`` says what was refused and why."""
        self.counts[limit] = self.counts.get(limit, 0) + 1
        unlogged = self._unlogged.get(limit, 0) + 1
        if now is None:
            now = self._clock()
        if now - self._logged_at.get(limit, -math.inf) < self.interval:
            self._unlogged[limit] = unlogged
            return
        self._logged_at[limit] = now
        self._unlogged[limit] = 0
        more = f" ({unlogged} refused since the last report)" if unlogged > 1 else ""
        self._log.warning("limit %s reached: %s%s", limit, detail, more)
