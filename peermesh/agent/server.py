"""The local agent: a long-lived node that the CLI (or any program) drives over a socket.

``peermesh agent`` runs one node for as long as the host is up and listens on
a Unix stream socket, so ``peermesh peers``, ``shout``, ``whisper``, ``join``,
``leave`` and ``events`` answer at once instead of starting a node of their
own and waiting for the mesh to be found. The library (the node), the agent
and the client (``peermesh.agent.client``) are apart; they meet only in the
versioned protocol (``peermesh.agent.protocol``: frames, handshake, the ops
and their replies, the event stream). The agent is made of:

* ``peermesh.agent.path``: where the socket lives;
* ``peermesh.agent.claim``: the private directory, the lock and the stale
  socket file (``claim_path``);
* ``peermesh.agent.ops``: the ops that act on the node;
* this module: the server, which accepts clients, reads their handshakes and
  requests, runs the ops within the bounds below and streams events.

Bounds
------
At most ``max_connections`` (``MAX_CONNECTIONS``, 128) clients at once, and
never more than half the descriptors the process may still open when the
agent starts (``RLIMIT_NOFILE`` less those open) after ``NODE_RESERVE``
(128) kept for the node, so clients never take the descriptors its peers
need: one more gets the agent's handshake with ``"code": "busy"`` and is
closed at once (refusals are counted in ``limits`` and logged once per
interval). An ``accept`` that fails (``EMFILE``) is retried after a pause;
the agent keeps serving. The handshake must arrive within
``HANDSHAKE_TIMEOUT`` (5 s). A request frame may hold at most
the node's ``max_message`` plus 64 KiB (``REQUEST_OVERHEAD``): a larger one
is answered ``bad-request`` and the connection closed; a client accepts
replies up to ``MAX_REPLY`` (256 MiB). At most ``MAX_CONCURRENT`` (256)
requests run at once (then ``busy``) and ``MAX_SUBSCRIBERS`` (64) follow
events. A client that leaves a reply unread for ``SEND_TIMEOUT`` (5 s) is
disconnected; a subscriber that does not read loses events (counted, as
above) but keeps its subscription.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from collections import deque
from typing import Any, Callable, Optional

from ..counters import Counters
from ..errors import PeermeshError
from ..wire.agent import HEAD_SIZE, frame_size
from .claim import AgentClaim, AgentPathError, AgentRunning, claim_path
from .client import (LOST_AFTER, PROBE_TIMEOUT, AgentClient, AgentError, AgentGone,
                     AgentMismatch, NoAgent)
from .ops import MAX_WAIT, MeshOps, OpRefused
from .path import MAX_PATH, default_agent_path, resolve_path
from .protocol import (PROTOCOL, BadRequest, event_message, frame, hello_frame, parse_request,
                       reply_frame, take_exact, unpack_body)

# The agent's public names in one place: default_agent_path, resolve_path, MAX_PATH (path);
# claim_path, AgentClaim, AgentRunning, AgentPathError (claim); the client's; PROTOCOL,
# BadRequest, parse_request, unpack_body, event_message (protocol); MAX_WAIT (ops).
__all__ = ["default_agent_path", "resolve_path", "claim_path", "AgentClaim", "AgentServer",
           "AgentClient", "AgentError", "AgentRunning", "AgentPathError", "NoAgent",
           "AgentMismatch", "AgentGone", "PROTOCOL", "MAX_PATH", "PROBE_TIMEOUT", "LOST_AFTER",
           "BadRequest", "parse_request", "unpack_body", "event_message", "MAX_WAIT"]

log = logging.getLogger(__name__)

#: seconds between heartbeats to an idle subscriber
HEARTBEAT = 1.0
#: events held per subscriber that is not reading; beyond this they are counted as dropped
SUBSCRIBER_BACKLOG = 10_000
#: clients connected at once
MAX_CONNECTIONS = 128
#: clients following events at once
MAX_SUBSCRIBERS = 64
#: requests in progress at once
MAX_CONCURRENT = 256
#: a request frame may be this much larger than the node's ``max_message``
REQUEST_OVERHEAD = 64 * 1024
#: seconds a new connection has to send its handshake
HANDSHAKE_TIMEOUT = 5.0
#: seconds a reply may wait for the client to read before the client is disconnected
SEND_TIMEOUT = 5.0
#: descriptors kept for the node's own peers and sockets, beyond those open at start
NODE_RESERVE = 128
_WARN_EVERY = 60.0  # seconds between two log lines about the same kind of misbehaviour


def _free_descriptors() -> int:
    """Descriptors this process may still open (its soft limit less those open now)."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    try:
        return soft - len(os.listdir("/proc/self/fd"))
    except OSError:   # no /proc: count none open
        return soft


# --------------------------------------------------------------------------
# The server


#: what ``_read_frame`` returns at the end of the stream (a body may be msgpack nil: None)
_EOF: Any = object()


class _TooLarge(Exception):
    """A frame over the size limit (the stream cannot be trusted after it)."""


class _Connection:
    """One client: its socket, what it sent that is not yet read, a lock that keeps
    frames whole, and its subscription."""

    __slots__ = ("sock", "buffer", "lock", "subscription")

    def __init__(self, sock: Any) -> None:
        import gevent.lock

        self.sock = sock
        self.buffer = bytearray()
        self.lock = gevent.lock.Semaphore()
        self.subscription: Optional[_Subscription] = None

    def read(self, size: int) -> Optional[bytes]:
        """Exactly ``size`` octets, or None when the client closed the connection."""
        return take_exact(self.buffer, size, self.sock.recv)

    def send(self, data: bytes, timeout: Optional[float] = SEND_TIMEOUT) -> bool:
        """Send ``data`` whole; False (and the connection closed) when the client is gone
        or does not read for ``timeout`` seconds."""
        import gevent

        if not self.lock.acquire(timeout=timeout):
            self.sock.close()
            return False
        timer = gevent.Timeout(timeout)
        timer.start()
        try:
            self.sock.sendall(data)
            return True
        except gevent.Timeout as exc:
            if exc is not timer:
                raise
            self.sock.close()
            return False
        except OSError:
            self.sock.close()
            return False
        finally:
            timer.close()
            self.lock.release()


class _Subscription:
    __slots__ = ("types", "backlog", "dropped", "wake")

    def __init__(self, types: Optional[frozenset[str]]) -> None:
        import gevent.event

        self.types = types
        self.backlog: deque[bytes] = deque()
        self.dropped = 0
        self.wake = gevent.event.Event()


_HEARTBEAT_FRAME = frame({"heartbeat": True})
_STREAM_BATCH = 1 << 20  # octets of events joined into one send


class AgentServer:
    """Serves requests for a started ``Node`` on the claimed Unix socket path.

    Call ``publish(event)`` for every event the node reports (the owner
    drains the node's queue), and ``close()`` when the node stops.
    """

    def __init__(self, node: Any, claim: AgentClaim, *, heartbeat: float = HEARTBEAT,
                 backlog: int = SUBSCRIBER_BACKLOG,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        import gevent.event
        import gevent.pool

        from .. import __version__

        self.node = node
        self.claim = claim
        self.path = claim.path
        self.version = __version__
        self.heartbeat = heartbeat
        self.backlog = backlog
        self.max_request = node.config.max_message + REQUEST_OVERHEAD
        if not max_connections >= 1:
            raise ValueError(f"max_connections must be at least 1, not {max_connections!r}")
        #: clients served at once: ``max_connections``, and at most half the descriptors
        #: still free when the agent is made, less ``NODE_RESERVE`` kept for the node
        self.max_connections = min(max_connections,
                                   max(1, (_free_descriptors() - NODE_RESERVE) // 2))
        if self.max_connections < max_connections:
            log.warning("agent serves at most %d clients at once, not %d: the process may open "
                        "few more descriptors (raise its RLIMIT_NOFILE)", self.max_connections,
                        max_connections)
        #: refusals by limit: ``max_connections``, ``descriptors`` (accept failed: EMFILE)
        self.limits = Counters(log, "agent hit its limits")
        self.started = time.monotonic()
        self._listener: Any = None
        self._acceptor: Any = None
        self._connections: dict[_Connection, Any] = {}  # -> its reading greenlet
        self._changed = gevent.event.Event()
        self._pool = gevent.pool.Pool(MAX_CONCURRENT)
        self._closing = False
        self._warned: dict[str, float] = {}
        #: more of ``info``'s answer: key -> a call that gives its value
        self.reports: dict[str, Callable[[], Any]] = {}
        #: op name -> its call (args -> result); ``events`` is the server's own
        self._ops: dict[str, Callable[[dict[str, Any]], Any]] = {
            "ping": self._op_ping, "info": self._op_info,
            **MeshOps(node, self.started, self._wait_change).by_name,
        }

    # --- life cycle -----------------------------------------------------

    def start(self) -> "AgentServer":
        """Listen at ``path`` and serve on the current hub."""
        import gevent
        import gevent.socket

        listener = gevent.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.path)
            os.chmod(self.path, 0o600)   # only this user may connect (write permission)
            listener.listen(64)
        except OSError as exc:
            listener.close()
            raise AgentPathError(f"cannot listen at {self.path}: {exc.strerror or exc}") from None
        self.claim.bound()
        self._listener = listener
        self.node.add_listener(self._on_node_event)
        self._acceptor = gevent.spawn(self._accept)
        return self

    def close(self, reason: str = "its node left the mesh") -> None:
        """Tell subscribers ``reason``, stop serving and close the socket."""
        import gevent

        if self._listener is None:
            return
        self._closing = True
        try:
            self.node.remove_listener(self._on_node_event)
        except ValueError:
            pass
        self._acceptor.kill()
        self._listener.close()
        self._listener = None
        self._pool.kill(block=True, timeout=1.0)
        end = frame({"end": reason})
        connections = list(self._connections)
        ends = [gevent.spawn(conn.send, end, 0.2) for conn in connections
                if conn.subscription is not None]
        gevent.joinall(ends, timeout=0.5)
        gevent.killall(list(self._connections.values()), timeout=1.0)
        for conn in connections:
            conn.sock.close()
        self._connections.clear()

    @property
    def subscribers(self) -> int:
        return sum(1 for conn in self._connections if conn.subscription is not None)

    def _warn(self, kind: str, message: str, *args: Any) -> None:
        """Log ``message`` at warning, at most once per ``_WARN_EVERY`` for each ``kind``."""
        now = time.monotonic()
        if now - self._warned.get(kind, -_WARN_EVERY) >= _WARN_EVERY:
            self._warned[kind] = now
            log.warning(message, *args)
        else:
            log.debug(message, *args)

    # --- events ---------------------------------------------------------

    def publish(self, event: Any) -> None:
        """Queue ``event`` for every subscriber (never blocks)."""
        if self._closing or event.type.value == "STOP":
            return  # STOP: subscribers get {"end": ...} from close()
        data: Optional[bytes] = None
        for conn in self._connections:
            sub = conn.subscription
            if sub is None or sub.types is not None and event.type.value not in sub.types:
                continue
            if len(sub.backlog) >= self.backlog:
                sub.dropped += 1
            else:
                if data is None:
                    data = frame({"event": event_message(event)})
                sub.backlog.append(data)
            sub.wake.set()

    def _on_node_event(self, event: Any) -> None:
        changed, self._changed = self._changed, type(self._changed)()
        changed.set()

    def _wait_change(self, deadline: float) -> None:
        """Wait until the mesh changes (any event) or ``deadline``."""
        self._changed.wait(max(0.0, min(deadline - time.monotonic(), 0.25)))

    # --- connections ----------------------------------------------------

    def _accept(self) -> None:
        import gevent

        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError as exc:
                if self._closing:
                    return
                # e.g. EMFILE: wait until a descriptor frees; the agent keeps serving
                self.limits.over("descriptors", f"agent cannot accept a client: "
                                 f"{exc.strerror or exc}")
                gevent.sleep(0.1 if exc.errno in (errno.EMFILE, errno.ENFILE) else 0.01)
                continue
            conn = _Connection(sock)
            if len(self._connections) >= self.max_connections:
                self.limits.over("max_connections", f"agent refused a client: "
                                 f"{self.max_connections} connected already")
                self._refuse(conn, "busy",
                             f"the agent serves {self.max_connections} clients already")
                continue
            self._connections[conn] = gevent.spawn(self._serve, conn)

    def _hello(self, **extra: Any) -> bytes:
        return hello_frame(os.getpid(), self.version, **extra)

    def _refuse(self, conn: _Connection, code: str, message: str) -> None:
        """Answer the handshake with ``code`` and close at once (never waits: a refused
        client holds no descriptor)."""
        try:
            conn.sock.setblocking(False)
            conn.sock.send(self._hello(code=code, error=message))
        except OSError:
            pass
        conn.sock.close()

    def _read_frame(self, conn: _Connection) -> Any:
        """The next frame's body; ``_EOF`` at the end of the stream."""
        head = conn.read(HEAD_SIZE)
        if head is None:
            return _EOF
        size = frame_size(head)
        if size > self.max_request:
            raise _TooLarge(size)
        body = conn.read(size)
        return _EOF if body is None else body

    def _serve(self, conn: _Connection) -> None:
        """Read ``conn``'s handshake, then its requests, until it closes."""
        try:
            if self._handshake(conn):
                while True:
                    request = self._read_frame(conn)
                    if request is _EOF:
                        return
                    self._on_request(conn, request)
        except _TooLarge as exc:
            self._reply(conn, None, error=("bad-request", f"a frame of {exc.args[0]} octets is "
                                           f"over the limit of {self.max_request}"))
        except OSError:
            pass
        finally:
            conn.sock.close()
            self._connections.pop(conn, None)

    def _handshake(self, conn: _Connection) -> bool:
        """Read the client's handshake and answer it; False when the client is refused."""
        import gevent

        timer = gevent.Timeout(HANDSHAKE_TIMEOUT)
        timer.start()
        try:
            hello = self._read_frame(conn)
        except gevent.Timeout as exc:
            if exc is not timer:
                raise
            return False
        finally:
            timer.close()
        if hello is not _EOF:
            try:
                hello = unpack_body(hello)
            except BadRequest:
                pass
        if not isinstance(hello, dict) or "hello" not in hello:
            if hello is not _EOF:
                self._refuse(conn, "bad-request",
                             "the first message must be the handshake {hello: protocol}")
            return False
        theirs = hello["hello"]
        if theirs != PROTOCOL:
            advice = (f"agent speaks protocol {PROTOCOL}, this client {str(theirs)[:20]}: "
                      "restart the agent")
            self._warn("protocol", "a client refused: %s", advice)
            self._refuse(conn, "protocol", advice)
            return False
        return conn.send(self._hello())

    # --- requests -------------------------------------------------------

    def _on_request(self, conn: _Connection, body: bytes) -> None:
        try:
            rid, op, args = parse_request(body)
        except BadRequest as exc:
            self._reply(conn, exc.rid, error=(exc.code, exc.reason))
            return
        if self._closing or not self.node.running:
            self._reply(conn, rid, error=("stopping", "the agent is stopping"))
            return
        if op == "events":
            self._subscribe(conn, rid, args)
            return
        run = self._ops.get(op)
        if run is None:
            known = ", ".join(sorted([*self._ops, "events"]))
            self._reply(conn, rid,
                        error=("unknown-op", f"unknown op {op[:40]!r}; known: {known}"))
            return
        if self._pool.full():
            self._reply(conn, rid, error=("busy", "too many requests in progress"))
            return
        self._pool.spawn(self._run_op, run, conn, rid, args)

    def _run_op(self, run: Callable[[dict[str, Any]], Any], conn: _Connection,
                rid: Any, args: dict[str, Any]) -> None:
        from ..errors import NodeStateError, PeerNotResponding, UnknownPeerError

        try:
            result = run(args)
        except OpRefused as exc:
            self._reply(conn, rid, error=(exc.code, str(exc)))
        except NodeStateError as exc:
            self._reply(conn, rid, error=("stopping", f"the agent's node: {exc}"))
        except PeerNotResponding as exc:
            self._reply(conn, rid, error=("not-responding", str(exc)))
        except UnknownPeerError as exc:
            self._reply(conn, rid, error=("not-found", str(exc)))
        except PeermeshError as exc:
            self._reply(conn, rid, error=("failed", str(exc)))
        except (ValueError, TypeError) as exc:
            self._reply(conn, rid, error=("bad-args", str(exc)))
        except Exception as exc:
            log.exception("agent op failed")
            self._reply(conn, rid, error=("internal", f"internal error: {exc!r}"))
        else:
            self._reply(conn, rid, result=result)

    def _reply(self, conn: _Connection, rid: Any, result: Any = None,
               error: Optional[tuple[str, str]] = None) -> None:
        conn.send(reply_frame(rid, result, error))

    def _subscribe(self, conn: _Connection, rid: Any, args: dict[str, Any]) -> None:
        import gevent

        types = args.get("types")
        if types is not None:
            if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
                self._reply(conn, rid, error=("bad-args", "types must be a list of strings"))
                return
            types = frozenset(t.upper() for t in types)
        if conn.subscription is None and self.subscribers >= MAX_SUBSCRIBERS:
            self._reply(conn, rid, error=("busy", "too many event subscribers"))
            return
        first = conn.subscription is None
        conn.subscription = sub = _Subscription(types)
        sub.backlog.append(reply_frame(rid, {"subscribed": True}))  # before any event
        sub.wake.set()
        if first:
            gevent.spawn(self._stream, conn)

    def _stream(self, conn: _Connection) -> None:
        """Send ``conn``'s subscription: events, drop counts and heartbeats, in order."""
        while conn in self._connections and conn.subscription is not None:
            sub = conn.subscription
            sub.wake.wait(self.heartbeat)
            sub.wake.clear()
            if not sub.backlog and not sub.dropped:
                batch = [_HEARTBEAT_FRAME]
            else:
                batch, size = [], 0
                while sub.backlog and size < _STREAM_BATCH:
                    batch.append(sub.backlog.popleft())
                    size += len(batch[-1])
                if sub.backlog:
                    sub.wake.set()  # more to send at once
                elif sub.dropped:
                    batch.append(frame({"dropped": sub.dropped}))
                    sub.dropped = 0
            if not conn.send(b"".join(batch), timeout=None):
                return

    # --- ops ------------------------------------------------------------

    def _op_ping(self, args: dict[str, Any]) -> Any:
        return {"pid": os.getpid(), "version": self.version}

    def _op_info(self, args: dict[str, Any]) -> Any:
        node = self.node
        itf = node.interface
        return {
            "pid": os.getpid(), "version": self.version, "path": self.path,
            "name": node.name, "uuid": node.uuid.hex, "endpoint": node.endpoint,
            "interface": {"name": itf.name, "address": itf.address} if itf else None,
            "port": node.config.port, "groups": node.groups(), "headers": node.headers,
            "peers": len(node.peers()), "uptime": round(time.monotonic() - self.started, 3),
            "subscribers": self.subscribers, "stats": node.stats(),
            **{key: report() for key, report in self.reports.items()},
        }
