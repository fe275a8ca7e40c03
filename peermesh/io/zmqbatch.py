"""ZeroMQ messages read in batches and sent whole by a small C extension.

From Python, pyzmq costs about 0.6 us per frame (a call, a ``Frame``, its
``more`` flag), and a ZRE WHISPER is three frames at a ROUTER. The extension
``peermesh.io._zmqbatch`` (built from ``peermesh/io/_zmqbatch*.c`` at install when a
C compiler is present) reads every waiting message in one call, sends a
message's frames in one call (and a backlog of messages in one call:
``send_each``, about 0.14 us less per message than a Python loop of sends,
octet counting included; or a message whose first frame is a prebuilt header with
its 2-octet sequence number written in during the call: ``send_numbered``, no
header object per message), reads the frames every message has (a protocol's name, a
command) as the same bytes objects each time (``known``: ``knows_frames``), and asks a
socket's ``EVENTS`` without pyzmq's
option enum (0.6 us against 1.4), through the libzmq that pyzmq loaded, on the
handle pyzmq exposes as ``Socket.underlying``. A batch of WHISPERs then costs
about 0.4 us per message to read instead of about 1.8 us.

Each protocol's usual per-message path is there too, one call per batch: ``zre_take`` (a
ZRE node's WHISPERs and SHOUTs taken in), ``sada_take``, ``sada_submit`` and ``sada_jobs``
(a Safir-Darbaan channel's replies taken in and requests made, a server's requests handed
to their handlers, as ``peermesh.sada.routing`` and ``serving`` describe) and
``flux_take`` (a Flux node's common hops routed and sent, as ``peermesh.flux.routing``
describes).

``native`` is the loaded extension, or None: no compiler at install, a pyzmq
whose libzmq hides its functions, or ``PEERMESH_PURE_PYTHON=1`` in the
environment, or a build older than this code (one that lacks a function the
transport calls). The transport then uses pyzmq alone, with the same behaviour.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import Optional

import zmq
from zmq.backend.cython import _zmq

__all__ = ["native", "why_not", "knows_frames", "flux_take"]

log = logging.getLogger(__name__)


#: what the transport calls in the extension
_FUNCTIONS = ("load", "recv_batch", "send", "send_each", "send_numbered", "events")


def _load() -> tuple[Optional[ModuleType], str]:
    if os.environ.get("PEERMESH_PURE_PYTHON"):
        return None, "PEERMESH_PURE_PYTHON is set"
    try:
        from . import _zmqbatch as extension  # type: ignore[attr-defined]
    except ImportError as exc:
        return None, f"the C extension was not built ({exc})"
    missing = [name for name in _FUNCTIONS if not hasattr(extension, name)]
    if missing:  # a build older than this code (an in-place build not redone)
        return None, f"the C extension lacks {', '.join(missing)}: rebuild it"
    try:
        extension.load(_zmq.__file__, zmq.ZMQError)
    except ImportError as exc:
        return None, f"libzmq's functions are not reachable through pyzmq ({exc})"
    return extension, ""


native, why_not = _load()
if native is None:
    log.debug("ZeroMQ through pyzmq alone: %s", why_not)
#: ``native.recv_batch`` takes ``known``: frames every message has read as given objects
#: (False without the extension, or with a build older than that)
knows_frames: bool = native is not None and hasattr(native, "KNOWN_FRAMES")
#: ``native.flux_take``: a Flux node's common hops routed and sent in one call per batch
#: (None without the extension, or with a build older than that)
flux_take = getattr(native, "flux_take", None)
