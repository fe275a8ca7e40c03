"""Counters of what a component refused, dropped or shed, logged at most once a period.

A remote sender can make a component hit its limits as often as it likes, so
hitting one is counted, never logged each time. Two ways in:

* ``add(name)`` only counts (a dict update); the owner's timer calls
  ``report(now)`` with the owner's clock, which logs one line with what moved
  since the last line, at most once every ``period`` seconds (the ZRE node,
  the mailbox guard).
* ``over(name, detail)`` counts one refusal at a bound, keeps ``detail`` (what
  was refused and why) for the next line, and reports at once if the period
  has passed (overlays and the agent, which have no timer of their own).

``snapshot()`` gives the totals (``Node.stats``, ``Worker.stats`` ...).
Lines go out at WARNING, or at ``level`` (malformed input is logged at DEBUG).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, MutableMapping, Optional, TypeVar

__all__ = ["Counters", "REPORT_PERIOD"]

#: seconds between two log lines of one ``Counters`` (when anything moved)
REPORT_PERIOD = 10.0


class Counters:
    """Named totals; ``report`` logs what moved since the last report."""

    __slots__ = ("log", "what", "period", "level", "_clock", "_totals", "_reported", "_details",
                 "_next")

    def __init__(self, log: logging.Logger, what: str, names: Iterable[str] = (),
                 period: float = REPORT_PERIOD,
                 clock: Callable[[], float] = time.monotonic,
                 level: int = logging.WARNING) -> None:
        self.log = log
        self.level = level
        self.what = what
        self.period = period
        self._clock = clock
        self._totals: dict[str, int] = dict.fromkeys(names, 0)  # listed even while 0
        self._reported: dict[str, int] = dict(self._totals)
        self._details: dict[str, str] = {}
        self._next: Optional[float] = None

    def add(self, name: str, count: int = 1) -> None:
        """Count ``count`` more of ``name``."""
        self._totals[name] = self._totals.get(name, 0) + count

    def over(self, name: str, detail: str, now: Optional[float] = None) -> None:
        """Count one refusal at the bound ``name``; ``detail`` says what and why."""
        self._totals[name] = self._totals.get(name, 0) + 1
        self._details[name] = detail
        self.report(self._clock() if now is None else now)

    def get(self, name: str) -> int:
        """The total of ``name`` so far."""
        return self._totals.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        """Every total so far."""
        return dict(self._totals)

    def report(self, now: float) -> None:
        """Log, at ``level``, what moved since the last report, if ``period`` has passed."""
        if self._next is not None and now < self._next:
            return
        moved = {k: v - self._reported.get(k, 0) for k, v in self._totals.items()
                 if v != self._reported.get(k, 0)}
        if not moved:
            return
        self._reported = dict(self._totals)
        self._next = now + self.period
        parts = []
        for name, count in sorted(moved.items()):
            detail = self._details.pop(name, "")
            parts.append(f"{name} +{count}" + (f" (last: {detail})" if detail else ""))
        self.log.log(self.level, "%s: %s", self.what, ", ".join(parts))


_Key = TypeVar("_Key")


def take_one(counts: MutableMapping[_Key, int], key: _Key) -> None:
    """Count one fewer of ``key``, forgetting it at zero (tallies that senders can grow)."""
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]
