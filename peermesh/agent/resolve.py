"""Which peer a name means, on a mesh that is still being found.

``resolve_peer`` finds the one ready peer that a name, a UUID or a UUID hex
prefix names (as ``Node.find_peer``). A full UUID is used as soon as that
peer is known. A name or prefix is trusted only once every peer on the LAN
had time to be found (``settle_time`` after the node started: about one
beacon interval), so that a second match is not missed and an ambiguous name
is refused rather than matched to the first peer found; an ambiguity is
refused at once, since more peers appearing cannot resolve it. The agent's
``whisper`` op and ``peermesh whisper`` without an agent both use it.
"""

from __future__ import annotations

import time
from typing import Any, Callable
from uuid import UUID

from ..errors import AmbiguousPeerError, UnknownPeerError

__all__ = ["resolve_peer", "settle_time", "is_full_uuid"]


def settle_time(config: Any) -> float:
    """Seconds after a node's start (``config``: its ``NodeConfig``) in which every peer on
    the LAN has beaconed at least once: one interval, plus."""
    return float(config.interval) * 1.25 + 0.05


def is_full_uuid(text: str) -> bool:
    """True when ``text`` is a whole UUID (in any form ``uuid.UUID`` reads)."""
    try:
        UUID(text)
        return True
    except ValueError:
        return False


def resolve_peer(node: Any, target: str, wait: float, settled_at: float,
                 wait_change: Callable[[float], Any],
                 clock: Callable[[], float] = time.monotonic) -> UUID:
    """The UUID of the one ready peer of ``node`` (a started ``Node``) that ``target`` names.

    Waits up to ``wait`` seconds for a peer not known yet, and for a name or
    prefix until ``settled_at`` (a ``clock`` time; at most ``wait``), calling
    ``wait_change(until)`` to wait for the mesh to change (it returns by
    ``until``). Raises ``AmbiguousPeerError`` when several peers match and
    ``UnknownPeerError`` when none appeared in time, with messages for the user.
    """
    deadline = clock() + wait
    sure = min(settled_at, deadline)
    exact = is_full_uuid(target)
    while True:
        now = clock()
        try:
            uuid = node.find_peer(target)
            if exact or now >= sure:
                return uuid
            wake = sure
        except AmbiguousPeerError as exc:
            raise AmbiguousPeerError(f"{exc}; give more of the UUID") from None
        except UnknownPeerError:
            if now >= deadline:
                raise UnknownPeerError(f"no peer matching {target!r} appeared "
                                       f"within {wait:g} s") from None
            wake = deadline
        wait_change(wake)
