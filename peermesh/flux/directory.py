"""Rank 0's directory: which ranks are given, where they listen, which parent a newcomer gets.

Pure bookkeeping (no messages, no clock), used by ``FluxCore`` on rank 0.
A rank is given once: to a node that claims it (a static rank) when no
other live node holds it, or as the next rank never given. A given rank
counts as online (usable as a parent: it accepts children while it is
still attaching itself) until it is reported lost or a node could not
reach it. At most ``max_size`` ranks are kept, and rank numbers stay below
``max_size`` too, so no joining node can grow the instance past it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from ..wire.flux import Errno
from .topology import Topology

__all__ = ["Directory", "Member", "Refusal"]


@dataclass(slots=True)
class Member:
    """Rank 0's record of one rank."""

    endpoint: Optional[str]
    uuid: str
    online: bool


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a rank was not given (an errno and a message)."""

    errnum: int
    text: str


class Directory:
    """The ranks of one instance as rank 0 knows them."""

    def __init__(self, topology: Topology, max_size: int, endpoint: str, uuid: str) -> None:
        self.topology = topology
        self.max_size = max_size
        self.members: dict[int, Member] = {0: Member(endpoint, uuid, True)}
        self.size = 1
        self._next = 1

    def get(self, rank: int) -> Optional[Member]:
        return self.members.get(rank)

    def give(self, claim: int, uuid: str, endpoint: str
             ) -> Union[tuple[int, int, str], Refusal]:
        """A rank for a joining node (``claim`` -1: any) and the parent it attaches to:
        ``(rank, parent, parent's endpoint)``, or a ``Refusal``."""
        if claim == 0:
            return Refusal(Errno.EEXIST, "rank 0 is the root")
        if claim >= self.max_size:
            return Refusal(Errno.ENOSPC, f"rank {claim} is past the instance's max_size")
        if claim > 0:
            member = self.members.get(claim)
            if member is not None and member.online and member.uuid not in (uuid, ""):
                return Refusal(Errno.EEXIST, f"rank {claim} is taken")
            rank = claim
        else:
            rank = self._next
            while rank in self.members:
                rank += 1
        if rank >= self.max_size or rank not in self.members and self.full:
            return Refusal(Errno.ENOSPC, "the instance is full (max_size)")
        self._record(rank, Member(endpoint, uuid, True))
        parent = next(a for a in self.topology.ancestors(rank) if self.usable(a))
        return rank, parent, self.members[parent].endpoint or ""

    @property
    def full(self) -> bool:
        return len(self.members) >= self.max_size

    def usable(self, rank: int) -> bool:
        """Whether ``rank`` may be handed out as a parent."""
        member = self.members.get(rank)
        return member is not None and member.online and member.endpoint is not None

    def attached(self, rank: int, uuid: str, endpoint: str) -> None:
        """``rank`` attached to its parent and listens at ``endpoint``."""
        if 0 < rank < self.max_size and (rank in self.members or not self.full):
            self._record(rank, Member(endpoint, uuid, True))

    def taken(self, rank: int) -> None:
        """A live node holds ``rank`` that this directory did not know of."""
        if 0 < rank < self.max_size and rank not in self.members and not self.full:
            self._record(rank, Member(None, "", True))

    def offline(self, limit: int) -> list[int]:
        """The lowest ``limit`` ranks given out and now offline (lost or left)."""
        return sorted(r for r, m in self.members.items() if not m.online)[:limit]

    def lost(self, rank: int, uuid: str = "") -> None:
        """``rank`` was lost (or could not be reached): no longer handed out as a parent."""
        member = self.members.get(rank) if rank else None
        if member is not None and (not uuid or member.uuid in (uuid, "")):
            member.online = False

    def _record(self, rank: int, member: Member) -> None:
        self.members[rank] = member
        self.size = max(self.size, rank + 1)
        self._next = max(self._next, rank + 1)
