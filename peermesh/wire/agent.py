"""The agent protocol's framing: each message is its length in 4 octets, big-endian,
then its msgpack body (the protocol itself: ``peermesh.agent.protocol``)."""

from __future__ import annotations

__all__ = ["HEAD_SIZE", "pack_frame", "frame_size"]

#: octets of a frame's length prefix
HEAD_SIZE = 4


def pack_frame(body: bytes) -> bytes:
    """``body`` behind its length prefix."""
    return len(body).to_bytes(HEAD_SIZE, "big") + body


def frame_size(head: bytes) -> int:
    """The body length a ``HEAD_SIZE``-octet prefix announces."""
    return int.from_bytes(head, "big")
