"""The agent protocol: what the agent and its clients say to each other, as bytes.

Sans-io: frames built and parsed here, read and written by the agent
(``peermesh.agent.server``) and the client (``peermesh.agent.client``). This
module loads only msgpack (the checks of a request load ``peermesh.wire``
when the first request is parsed), so the client that imports it starts fast.

Frames
------
Every message, either way, is one frame: a 4-octet big-endian length, then
that many octets holding one msgpack map::

    frame = length:uint32be msgpack-map

The first frame from each side is the handshake: the client sends
``{"hello": PROTOCOL}`` (today 1), the agent answers ``{"hello": PROTOCOL,
"pid": int, "version": str}``. When the numbers differ the agent adds
``"error": "agent speaks protocol N, this client M: restart the agent"``,
logs the same, and closes; the client raises ``AgentMismatch`` with that
advice. A client may send its first request right after its handshake,
without waiting.

A request is ``{"op": str, "args": map, "id": int|str}`` (``args`` and ``id``
optional). The reply is ``{"ok": true, "result": ...}`` or ``{"ok": false,
"error": message, "code": code}``, with the request's ``id`` when it had one.
Codes: ``bad-request`` (not msgpack, not a map - msgpack nil included -, nested
deeper than 128, no op, no handshake; the connection stays open),
``unknown-op``, ``bad-args``, ``not-found``, ``ambiguous``,
``not-responding``, ``busy``, ``stopping``, ``failed``, ``internal``.
Requests are served concurrently; a client may send several and match
replies by ``id``.

========  ============================================  =========================================
op        args                                          result
========  ============================================  =========================================
ping                                                    ``{pid, version}``
info                                                    ``{pid, version, path, name, uuid,
                                                        endpoint, interface: {name, address},
                                                        port, groups, headers, peers, uptime,
                                                        subscribers}``
peers     ``group`` (only its members), ``wait``        list of ``{peer, name, address, headers,
                                                        groups}`` sorted by name
groups                                                  ``{joined: [...], known: [...]}``
join      ``group``                                     ``{group, changed, groups}``
leave     ``group``                                     ``{group, changed, groups}``
shout     ``group``, ``message`` (bytes/str) or         ``{group, peers, confirmed}``
          ``frames`` (list), ``wait``, ``confirm``
whisper   ``peer`` (name, UUID or UUID hex prefix,      ``{peer, name, confirmed}``
          as ``Node.find_peer``), ``message`` or
          ``frames``, ``wait``, ``confirm``
events    ``types`` (list of event names; default all)  ``{subscribed: true}``, then a stream
========  ============================================  =========================================

``wait`` (seconds, default 0, at most 3600) is how long the agent may wait
for a peer or group member that it does not know yet; an agent younger than
about one beacon interval also waits until it has heard every peer once, so
an ambiguous name is refused rather than matched to the first peer found.
``confirm`` (default true) waits up to 1 s for the receivers' PING-OK.

``events`` turns the connection into a subscription: after the reply, the
agent sends ``{"event": {type, peer (UUID hex), name, group, frames (list of
bytes), headers, address, reason}}`` for each event of the node,
``{"heartbeat": true}`` after a second without one, ``{"dropped": n}`` when
the client was too slow and ``n`` events did not fit its backlog (10,000),
and ``{"end": reason}`` when the agent stops. The subscription ends when the
client closes the connection. A client that hears nothing for ``LOST_AFTER``
(``peermesh.agent.client``) seconds may consider the agent gone.
"""

from __future__ import annotations

import msgpack

from ..errors import ProtocolError, RemoteProtocolError
from ..wire.agent import pack_frame

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing at run time
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

__all__ = ["PROTOCOL", "frame", "hello_frame", "reply_frame", "event_message",
           "BadRequest", "unpack_body", "parse_request", "take_exact"]

#: version of the agent protocol; a change that an older peer would misread bumps it
PROTOCOL = 1


def take_exact(buffer: bytearray, size: int, recv: Callable[[int], bytes]) -> Optional[bytes]:
    """Exactly ``size`` octets: from ``buffer`` (what was read ahead, kept there), topped up
    with ``recv(at most)`` (a socket's, up to 1 MiB at a time); None when ``recv`` says the
    stream ended (b"")."""
    while len(buffer) < size:
        chunk = recv(min(max(65536, size - len(buffer)), 1 << 20))
        if not chunk:
            return None
        buffer += chunk
    data = bytes(buffer[:size])
    del buffer[:size]
    return data


def frame(message: Any) -> bytes:
    """``message`` packed as one frame: its msgpack length (4 octets, big-endian), then it."""
    body = msgpack.packb(message, use_bin_type=True)
    return pack_frame(body)


def hello_frame(pid: int, version: str, **extra: Any) -> bytes:
    """The agent's handshake; ``extra``: ``code`` and ``error`` when it refuses the client."""
    return frame({"hello": PROTOCOL, "pid": pid, "version": version, **extra})


def reply_frame(rid: Any, result: Any = None, error: Optional[tuple[str, str]] = None) -> bytes:
    """The reply to request ``rid`` (None: it had no usable id): ``result``, or ``error``
    as ``(code, message)``."""
    reply: dict[str, Any]
    if error is None:
        reply = {"ok": True, "result": result}
    else:
        reply = {"ok": False, "code": error[0], "error": error[1]}
    if rid is not None:
        reply["id"] = rid
    return frame(reply)


def event_message(event: Any) -> dict[str, Any]:
    """An ``Event`` as the agent streams it (frames stay bytes)."""
    return {"type": event.type.value, "peer": event.peer.hex if event.peer else None,
            "name": event.name, "group": event.group, "frames": list(event.frames),
            "headers": dict(event.headers) if event.headers is not None else None,
            "address": event.address, "reason": event.reason}


class BadRequest(RemoteProtocolError):
    """A request frame (from a client) the agent answers with an error: ``code``, and ``rid`` (the
    request's id, when it had a usable one)."""

    def __init__(self, reason: str, code: str = "bad-request", rid: Any = None) -> None:
        super().__init__(reason)
        self.code, self.rid = code, rid


def unpack_body(body: bytes) -> Any:
    """A frame's body unpacked; ``BadRequest`` if it is not one msgpack value or nests
    deeper than ``jsonsafe.MAX_DEPTH``."""
    from ..wire import jsonsafe
    from ..wire.frames import as_bytes

    try:
        value = msgpack.unpackb(as_bytes(body, "a frame's body"), raw=False)
    except ProtocolError:
        raise
    except Exception:  # msgpack raises several kinds for bad input
        raise BadRequest("request is not msgpack") from None
    if isinstance(value, (dict, list)) and jsonsafe.depth(value) > jsonsafe.MAX_DEPTH:
        raise BadRequest(f"request nests deeper than {jsonsafe.MAX_DEPTH}")
    return value


def parse_request(body: bytes) -> tuple[Any, str, dict[str, Any]]:
    """``(id, op, args)`` of a request frame's body (msgpack ``{op, args, id}``);
    ``BadRequest`` for anything else."""
    request = unpack_body(body)
    if not isinstance(request, dict):
        raise BadRequest("request must be a map {op, args}")
    rid = request.get("id")
    if not isinstance(rid, (int, str)) or isinstance(rid, bool):
        rid = None
    op = request.get("op")
    args = request.get("args", {})
    if args is None:
        args = {}
    if not isinstance(op, str):
        raise BadRequest("request has no op (a string)", rid=rid)
    if not isinstance(args, dict):
        raise BadRequest("args must be a map", rid=rid)
    return rid, op, args
