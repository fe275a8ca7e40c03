"""A local handle's RPCs in flight and its matchtags (RFC 3: unique per handle).

A matchtag is allocated per RPC (NORESPONSE ones get none: 0) and reused
only after the RPC's final response: the response of a plain RPC, or the
error response that ends a stream (ENODATA for a normal end). Tags freed
that way are reused first, so a long-lived handle keeps its tags small.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["Pending", "Handle"]


class Pending(NamedTuple):
    """An RPC of a local handle awaiting its (final) response (a plain tuple: the garbage
    collector stops counting it at its first pass, however long the RPC waits; an
    abandoned one is replaced by one whose topic is empty)."""

    topic: str
    nodeid: int
    streaming: bool


@dataclass(slots=True)
class Handle:
    """A local client of the node: pending RPCs, matchtags, subscriptions."""

    pending: dict[int, Pending] = field(default_factory=dict)
    free: list[int] = field(default_factory=list)
    next_tag: int = 1
    prefixes: set[str] = field(default_factory=set)

    def allocate(self) -> int:
        """A matchtag not in use: one freed by a final response first, else a new one."""
        while self.free:
            tag = self.free.pop()
            if tag not in self.pending:
                return tag
        tag = self.next_tag
        self.next_tag = tag + 1 if tag < 0xFFFFFFFF else 1
        while tag in self.pending:
            tag = self.next_tag
            self.next_tag = tag + 1 if tag < 0xFFFFFFFF else 1
        return tag

    def release(self, tag: int) -> None:
        if self.pending.pop(tag, None) is not None:
            self.free.append(tag)
