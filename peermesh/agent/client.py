"""A client of the local agent that needs neither pyzmq nor gevent.

The agent listens with a ZeroMQ ROUTER on ``ipc://PATH`` (see
``peermesh.agent.server`` for the requests and replies). This client speaks the
few parts of ZMTP 3.0 (RFC 23) such a connection uses over a plain
``AF_UNIX`` stream socket: the NULL security handshake as a DEALER, and
single-frame messages. It uses the ``_socket`` extension directly: the
``socket`` module's start-up (turning every constant into an enum member)
costs more than the whole request. Importing this module takes a few
milliseconds, so a CLI command that goes through the agent starts fast.

How it works::

    greeting = %xFF 8%x00 %x7F   ; signature
               %x03 %x00        ; version 3.0
               "NULL" 16%x00    ; mechanism
               %x00 31%x00      ; as-server, filler
    ready    = %x04 size %x05 "READY" property*   ; a command frame
    property = name-size name value-size(4 octets) value
    frame    = flags (%x00 short, %x02 long, +%x01 more, +%x04 command)
               size (1 or 8 octets, network order) body

Both sides send a greeting and a READY command (ours names ``Socket-Type``
``DEALER``); after that every message is one or more frames. A request is
one frame of msgpack; the ROUTER strips our identity, so the reply comes
back as one frame too. Command frames after the handshake (ZMTP 3.1
heartbeats, which the agent does not enable) are skipped.
"""

from __future__ import annotations

import _socket
import os
import time

import msgpack

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing at run time
if TYPE_CHECKING:
    from typing import Any, Iterator, Mapping, Optional

__all__ = ["AgentClient", "AgentError", "NoAgent", "AgentGone", "default_agent_path",
           "resolve_path", "MAX_PATH", "PROBE_TIMEOUT", "LOST_AFTER"]

#: longest socket path a Unix socket address holds (sun_path is 108 octets with the NUL)
MAX_PATH = 107
#: how long a client or a starting agent waits for an existing agent to answer
PROBE_TIMEOUT = 1.0
#: silence after which a subscriber considers the agent gone
LOST_AFTER = 5.0
#: largest frame accepted from the agent (a peer list of a very large mesh fits)
MAX_FRAME = 256 * 1024 * 1024


class AgentError(RuntimeError):
    """The agent answered a request with an error; ``code`` says which kind."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class NoAgent(RuntimeError):
    """No agent answers at the path (``str(exc)`` says so, naming the path)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


class AgentGone(RuntimeError):
    """An agent stopped answering, or said it stops, during a request or subscription."""


# --------------------------------------------------------------------------
# Where the socket lives


def default_agent_path(environ: Optional[Mapping[str, str]] = None,
                       uid: Optional[int] = None) -> str:
    """``$PEERMESH_AGENT``, else ``$XDG_RUNTIME_DIR/peermesh/agent.sock``, else /tmp."""
    env = os.environ if environ is None else environ
    explicit = env.get("PEERMESH_AGENT")
    if explicit:
        return os.path.abspath(explicit)
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return os.path.join(runtime, "peermesh", "agent.sock")
    return tmp_path(os.getuid() if uid is None else uid)


def tmp_path(uid: int) -> str:
    """The last-resort socket path of user ``uid``."""
    return f"/tmp/peermesh-{uid}/agent.sock"


def resolve_path(path: Optional[str] = None) -> str:
    """``path`` made absolute, or the default; ValueError when too long for a socket."""
    result = os.path.abspath(path) if path else default_agent_path()
    size = len(os.fsencode(result))
    if size > MAX_PATH:
        raise ValueError(f"agent socket path is {size} bytes, longer than a Unix socket "
                         f"allows ({MAX_PATH}): {result}")
    return result


# --------------------------------------------------------------------------
# ZMTP 3.0, as much as a DEALER with the NULL mechanism needs

_MORE, _LONG, _COMMAND = 0x01, 0x02, 0x04
_GREETING = (b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00")
             + b"\x00" + bytes(31))


def _frame(body: bytes, flags: int = 0) -> bytes:
    """One ZMTP frame: flags, size (short or long form), body."""
    if len(body) < 256:
        return bytes((flags, len(body))) + body
    return bytes((flags | _LONG,)) + len(body).to_bytes(8, "big") + body


def _ready(properties: Mapping[bytes, bytes]) -> bytes:
    """The READY command frame with ``properties``."""
    body = b"\x05READY" + b"".join(bytes((len(name),)) + name + len(value).to_bytes(4, "big")
                                   + value for name, value in properties.items())
    return _frame(body, _COMMAND)


_HELLO = _GREETING + _ready({b"Socket-Type": b"DEALER", b"Identity": b""})


class _NotZmtp(Exception):
    """The other end does not speak ZMTP 3 with the NULL mechanism."""


class _Closed(Exception):
    """The other end closed the connection."""


# --------------------------------------------------------------------------
# The client


class AgentClient:
    """A connection to the agent at ``path``. Use ``connect`` to find out if one answers."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.info: dict[str, Any] = {}
        self._sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        self._buffer = bytearray()
        self._next_id = 0

    @classmethod
    def connect(cls, path: str, timeout: float = PROBE_TIMEOUT,
                op: str = "info") -> "AgentClient":
        """A client whose agent answered ``op`` (kept in ``info``) within ``timeout``.

        Raises ``NoAgent`` when no socket file, nobody listening (a stale
        file), something that is not an agent, or no answer in time.
        """
        client = cls(path)
        deadline = time.monotonic() + timeout
        try:
            client._handshake(deadline)
            client.info = client.call(op, timeout=max(0.0, deadline - time.monotonic()))
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            client.close()  # no file, or a file nobody listens on (a dead agent's)
            raise NoAgent(path, f"no agent running at {path}") from None
        except PermissionError:
            client.close()
            raise NoAgent(path, f"no permission to connect to the agent at {path}") from None
        except (TimeoutError, AgentGone):
            client.close()
            raise NoAgent(path, f"the agent at {path} does not answer "
                                f"within {timeout:g} s") from None
        except (_NotZmtp, _Closed, OSError):
            client.close()
            raise NoAgent(path, f"something at {path} answers, but not like a "
                                "peermesh agent") from None
        except BaseException:
            client.close()
            raise
        if not isinstance(client.info, dict):
            client.close()
            raise NoAgent(path, f"something at {path} answers, but not like a peermesh agent")
        return client

    def _handshake(self, deadline: float) -> None:
        self._sock.settimeout(max(0.001, deadline - time.monotonic()))
        self._sock.connect(self.path)
        self._sock.sendall(_HELLO)
        greeting = self._read(64, deadline)
        if (greeting[0] != 0xFF or not greeting[9] & 1 or greeting[10] < 3
                or greeting[12:32].rstrip(b"\x00") != b"NULL"):
            raise _NotZmtp
        flags, body = self._read_frame(deadline)
        if not flags & _COMMAND or not body.startswith(b"\x05READY"):
            raise _NotZmtp

    def _read(self, size: int, deadline: float) -> bytes:
        """Exactly ``size`` octets; TimeoutError at ``deadline``, _Closed at end of stream."""
        buffer = self._buffer
        while len(buffer) < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self._sock.settimeout(remaining)
            chunk = self._sock.recv(max(65536, size - len(buffer)))
            if not chunk:
                raise _Closed
            buffer += chunk
        data = bytes(buffer[:size])
        del buffer[:size]
        return data

    def _read_frame(self, deadline: float) -> tuple[int, bytes]:
        flags = self._read(1, deadline)[0]
        if flags & _LONG:
            size = int.from_bytes(self._read(8, deadline), "big")
            if size > MAX_FRAME:
                raise _NotZmtp
        else:
            size = self._read(1, deadline)[0]
        return flags, self._read(size, deadline)

    def _recv(self, deadline: float) -> Optional[dict[str, Any]]:
        """The next message that is a msgpack map, or None at ``deadline``.

        Raises AgentGone when the connection breaks.
        """
        try:
            while True:
                frames = []
                while True:
                    flags, body = self._read_frame(deadline)
                    if flags & _COMMAND:
                        continue
                    frames.append(body)
                    if not flags & _MORE:
                        break
                try:
                    message = msgpack.unpackb(frames[-1], raw=False)
                except Exception:  # msgpack raises several kinds for bad input
                    continue
                if isinstance(message, dict):
                    return message
        except TimeoutError:
            return None
        except (_Closed, _NotZmtp, OSError) as exc:
            raise AgentGone(f"lost the connection to the agent at {self.path}") from exc

    def call(self, op: str, args: Optional[dict[str, Any]] = None,
             timeout: float = 10.0) -> Any:
        """Send one request and return its result; ``AgentError`` when the agent refuses it.

        Raises ``AgentGone`` when no reply comes within ``timeout`` seconds.
        """
        self._next_id += 1
        rid = self._next_id
        body = msgpack.packb({"op": op, "args": args or {}, "id": rid}, use_bin_type=True)
        try:
            self._sock.sendall(_frame(body))
        except OSError as exc:
            raise AgentGone(f"lost the connection to the agent at {self.path}") from exc
        deadline = time.monotonic() + timeout
        while True:
            reply = self._recv(deadline)
            if reply is None:
                raise AgentGone(f"the agent at {self.path} did not answer within {timeout:g} s")
            if reply.get("id") != rid:
                continue  # a late answer to an earlier request
            if reply.get("ok"):
                return reply.get("result")
            raise AgentError(str(reply.get("code", "failed")),
                             str(reply.get("error", "the agent refused the request")))

    def subscribe(self, types: Optional[list[str]] = None) -> None:
        """Turn this connection into an event subscription (see ``stream``)."""
        args: dict[str, Any] = {} if types is None else {"types": types}
        self.call("events", args, timeout=PROBE_TIMEOUT * 5)

    def follow(self, types: Optional[list[str]] = None,
               lost_after: float = LOST_AFTER) -> Iterator[dict[str, Any]]:
        """``subscribe``, then ``stream``."""
        self.subscribe(types)
        return self.stream(lost_after)

    def stream(self, lost_after: float = LOST_AFTER) -> Iterator[dict[str, Any]]:
        """After ``subscribe``: stream messages, ``{"event": ...}`` or ``{"dropped": n}``.

        Ends with ``AgentGone`` when the agent says it stops or goes silent
        for ``lost_after`` seconds (it sends a heartbeat every second).
        """
        while True:
            message = self._recv(time.monotonic() + lost_after)
            if message is None:
                raise AgentGone(f"lost contact with the agent at {self.path} "
                                f"(nothing for {lost_after:g} s)")
            if "end" in message:
                raise AgentGone(f"the agent at {self.path} stopped: {message['end']}")
            if "event" in message or "dropped" in message:
                yield message

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "AgentClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
