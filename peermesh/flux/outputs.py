"""What ``FluxCore`` hands its driver: the names of the links, and its notices.

A Flux core returns ``peermesh.core``'s outputs (re-exported here):
``Send(link, frames)``, ``Deliver((handle, message))`` (a request, response
or event for local handle ``handle``), ``Dial(PARENT, endpoint, identity)``
(replace the link to the parent), ``Hangup(PARENT)`` and
``Emit(Notice(what, rank, detail))``. ``PARENT`` names the DEALER to the
parent; every other link is a 16-byte identity of a peer on the node's
ROUTER, and a ``Send`` on it carries that identity as its first frame (the
ROUTER's address: the driver sends the frames as they are). Route entries name where a
request came from: a peer's identity, ``PARENT`` or ``@n`` (local handle n).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import Deliver, Dial, Emit, Hangup, Output, Send

__all__ = ["PARENT", "SELF", "IDENTITY_SIZE", "Send", "Deliver", "Emit", "Dial", "Hangup",
           "Notice", "Output"]

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


@dataclass(frozen=True, slots=True)
class Notice:
    """Something worth telling: online, child-attached, child-lost, child-torpid,
    parent-lost, events-lost (``rank``: the rank concerned; ``detail``: more)."""

    what: str
    rank: int = -1
    detail: Any = None


