"""Exceptions raised by peermesh."""

from __future__ import annotations


class PeermeshError(Exception):
    """Base class of every error peermesh raises on purpose."""


class ProtocolError(PeermeshError):
    """Bytes that do not follow the wire protocol; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InterfaceError(PeermeshError):
    """The requested network interface does not exist or cannot be used."""


class UnknownPeerError(PeermeshError):
    """No ready peer matches the given UUID."""


class AmbiguousPeerError(UnknownPeerError):
    """A name or UUID prefix matches more than one peer."""


class PeerNotResponding(PeermeshError):
    """A peer's send queue stayed full: it was treated as not responding and disconnected."""


class NodeStateError(PeermeshError):
    """The call is not allowed in the node's current state (e.g. before start)."""


class StoreError(PeermeshError):
    """A job store file cannot be opened or is not one (not SQLite, another schema)."""
