"""Failed-attempt throttling of MTL logins (sans-io: time is passed in).

``Throttle`` (sans-io: time is passed in) counts failed exchanges per user
name *from each client address* and per client address. After ``free``
failures in a row, each further attempt must wait ``base`` seconds, doubling
per failure up to ``max_delay``; a success clears the count of that user from
that address (not the address's); a count is forgotten ``forget`` seconds
after its last failure. A user's count is kept per address so that failures
from one host (an attacker guessing, or failing a user's logins on purpose)
never hold back that user's logins from another host. Each table holds at
most ``max_entries`` keys, evicting the one whose last failure is oldest.
Defaults: a user from one address 5 free, an address 20 free, 1 s doubling
to 60 s, forgotten after 15 minutes, 10,000 entries per table.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["FailureTable", "Throttle"]


@dataclass(slots=True)
class FailureTable:
    """Failed attempts per key (a user name or an address), bounded; see the module doc."""

    free: int = 5
    base: float = 1.0
    max_delay: float = 60.0
    forget: float = 900.0
    max_entries: int = 10_000
    _entries: OrderedDict[str, tuple[int, float]] = field(
        default_factory=OrderedDict, init=False, repr=False)

    def retry_after(self, key: str, now: float) -> float:
        """Seconds until ``key`` may try again (0: now)."""
        entry = self._entries.get(key)
        if entry is None:
            return 0.0
        count, last = entry
        if now - last >= self.forget:
            del self._entries[key]
            return 0.0
        if count < self.free:
            return 0.0
        delay = min(self.max_delay, self.base * 2.0 ** min(count - self.free, 64))
        return max(0.0, last + delay - now)

    def failed(self, key: str, now: float) -> None:
        """Count a failure of ``key`` at ``now``."""
        count, last = self._entries.pop(key, (0, now))
        if now - last >= self.forget:
            count = 0
        self._entries[key] = (count + 1, now)      # (moved to the newest end)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self, key: str) -> None:
        """Forget ``key``'s failures."""
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(slots=True)
class Throttle:
    """Failed-attempt throttling per user name from each client address, and per client
    address (sans-io; see the module doc)."""

    users: FailureTable = field(default_factory=FailureTable)
    addresses: FailureTable = field(default_factory=lambda: FailureTable(free=20))

    @staticmethod
    def user_key(user: str, address: str) -> str:
        """The key of ``user`` from ``address`` in ``users``."""
        return f"{address}\0{user}"

    def retry_after(self, user: Optional[str], address: str, now: float) -> float:
        """Seconds until this user (None: not known yet) from this address may try again."""
        wait = self.addresses.retry_after(address, now)
        if user is None:
            return wait
        return max(wait, self.users.retry_after(self.user_key(user, address), now))

    def failed(self, user: Optional[str], address: str, now: float) -> None:
        """Count a failed attempt."""
        self.addresses.failed(address, now)
        if user is not None:
            self.users.failed(self.user_key(user, address), now)

    def succeeded(self, user: str, address: str) -> None:
        """Clear the count of ``user`` from ``address`` (the address's stays until it is
        forgotten)."""
        self.users.clear(self.user_key(user, address))
