"""The one ZeroMQ context every peermesh socket of a process comes from."""

from __future__ import annotations

import threading
from typing import Optional

import zmq

from .descriptors import raise_descriptor_limit

__all__ = ["shared_context"]

_context: Optional[zmq.Context] = None
_lock = threading.Lock()


def shared_context() -> zmq.Context:
    """The process's ZeroMQ context for peermesh, allowing as many sockets as descriptors.

    libzmq's default of 1,023 sockets per context would stop a process at
    about 25 nodes in a full mesh, and libzmq fails silently when it does. The
    descriptor limit is raised to the hard limit first (``descriptors``). A
    plain (not ``zmq.green``) context: sockets are driven by ``HubSocket``.
    """
    global _context
    context = _context
    if context is not None and not context.closed:
        return context
    with _lock:  # nodes of several threads (ThreadedNode) may ask at once
        if _context is None or _context.closed:
            context = zmq.Context()
            limit = raise_descriptor_limit()
            wanted = 65536 if limit is None else max(1024, limit)
            context.set(zmq.MAX_SOCKETS, min(wanted, context.get(zmq.SOCKET_LIMIT)))
            _context = context
        return _context
