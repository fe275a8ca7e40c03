"""What ``FluxCore`` hands its driver: outputs, and the names of the links they go on.

A core returns a list of outputs from every call: ``Send(link, frames)``,
``Deliver(handle, message)``, ``Dial(endpoint, identity)`` (replace the
link to the parent), ``Hangup()`` and ``Notice(what, rank, detail)``.
``PARENT`` names the DEALER to the parent; every other link is a 16-byte
identity of a peer on the node's ROUTER. Route entries name where a
request came from: a peer's identity, ``PARENT`` or ``@n`` (local handle n).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from ..wire.flux import Message

__all__ = ["PARENT", "SELF", "IDENTITY_SIZE", "Send", "Deliver", "Dial", "Hangup", "Notice",
           "Output"]

#: the link to the parent (and route entry for "came from the parent")
PARENT = b"^"
#: route entry of the core's own requests (handle 0)
SELF = b"@0"
#: bytes of a node's identity (its DEALER's routing id); ROUTER peers with other
#: identities (libzmq's own are 5 bytes) are dropped, so no peer can pose as ``^`` or ``@n``
IDENTITY_SIZE = 16
#: offline ranks rank 0's ``peermesh.info`` lists at most (``offline``)
MAX_OFFLINE = 1024
#: services every node answers itself: flux-core's names with flux-core's bodies
#: (``broker.ping``, ``event.publish``, ...), and peermesh's own methods under
#: ``peermesh.*``, a service flux-core does not have
BUILTIN_SERVICES = frozenset({"overlay", "event", "broker", "attr", "peermesh"})


# Send and Deliver are made per message: plain slotted classes (a frozen dataclass's
# __init__ costs several times more); nothing changes them once made.
@dataclass(slots=True)
class Send:
    """Send ``frames`` on ``link`` (``PARENT`` or a ROUTER identity: then ``frames[0]``)."""

    link: bytes
    frames: list[bytes]


@dataclass(slots=True)
class Deliver:
    """Hand ``message`` to local handle ``handle`` (a request, response or event)."""

    handle: int
    message: Message


@dataclass(frozen=True, slots=True)
class Dial:
    """Replace the DEALER to the parent: connect to ``endpoint`` as ``identity``."""

    endpoint: str
    identity: bytes


@dataclass(frozen=True, slots=True)
class Hangup:
    """Close the DEALER to the parent."""


@dataclass(frozen=True, slots=True)
class Notice:
    """Something worth telling: online, child-attached, child-lost, child-torpid,
    parent-lost, events-lost (``rank``: the rank concerned; ``detail``: more)."""

    what: str
    rank: int = -1
    detail: Any = None


Output = Union[Send, Deliver, Dial, Hangup, Notice]
