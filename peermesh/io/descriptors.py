"""The process's file descriptor limit: raised once to the hard limit, and what it allows.

A node on real sockets holds about ``FDS_PER_PEER`` descriptors per peer
(its DEALER to the peer and the peer's connection to its mailbox), so the
descriptor limit is what bounds how many peers it can have. Many systems
start processes with a soft limit of 1,024 and a hard one far above it:
``raise_descriptor_limit`` lifts the soft limit to the hard one, once per
process, when the first ZeroMQ context is made (``context.shared_context``).
"""

from __future__ import annotations

import logging
import resource
import threading
from typing import Optional

__all__ = ["raise_descriptor_limit", "descriptor_limit", "peer_capacity", "FDS_PER_PEER",
           "FD_RESERVE"]

log = logging.getLogger(__name__)

#: descriptors one peer costs a node on real sockets: its DEALER's connection, the
#: peer's connection to the node's ROUTER, and libzmq's signalling pipe for the socket
FDS_PER_PEER = 3
#: descriptors kept for everything else (beacon socket, files, the agent)
FD_RESERVE = 64
#: the limit asked for when the hard limit is unlimited
_UNLIMITED_WANT = 1 << 20

_raised = False
_lock = threading.Lock()


def raise_descriptor_limit() -> Optional[int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (once); the soft limit now,
    None if unlimited."""
    global _raised
    with _lock:
        if not _raised:
            _raised = True
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            want = _UNLIMITED_WANT if hard == resource.RLIM_INFINITY else hard
            if soft != resource.RLIM_INFINITY and soft < want:
                try:
                    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
                    log.debug("descriptor limit raised from %d to %d", soft, want)
                except (ValueError, OSError) as exc:  # e.g. a hard limit the kernel caps
                    log.debug("descriptor limit stays %d: %s", soft, exc)
    return descriptor_limit()


def descriptor_limit() -> Optional[int]:
    """The soft ``RLIMIT_NOFILE``; None if unlimited."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def peer_capacity() -> int:
    """Peers a node on real sockets can hold within the (raised) descriptor limit:
    (limit - ``FD_RESERVE``) // ``FDS_PER_PEER``; nodes of one process share it."""
    limit = raise_descriptor_limit()
    return max(1, ((limit or _UNLIMITED_WANT) - FD_RESERVE) // FDS_PER_PEER)
