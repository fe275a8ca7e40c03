"""The tree of a Flux instance: which rank is whose parent (``kary:K``).

Rank 0 is the root. In ``kary:K`` (K >= 1) the parent of rank i > 0 is
``(i - 1) // K``, so rank i's children are ``K*i + 1 .. K*i + K``; ``kary:0``
is flat: every rank's parent is rank 0. The default is ``kary:32``, as in
flux-core. The formula gives each rank its place; when an interior rank is
lost its subtree hangs from the nearest live ancestor instead (see
``peermesh.flux.membership``), so routing asks which of a node's children leads
to a rank by walking up from that rank (``path_to``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ..wire.flux import MAX_RANK
from .errors import FluxOverlayError

__all__ = ["Topology", "TopologyError", "DEFAULT_TOPOLOGY"]

DEFAULT_TOPOLOGY = "kary:32"


class TopologyError(FluxOverlayError, ValueError):
    """A topology that is not ``kary:K`` with K >= 0."""


@dataclass(frozen=True, slots=True)
class Topology:
    """``kary:K``; K = 0 is flat."""

    k: int = 32

    @classmethod
    def parse(cls, text: str) -> "Topology":
        """``kary:K`` (K a whole number >= 0); ``TopologyError`` otherwise."""
        kind, sep, arg = str(text).partition(":")
        if kind != "kary" or not sep or not arg.isdigit():
            raise TopologyError(f"topology {text!r} is not kary:K (K a whole number, 0 = flat)")
        return cls(int(arg))

    def __str__(self) -> str:
        return f"kary:{self.k}"

    def parent(self, rank: int) -> int:
        """The parent of ``rank`` (> 0) by the formula."""
        if rank <= 0:
            raise ValueError("rank 0 has no parent")
        return 0 if self.k == 0 else (rank - 1) // self.k

    def ancestors(self, rank: int) -> Iterator[int]:
        """The formula ancestors of ``rank``, nearest first, ending with 0."""
        while rank > 0:
            rank = self.parent(rank)
            yield rank

    def is_descendant(self, rank: int, of: int) -> bool:
        """True when ``rank`` lies below ``of`` in the formula tree."""
        if rank <= of:
            return False
        if of == 0:
            return True
        return any(a == of for a in self.ancestors(rank))

    def children(self, rank: int, size: int) -> range:
        """The formula children of ``rank`` in an instance of ``size`` ranks."""
        if self.k == 0:
            return range(1, size) if rank == 0 else range(0)
        first = self.k * rank + 1
        return range(min(first, size), min(first + self.k, size))

    def depth(self, rank: int) -> int:
        """Hops from ``rank`` to the root."""
        return sum(1 for _ in self.ancestors(rank))


def check_rank(rank: int) -> int:
    """``rank`` if it is a valid rank (0 .. 2**32 - 3), else ``TopologyError``."""
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank <= MAX_RANK:
        raise TopologyError(f"rank {rank!r} is not a whole number in 0..{MAX_RANK}")
    return rank
