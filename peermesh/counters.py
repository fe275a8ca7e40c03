"""Counters of what a component refused, dropped or shed, logged at most once a period.

A remote sender can make a node hit its limits as often as it likes, so
hitting one is counted, never logged each time: ``Counters.add`` is a dict
update, and ``report(now)`` (from the owner's timer, with the owner's clock)
logs one line with what moved since the last line, at most once every
``period`` seconds. ``snapshot()`` gives the totals (``Node.stats``).
"""

from __future__ import annotations

import logging
from typing import Iterable, Optional

__all__ = ["Counters", "REPORT_PERIOD"]

#: seconds between two log lines of one ``Counters`` (when anything moved)
REPORT_PERIOD = 10.0


class Counters:
    """Named totals; ``report`` logs what moved since the last report."""

    __slots__ = ("log", "what", "period", "_totals", "_reported", "_next")

    def __init__(self, log: logging.Logger, what: str, names: Iterable[str] = (),
                 period: float = REPORT_PERIOD) -> None:
        self.log = log
        self.what = what
        self.period = period
        self._totals: dict[str, int] = dict.fromkeys(names, 0)  # listed even while 0
        self._reported: dict[str, int] = dict(self._totals)
        self._next: Optional[float] = None

    def add(self, name: str, count: int = 1) -> None:
        """Count ``count`` more of ``name``."""
        self._totals[name] = self._totals.get(name, 0) + count

    def get(self, name: str) -> int:
        """The total of ``name`` so far."""
        return self._totals.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        """Every total so far."""
        return dict(self._totals)

    def report(self, now: float) -> None:
        """Log, at WARNING, what moved since the last report, if ``period`` has passed."""
        if self._next is not None and now < self._next:
            return
        moved = {k: v - self._reported.get(k, 0) for k, v in self._totals.items()
                 if v != self._reported.get(k, 0)}
        if not moved:
            return
        self._reported = dict(self._totals)
        self._next = now + self.period
        self.log.warning("%s: %s", self.what,
                         ", ".join(f"{name} +{count}" for name, count in sorted(moved.items())))
