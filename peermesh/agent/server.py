"""The local agent: a long-lived node that the CLI (or any program) drives over a socket.

``peermesh agent`` runs one node for as long as the host is up and listens on
a Unix stream socket, so ``peermesh peers``, ``shout``, ``whisper``, ``join``,
``leave`` and ``events`` answer at once instead of starting a node of their
own and waiting for the mesh to be found. The library (the node), the agent
(this module) and the client (``peermesh.agent.client``) are apart; they
meet only in the versioned protocol below.

Where the socket lives
----------------------
``$PEERMESH_AGENT`` if set, else ``$XDG_RUNTIME_DIR/peermesh/agent.sock``,
else ``/tmp/peermesh-$UID/agent.sock``; ``--agent PATH`` overrides all three.
The socket's directory is private whatever the umask: a missing one is
created with mode 0700, and an existing one must be a real directory owned by
the user with no group or other permissions, or the agent refuses to use it
(naming its owner and mode). The socket file gets mode 0600. So only the
agent's own user can drive it: other users run their own agent, or run as the
agent's user. Next to the socket, ``agent.sock.lock`` holds an
exclusive ``flock`` and the agent's pid for as long as the agent runs.

Protocol
--------
Every message, either way, is one frame: a 4-octet big-endian length, then
that many octets holding one msgpack map. The first frame from each side is
the handshake: the client sends ``{"hello": PROTOCOL}`` (``PROTOCOL`` in
``peermesh.agent.client``, today 1), the agent answers ``{"hello": PROTOCOL,
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
seconds may consider the agent gone.

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
import fcntl
import logging
import os
import socket
import stat
import time
from collections import deque
from typing import Any, Callable, Optional
from uuid import UUID

import msgpack

from ..errors import PeermeshError, ProtocolError
from ..wire import jsonsafe
from ..wire.frames import as_bytes
from ..counters import Counters
from .client import (LOST_AFTER, MAX_PATH, PROBE_TIMEOUT, PROTOCOL, AgentClient, AgentError,
                     AgentGone, AgentMismatch, NoAgent, default_agent_path, frame,
                     resolve_path)

__all__ = ["default_agent_path", "resolve_path", "claim_path", "AgentClaim", "AgentServer",
           "AgentClient", "AgentError", "AgentRunning", "AgentPathError", "NoAgent",
           "AgentMismatch", "AgentGone", "PROTOCOL", "MAX_PATH", "PROBE_TIMEOUT", "LOST_AFTER"]

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
#: longest ``wait`` argument, in seconds
MAX_WAIT = 3600.0
#: a request frame may be this much larger than the node's ``max_message``
REQUEST_OVERHEAD = 64 * 1024
#: seconds a new connection has to send its handshake
HANDSHAKE_TIMEOUT = 5.0
#: seconds a reply may wait for the client to read before the client is disconnected
SEND_TIMEOUT = 5.0
#: descriptors kept for the node's own peers and sockets, beyond those open at start
NODE_RESERVE = 128
_WARN_EVERY = 60.0  # seconds between two log lines about the same kind of misbehaviour


# --------------------------------------------------------------------------
# Errors (the client's own are in peermesh.agent.client)


class AgentRunning(PeermeshError, RuntimeError):
    """Another agent holds the socket path."""

    def __init__(self, path: str, pid: Optional[int], answering: bool = True) -> None:
        who = f"pid {pid}" if pid else "pid unknown"
        if not answering:
            who += "; it holds the lock but does not answer"
        super().__init__(f"an agent is already running at {path} ({who})")
        self.path = path
        self.pid = pid


class AgentPathError(PeermeshError, RuntimeError):
    """The socket path or its directory cannot be used safely."""


# --------------------------------------------------------------------------
# Where the socket lives (default_agent_path, resolve_path: peermesh.agent.client)


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


def _prepare_directory(path: str) -> None:
    """Create the socket's directory (0700, whatever the umask) or check that the existing
    one is private: a directory (not a link) of this user with no group or other bits."""
    directory = os.path.dirname(path) or "."
    try:
        os.makedirs(os.path.dirname(directory) or ".", exist_ok=True)
        try:
            os.mkdir(directory, 0o700)
            os.chmod(directory, 0o700)   # mkdir's mode is narrowed by the umask, never widened
        except FileExistsError:
            pass
        st = os.lstat(directory)
    except OSError as exc:
        raise AgentPathError(f"cannot create the agent directory {directory}: "
                             f"{exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "link or file"
        raise AgentPathError(
            f"{directory} is not a private directory of this user (a {kind} of owner uid "
            f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}; the agent needs one owned by "
            f"uid {os.getuid()} with mode 0700); fix it, remove it or choose another path "
            "with --agent or $PEERMESH_AGENT")


def _listening(path: str) -> bool:
    """True when something accepts connections on the Unix socket ``path`` (no ZeroMQ).

    PermissionError when we may not connect: someone may well be listening.
    """
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(PROBE_TIMEOUT)
        probe.connect(path)
        return True
    except PermissionError:
        raise
    except OSError:
        return False
    finally:
        probe.close()


class AgentClaim:
    """The right to serve at ``path``: a held ``flock`` on ``path + ".lock"``."""

    def __init__(self, path: str, lock_fd: int, removed_stale: bool) -> None:
        self.path = path
        self.lock_path = path + ".lock"
        self.removed_stale = removed_stale
        self._fd: Optional[int] = lock_fd
        self._socket_id: Optional[tuple[int, int]] = None

    def bound(self) -> None:
        """Remember which file our bind created, so release removes only that one."""
        try:
            st = os.stat(self.path)
            self._socket_id = (st.st_dev, st.st_ino)
        except OSError:
            self._socket_id = None

    def release(self) -> None:
        """Remove our socket file and the lock file, then drop the lock."""
        if self._fd is None:
            return
        try:
            st = os.lstat(self.path)
            if self._socket_id is not None and (st.st_dev, st.st_ino) == self._socket_id:
                os.unlink(self.path)
        except OSError:
            pass
        try:
            os.unlink(self.lock_path)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None


def claim_path(path: str, probe_timeout: float = PROBE_TIMEOUT) -> AgentClaim:
    """Make ``path`` ours: lock it, refuse if a live agent answers there, remove a stale file.

    Raises ``AgentRunning`` (another agent holds or answers at the path) or
    ``AgentPathError``.
    """
    _prepare_directory(path)
    lock_path = path + ".lock"
    for _ in range(10):
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise AgentPathError(f"cannot open the agent lock file {lock_path}: "
                                 f"{exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            info = _probe(path, probe_timeout)
            if info is not None:
                raise AgentRunning(path, _int(info.get("pid")) or pid) from None
            raise AgentRunning(path, pid, answering=False) from None
        except OSError as exc:
            os.close(fd)
            raise AgentPathError(f"cannot lock {lock_path}: {exc.strerror or exc}") from None
        # The previous holder may have removed the file between our open and our lock.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock_path))
        except OSError:
            same = False
        if same:
            break
        os.close(fd)
    else:
        raise AgentPathError(f"cannot lock {lock_path}: it keeps being replaced")
    try:
        removed = _clear_stale(path, probe_timeout)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except BaseException:
        os.close(fd)
        raise
    return AgentClaim(path, fd, removed)


def _clear_stale(path: str, probe_timeout: float) -> bool:
    """Remove a socket file nobody answers on; True if one was removed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        raise AgentPathError(f"{path} exists and is not a socket; remove it or choose "
                             "another path with --agent")
    try:
        _listening(path)
    except PermissionError:  # never remove what may be another user's live agent
        raise AgentPathError(f"{path} belongs to someone else (no permission to connect); "
                             "choose another path with --agent") from None
    info = _probe(path, probe_timeout)
    if info is not None:  # an agent that does not use the lock (e.g. its lock file was deleted)
        raise AgentRunning(path, _int(info.get("pid")))
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise AgentPathError(f"cannot remove the stale agent socket {path}: "
                             f"{exc.strerror or exc}") from None
    log.info("removed the stale agent socket %s", path)
    return True


def _read_pid(fd: int) -> Optional[int]:
    try:
        return _int(os.pread(fd, 32, 0).decode("ascii", "replace").strip())
    except OSError:
        return None


def _int(value: Any) -> Optional[int]:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _probe(path: str, timeout: float) -> Optional[dict[str, Any]]:
    """The ping answer of an agent at ``path``, or None when nobody answers in time."""
    try:
        client = AgentClient.connect(path, timeout, op="ping")
    except AgentMismatch as exc:  # an agent of another version: it runs all the same
        return {"pid": exc.pid}
    except NoAgent:
        return None
    try:
        return client.info
    finally:
        client.close()

# --------------------------------------------------------------------------
# The server


class _Failure(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


#: what ``_read_frame`` returns at the end of the stream (a body may be msgpack nil: None)
_EOF: Any = object()


class BadRequest(ProtocolError):
    """A request frame the agent answers with an error: ``code``, and ``rid`` (the
    request's id, when it had a usable one)."""

    def __init__(self, reason: str, code: str = "bad-request", rid: Any = None) -> None:
        super().__init__(reason)
        self.code, self.rid = code, rid


def unpack_body(body: bytes) -> Any:
    """A frame's body unpacked; ``BadRequest`` if it is not one msgpack value or nests
    deeper than ``jsonsafe.MAX_DEPTH``."""
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
        buffer = self.buffer
        while len(buffer) < size:
            chunk = self.sock.recv(min(max(65536, size - len(buffer)), 1 << 20))
            if not chunk:
                return None
            buffer += chunk
        data = bytes(buffer[:size])
        del buffer[:size]
        return data

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


_HEARTBEAT = frame({"heartbeat": True})
_STREAM_BATCH = 1 << 20  # octets of events joined into one send


def event_message(event: Any) -> dict[str, Any]:
    """An ``Event`` as the agent streams it (frames stay bytes)."""
    return {"type": event.type.value, "peer": event.peer.hex if event.peer else None,
            "name": event.name, "group": event.group, "frames": list(event.frames),
            "headers": dict(event.headers) if event.headers is not None else None,
            "address": event.address, "reason": event.reason}


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
        self._ops: dict[str, Callable[[dict[str, Any]], Any]] = {
            "ping": self._op_ping, "info": self._op_info, "peers": self._op_peers,
            "groups": self._op_groups, "join": self._op_join, "leave": self._op_leave,
            "contest": self._op_contest, "leader": self._op_leader,
            "shout": self._op_shout, "whisper": self._op_whisper,
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
        return frame({"hello": PROTOCOL, "pid": os.getpid(), "version": self.version, **extra})

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
        head = conn.read(4)
        if head is None:
            return _EOF
        size = int.from_bytes(head, "big")
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
        handler = self._ops.get(op)
        if handler is None:
            known = ", ".join(sorted([*self._ops, "events"]))
            self._reply(conn, rid,
                        error=("unknown-op", f"unknown op {op[:40]!r}; known: {known}"))
            return
        if self._pool.full():
            self._reply(conn, rid, error=("busy", "too many requests in progress"))
            return
        self._pool.spawn(self._handle, handler, conn, rid, args)

    def _handle(self, handler: Callable[[dict[str, Any]], Any], conn: _Connection,
                rid: Any, args: dict[str, Any]) -> None:
        from ..errors import NodeStateError, PeerNotResponding, UnknownPeerError

        try:
            result = handler(args)
        except _Failure as exc:
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

    @staticmethod
    def _answer(rid: Any, result: Any = None,
                error: Optional[tuple[str, str]] = None) -> bytes:
        reply: dict[str, Any]
        if error is None:
            reply = {"ok": True, "result": result}
        else:
            reply = {"ok": False, "code": error[0], "error": error[1]}
        if rid is not None:
            reply["id"] = rid
        return frame(reply)

    def _reply(self, conn: _Connection, rid: Any, result: Any = None,
               error: Optional[tuple[str, str]] = None) -> None:
        conn.send(self._answer(rid, result, error))

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
        sub.backlog.append(self._answer(rid, {"subscribed": True}))  # before any event
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
                batch = [_HEARTBEAT]
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

    def _settled_at(self) -> float:
        """When every peer on the LAN has beaconed at least once since the agent started."""
        return self.started + self.node.config.interval * 1.25 + 0.05

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

    def _op_peers(self, args: dict[str, Any]) -> Any:
        """Peers with their liveness (``PeerInfo.to_dict``) and ``broker``."""
        from ..overlay.election import peer_entries

        group = _opt_str(args, "group")
        wait = _wait_arg(args)
        settled = min(self._settled_at(), time.monotonic() + wait)
        while time.monotonic() < settled:
            self._wait_change(settled)
        node = self.node
        uuids = node.peers_by_group(group) if group is not None else node.peers()
        infos = []
        for uuid in uuids:
            try:
                infos.append(node.peer_info(uuid))
            except Exception:  # gone meanwhile
                continue
        infos.sort(key=lambda info: (info.name, info.uuid.hex))
        return peer_entries(node, infos)

    def _op_groups(self, args: dict[str, Any]) -> Any:
        node = self.node
        leaders = {g: u.hex for g in node.groups() if (u := node.leader(g)) is not None}
        return {"joined": node.groups(), "known": node.known_groups(), "leaders": leaders}

    def _op_contest(self, args: dict[str, Any]) -> Any:
        group = _req_str(args, "group")
        self.node.contest(group)
        return {"group": group, "contested": self.node.contested()}

    def _op_leader(self, args: dict[str, Any]) -> Any:
        group = _req_str(args, "group")
        leader = self.node.leader(group)
        return {"group": group, "leader": leader.hex if leader is not None else None,
                "self": leader == self.node.uuid}

    def _op_join(self, args: dict[str, Any]) -> Any:
        group = _req_str(args, "group")
        changed = group not in self.node.groups()
        self.node.join(group)
        return {"group": group, "changed": changed, "groups": self.node.groups()}

    def _op_leave(self, args: dict[str, Any]) -> Any:
        group = _req_str(args, "group")
        changed = group in self.node.groups()
        self.node.leave(group)
        return {"group": group, "changed": changed, "groups": self.node.groups()}

    def _op_shout(self, args: dict[str, Any]) -> Any:
        node = self.node
        group = _req_str(args, "group")
        frames = _frames_arg(args)
        wait = _wait_arg(args)
        confirm = _bool_arg(args, "confirm", True)
        deadline = time.monotonic() + wait
        settled = min(self._settled_at(), deadline)
        while True:
            now = time.monotonic()
            members = node.peers_by_group(group)
            if members and now >= settled:
                break
            if now >= deadline:
                if members:
                    break
                raise _Failure("not-found", f"no peer in group {group!r} appeared "
                                            f"within {wait:g} s")
            self._wait_change(deadline if not members else settled)
        node.shout(group, *frames)
        confirmed = node.flush(1.0) if confirm else None
        return {"group": group, "peers": len(members), "confirmed": confirmed}

    def _op_whisper(self, args: dict[str, Any]) -> Any:
        from ..errors import AmbiguousPeerError, UnknownPeerError

        node = self.node
        target = _req_str(args, "peer")
        frames = _frames_arg(args)
        wait = _wait_arg(args)
        confirm = _bool_arg(args, "confirm", True)
        deadline = time.monotonic() + wait
        exact = _is_full_uuid(target)
        sure = min(self._settled_at(), deadline)
        while True:
            now = time.monotonic()
            try:
                uuid = node.find_peer(target)
                if exact or now >= sure:
                    break
                wake = sure
            except AmbiguousPeerError as exc:
                raise _Failure("ambiguous", f"{exc}; give more of the UUID") from None
            except UnknownPeerError:
                if now >= deadline:
                    raise _Failure("not-found", f"no peer matching {target!r} appeared "
                                                f"within {wait:g} s") from None
                wake = deadline
            self._wait_change(wake)
        name = node.peer_name(uuid)
        node.whisper(uuid, *frames)
        confirmed = node.flush(1.0) if confirm else None
        return {"peer": uuid.hex, "name": name, "confirmed": confirmed}


def _req_str(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value:
        raise _Failure("bad-args", f"{key} must be a non-empty string")
    return value


def _opt_str(args: dict[str, Any], key: str) -> Optional[str]:
    if args.get(key) is None:
        return None
    return _req_str(args, key)


def _wait_arg(args: dict[str, Any]) -> float:
    value = args.get("wait", 0)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_WAIT:
        raise _Failure("bad-args", f"wait must be a number of seconds from 0 to {MAX_WAIT:g}")
    return float(value)


def _bool_arg(args: dict[str, Any], key: str, default: bool) -> bool:
    value = args.get(key, default)
    if not isinstance(value, bool):
        raise _Failure("bad-args", f"{key} must be true or false")
    return value


def _frames_arg(args: dict[str, Any]) -> list[bytes]:
    if "frames" in args:
        frames = args["frames"]
        if not isinstance(frames, list) or not frames or len(frames) > 1024:
            raise _Failure("bad-args", "frames must be a list of 1 to 1024 byte strings")
    elif "message" in args:
        frames = [args["message"]]
    else:
        raise _Failure("bad-args", "give message (bytes or str) or frames (a list)")
    out = []
    for part in frames:
        if isinstance(part, str):
            part = part.encode("utf-8")
        if not isinstance(part, bytes):
            raise _Failure("bad-args", "message and frames must be bytes or strings")
        out.append(part)
    return out


def _is_full_uuid(text: str) -> bool:
    try:
        UUID(text)
        return True
    except ValueError:
        return False
