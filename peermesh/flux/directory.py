"""Rank 0's directory: which ranks are given, where they listen, which parent a newcomer gets.

Pure bookkeeping (no messages; time is passed in), used by ``FluxCore`` on
rank 0. A rank is given once: to a node that claims it (a static rank) when
no other live node holds it, or as the lowest rank number free. A given rank
counts as online (usable as a parent: it accepts children while it is
still attaching itself) until it is reported lost or a node could not
reach it. At most ``max_size`` ranks are kept, and rank numbers stay below
``max_size`` too, so no joining node can grow the instance past it.

Joins are bounded so that a stranger cannot take the instance's ranks: a
rank given and not yet attached is *joining*; at most ``max_joining`` ranks
are joining at once, at most ``joins_per_link`` of them asked for over one
connection (the join's route), and a node that joins again under the same
uuid while its rank is joining gets that rank again. ``expire`` reclaims a
joining rank that did not attach within ``pending`` seconds, and a rank its
parent reported lost (``lost(..., now)``) and that did not come back within
``reclaim`` seconds; a reclaimed rank number is given again.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Hashable, Optional, Union

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

    def __init__(self, topology: Topology, max_size: int, endpoint: str, uuid: str,
                 max_joining: int = 1024, joins_per_link: int = 4) -> None:
        self.topology = topology
        self.max_size = max_size
        self.max_joining = max_joining
        self.joins_per_link = joins_per_link
        self.members: dict[int, Member] = {0: Member(endpoint, uuid, True)}
        self.size = 1
        self._next = 1
        self._free: list[int] = []          # reclaimed rank numbers below _next (a heap)
        #: joining ranks, oldest first: rank -> (given at, the join's route, uuid)
        self._joining: dict[int, tuple[float, Hashable, str]] = {}
        self._joining_uuid: dict[str, int] = {}
        self._per_link: dict[Hashable, int] = {}
        self._gone: dict[int, float] = {}   # ranks reported lost, oldest first: rank -> when

    def get(self, rank: int) -> Optional[Member]:
        return self.members.get(rank)

    @property
    def joining(self) -> int:
        """Ranks given and not attached yet."""
        return len(self._joining)

    def give(self, claim: int, uuid: str, endpoint: str, now: float = 0.0,
             link: Hashable = None) -> Union[tuple[int, int, str], Refusal]:
        """A rank for a joining node (``claim`` -1: any) that asked over ``link`` (the
        join's route) and the parent it attaches to: ``(rank, parent, parent's endpoint)``,
        or a ``Refusal``."""
        if claim == 0:
            return Refusal(Errno.EEXIST, "rank 0 is the root")
        if claim >= self.max_size:
            return Refusal(Errno.ENOSPC, f"rank {claim} is past the instance's max_size")
        again = self._joining_uuid.get(uuid) if uuid else None
        if again is not None and claim in (-1, again):
            self._unjoin(again)         # the same node asking again: its rank, given anew
        elif len(self._joining) >= self.max_joining:
            return Refusal(Errno.EAGAIN, f"{self.max_joining} joins wait to attach already")
        elif self._per_link.get(link, 0) >= self.joins_per_link:
            return Refusal(Errno.EAGAIN, f"{self.joins_per_link} joins from this connection "
                                         "wait to attach already")
        if again is not None and claim == -1:
            rank = again
        elif claim > 0:
            member = self.members.get(claim)
            if member is not None and member.online and member.uuid not in (uuid, ""):
                return Refusal(Errno.EEXIST, f"rank {claim} is taken")
            rank = claim
        else:
            rank = self._lowest_free()
        if rank >= self.max_size or rank not in self.members and self.full:
            return Refusal(Errno.ENOSPC, "the instance is full (max_size)")
        self._record(rank, Member(endpoint, uuid, True))
        self._join(rank, now, link, uuid)
        parent = next(a for a in self.topology.ancestors(rank) if self.usable(a))
        return rank, parent, self.members[parent].endpoint or ""

    def _lowest_free(self) -> int:
        free = self._free
        while free:
            rank = heapq.heappop(free)
            if rank not in self.members:
                return rank
        rank = self._next
        while rank in self.members:
            rank += 1
        return rank

    def _join(self, rank: int, now: float, link: Hashable, uuid: str) -> None:
        self._unjoin(rank)
        self._gone.pop(rank, None)
        self._joining[rank] = (now, link, uuid)
        self._per_link[link] = self._per_link.get(link, 0) + 1
        if uuid:
            self._joining_uuid[uuid] = rank

    def _unjoin(self, rank: int) -> None:
        entry = self._joining.pop(rank, None)
        if entry is None:
            return
        _, link, uuid = entry
        left = self._per_link[link] - 1
        if left:
            self._per_link[link] = left
        else:
            del self._per_link[link]
        if self._joining_uuid.get(uuid) == rank:
            del self._joining_uuid[uuid]

    def expire(self, now: float, pending: float, reclaim: float) -> list[int]:
        """Reclaim the ranks joining for ``pending`` seconds and those lost for ``reclaim``
        seconds (see the module's docstring); the ranks reclaimed."""
        out = []
        while self._joining:
            rank, (since, _, _) = next(iter(self._joining.items()))
            if now - since < pending:
                break
            self._unjoin(rank)
            out.append(rank)
        while self._gone:
            rank, since = next(iter(self._gone.items()))
            if now - since < reclaim:
                break
            del self._gone[rank]
            member = self.members.get(rank)
            if member is not None and not member.online:
                out.append(rank)
        for rank in out:
            self.members.pop(rank, None)
            heapq.heappush(self._free, rank)
        return out

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
            self._unjoin(rank)
            self._gone.pop(rank, None)

    def taken(self, rank: int, now: float = 0.0, link: Hashable = None) -> None:
        """A live node holds ``rank`` that this directory did not know of (counted as
        joining over ``link`` until that node attaches)."""
        if 0 < rank < self.max_size and rank not in self.members and not self.full \
                and len(self._joining) < self.max_joining \
                and self._per_link.get(link, 0) < self.joins_per_link:
            self._record(rank, Member(None, "", True))
            self._join(rank, now, link, "")

    def offline(self, limit: int) -> list[int]:
        """The lowest ``limit`` ranks given out and now offline (lost or left)."""
        return sorted(r for r, m in self.members.items() if not m.online)[:limit]

    def lost(self, rank: int, uuid: str = "", now: Optional[float] = None) -> None:
        """``rank`` was lost (or could not be reached): no longer handed out as a parent;
        with ``now`` (its parent reported it lost), reclaimed by ``expire`` unless it comes
        back."""
        member = self.members.get(rank) if rank else None
        if member is not None and (not uuid or member.uuid in (uuid, "")):
            member.online = False
            if now is not None:
                self._gone.pop(rank, None)
                self._gone[rank] = now

    def _record(self, rank: int, member: Member) -> None:
        self.members[rank] = member
        self.size = max(self.size, rank + 1)
        self._next = max(self._next, rank + 1)
