"""Exceptions raised by peermesh: every one is a ``PeermeshError``.

Errors every layer shares live here; each overlay has one root under
``PeermeshError`` (``peermesh.sada.errors.SadaError``,
``peermesh.flux.errors.FluxOverlayError``, ``peermesh.mtl.errors.MtlError``,
``peermesh.nfp.errors.NfpError``, ``peermesh.spark.errors.SparkError``) that its
own errors derive from.
"""

from __future__ import annotations


class PeermeshError(Exception):
    """Base class of every error peermesh raises on purpose."""


class ProtocolError(PeermeshError):
    """Bytes that do not follow the wire protocol; ``reason`` says why.

    Catch it for either side; ``LocalProtocolError`` and ``RemoteProtocolError`` say
    which one broke the protocol (as h11 does).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class LocalProtocolError(ProtocolError):
    """This program asked for something the protocol cannot carry (an encoder refused
    it): a bug or a bad argument here, nothing from the network."""


class RemoteProtocolError(ProtocolError):
    """A peer sent bytes that break the protocol (a decoder refused them): dropped,
    logged at debug, never fatal to the receiver."""


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
