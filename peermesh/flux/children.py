"""A Flux node's children: the peers on its ROUTER that said hello."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Child"]


@dataclass(slots=True)
class Child:
    """A peer on this node's ROUTER that said hello."""

    identity: bytes
    rank: int
    endpoint: str
    uuid: str
    heard: float
    sent: float
    torpid: bool = False
