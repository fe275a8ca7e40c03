"""What the MTL data flow keeps of a lease: the grant and the connection bound to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from ..wire.mtl import Direction
from .profiles import Profile

if TYPE_CHECKING:
    from .credentials import User

__all__ = ["Grant", "LeaseLink"]


@dataclass(eq=False, slots=True)
class Grant:
    """A lease the control flow granted: who, what, which way."""

    token: str
    session: bytes
    user: "User"
    profile: Profile
    namespace: str
    direction: Direction
    resources: tuple[str, ...]
    confirm: str
    expires: float
    link: Optional["LeaseLink"] = None


@dataclass(eq=False, slots=True)
class LeaseLink:
    """A data connection bound to a lease."""

    identity: bytes
    grant: Grant
    heard: float
    summoned: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> key
    writable: dict[str, tuple[str, str]] = field(default_factory=dict)  # cache: name -> key
    #: cache of an unconfirmed writer: header bytes after the sequence -> key
    passthrough: dict[bytes, tuple[str, str]] = field(default_factory=dict)
    sequence: int = 0
