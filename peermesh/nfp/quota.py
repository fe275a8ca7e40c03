"""How many octets of job bodies a worker holds, against its bounds (sans-io).

``Quota`` counts the octets of POST bodies a worker keeps in its store, in all
and (on a mesh with keys) by caller key, and says which bound a new body
would pass: ``max_stored`` or ``max_stored_per_client``. The count is read
from the store at the first POST and kept up to date as jobs are accepted;
when a bound is reached the store is counted again, at most once per
``RECOUNT_EVERY`` seconds of the caller's clock (the retention's purges free
room without telling the worker).
"""

from __future__ import annotations

from typing import Callable, Optional

__all__ = ["Quota", "RECOUNT_EVERY"]

#: seconds between two recounts of the stored octets when a bound is reached
RECOUNT_EVERY = 60.0


class Quota:
    """Octets stored, in all and by key, and the bounds on them."""

    def __init__(self, max_stored: int, max_stored_per_client: int,
                 count: Callable[[], int], count_by: Optional[Callable[[], dict[str, int]]]
                 ) -> None:
        if not max_stored >= 1 or not max_stored_per_client >= 1:
            raise ValueError("max_stored and max_stored_per_client must be at least 1")
        self.max_stored = max_stored
        self.max_stored_per_client = max_stored_per_client
        self._count, self._count_by = count, count_by
        self.stored: Optional[int] = None    # octets in the store (counted when first needed)
        self.stored_by: dict[str, int] = {}  # the same by caller key (a mesh with keys)
        self._recounted = -RECOUNT_EVERY

    def over(self, size: int, caller: Optional[str], now: float) -> Optional[str]:
        """The bound a body of ``size`` octets from key ``caller`` would pass, or None."""
        stored = self.stored
        if caller is None and stored is not None and stored + size <= self.max_stored:
            return None     # the common case, without keys
        if stored is None:
            self._recount()
        over = self._passed(size, caller)
        if over is not None and now - self._recounted >= RECOUNT_EVERY:
            self._recounted = now
            self._recount()
            over = self._passed(size, caller)
        return over

    def held(self, bound: str, caller: Optional[str]) -> tuple[int, int]:
        """(octets held, the bound) for ``bound`` as ``over`` named it."""
        if bound == "max_stored":
            return self.stored or 0, self.max_stored
        return self.stored_by.get(caller or "", 0), self.max_stored_per_client

    def add(self, size: int, caller: Optional[str]) -> None:
        """A body of ``size`` octets from key ``caller`` was stored."""
        self.stored = (self.stored or 0) + size
        if caller is not None:
            self.stored_by[caller] = self.stored_by.get(caller, 0) + size

    def _recount(self) -> None:
        self.stored = self._count()
        if self._count_by is not None:
            self.stored_by = self._count_by()

    def _passed(self, size: int, caller: Optional[str]) -> Optional[str]:
        assert self.stored is not None
        if self.stored + size > self.max_stored:
            return "max_stored"
        if caller is not None and (self.stored_by.get(caller, 0) + size
                                   > self.max_stored_per_client):
            return "max_stored_per_client"
        return None
