"""Errors of the Spark integration: every one is a ``SparkError``."""

from __future__ import annotations

from ..errors import PeermeshError

__all__ = ["SparkError", "MeshWriteError"]


class SparkError(PeermeshError):
    """Base class of the Spark integration's errors (``peermesh.spark``)."""


class MeshWriteError(SparkError, RuntimeError):
    """Rows could not be delivered to the mesh (the Spark task fails with this)."""
