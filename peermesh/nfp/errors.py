"""Errors of the NFP overlay: every one is an ``NfpError``."""

from __future__ import annotations

from ..errors import PeermeshError

__all__ = ["NfpError"]


class NfpError(PeermeshError):
    """Base class of the NFP overlay's errors (``peermesh.nfp``)."""
