"""A client of the local agent that needs neither pyzmq nor gevent.

The agent listens on a Unix stream socket. Every message either way is one
frame: a 4-octet big-endian length, then that many octets of msgpack::

    frame = length:uint32be msgpack-map

The first frame each side sends is the handshake, ``{"hello": PROTOCOL}``;
the agent adds ``pid`` and ``version`` to its own and, when the numbers
differ, an ``error`` (and closes). The client sends its handshake and its
first request in one write and never waits for the handshake alone, so a
command through the agent costs one round trip. See ``peermesh.agent.protocol``
for the requests and replies.

This module loads only msgpack and the ``_socket`` extension (the ``socket``
module's start-up, which turns every constant into an enum member, costs
more than a whole request), so a CLI command through the agent starts fast.
"""

from __future__ import annotations

import _socket
import time

import msgpack

from ..errors import PeermeshError
from ..wire.agent import HEAD_SIZE, frame_size
from .path import MAX_PATH, default_agent_path, resolve_path
from .protocol import PROTOCOL, frame, take_exact

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing at run time
if TYPE_CHECKING:
    from typing import Any, Iterator, Optional

__all__ = ["AgentClient", "AgentError", "NoAgent", "AgentMismatch", "AgentGone",
           "default_agent_path", "resolve_path", "PROTOCOL", "MAX_PATH", "PROBE_TIMEOUT",
           "LOST_AFTER", "MAX_REPLY", "frame"]

#: how long a client or a starting agent waits for an existing agent to answer
PROBE_TIMEOUT = 1.0
#: silence after which a subscriber considers the agent gone
LOST_AFTER = 5.0
#: largest frame accepted from the agent (a peer list of a very large mesh fits)
MAX_REPLY = 256 * 1024 * 1024
_ZMTP_SIGNATURE = 0xFF  # first octet of a ZeroMQ greeting: an agent older than PROTOCOL 1


class AgentError(PeermeshError, RuntimeError):
    """The agent answered a request with an error; ``code`` says which kind."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class NoAgent(PeermeshError, RuntimeError):
    """No agent answers at the path (``str(exc)`` says so, naming the path)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


class AgentMismatch(NoAgent):
    """An agent answers, but speaks another protocol version: it must be restarted."""

    def __init__(self, path: str, theirs: Any, pid: Any = None) -> None:
        who = f" (pid {pid})" if isinstance(pid, int) else ""
        super().__init__(path, f"the agent at {path}{who} speaks protocol {theirs}, this "
                               f"client {PROTOCOL}: restart the agent")
        self.protocol = theirs
        self.pid = pid if isinstance(pid, int) else None


class AgentGone(PeermeshError, RuntimeError):
    """An agent stopped answering, or said it stops, during a request or subscription."""


class _NotAgent(Exception):
    """The other end does not speak the agent protocol."""


class _Closed(Exception):
    """The other end closed the connection."""


# --------------------------------------------------------------------------
# The client


class AgentClient:
    """A connection to the agent at ``path``. Use ``connect`` to find out if one answers."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.info: dict[str, Any] = {}
        self.hello: dict[str, Any] = {}
        self._sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        self._buffer = bytearray()
        self._next_id = 0
        self._unsent = frame({"hello": PROTOCOL})  # the handshake goes with the first request

    @classmethod
    def connect(cls, path: str, timeout: float = PROBE_TIMEOUT,
                op: str = "info") -> "AgentClient":
        """A client whose agent answered ``op`` (kept in ``info``) within ``timeout``.

        Raises ``NoAgent`` when no socket file, nobody listening (a stale
        file), something that is not an agent, or no answer in time;
        ``AgentMismatch`` (a ``NoAgent``) when the agent speaks another
        protocol version.
        """
        client = cls(path)
        deadline = time.monotonic() + timeout
        try:
            client._sock.settimeout(max(0.001, timeout))
            client._sock.connect(path)
            client.info = client.call(op, timeout=max(0.0, deadline - time.monotonic()))
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            client.close()  # no file, or a file nobody listens on (a dead agent's)
            raise NoAgent(path, f"no agent running at {path}") from None
        except PermissionError:
            client.close()
            raise NoAgent(path, f"no permission to connect to the agent at {path}") from None
        except (TimeoutError, AgentGone) as exc:
            client.close()
            if exc.__cause__ is not None:  # it closed, reset or sent nonsense: no timeout
                raise NoAgent(path, f"something at {path} answers, but not like a "
                                    "peermesh agent") from None
            raise NoAgent(path, f"the agent at {path} does not answer "
                                f"within {timeout:g} s") from None
        except (_NotAgent, OSError):
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

    def _read(self, size: int, deadline: float) -> bytes:
        """Exactly ``size`` octets; TimeoutError at ``deadline``, _Closed at end of stream."""
        sock = self._sock

        def recv(most: int) -> bytes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            sock.settimeout(remaining)
            return sock.recv(most)

        data = take_exact(self._buffer, size, recv)
        if data is None:
            raise _Closed
        return data

    def _read_message(self, deadline: float) -> Any:
        """The next frame, unpacked; _NotAgent for what no agent sends."""
        head = self._read(HEAD_SIZE, deadline)
        if head[0] == _ZMTP_SIGNATURE and not self.hello:
            raise AgentMismatch(self.path, 0)  # a ZeroMQ agent: protocol 0
        size = frame_size(head)
        if size > MAX_REPLY:
            raise _NotAgent
        try:
            return msgpack.unpackb(self._read(size, deadline), raw=False)
        except (TimeoutError, _Closed):
            raise
        except Exception:  # msgpack raises several kinds for bad input
            raise _NotAgent from None

    def _handshake(self, deadline: float) -> None:
        """Read the agent's handshake (sent before any reply); AgentMismatch if it differs."""
        hello = self._read_message(deadline)
        if not isinstance(hello, dict) or "hello" not in hello:
            raise _NotAgent
        if hello["hello"] != PROTOCOL:
            raise AgentMismatch(self.path, hello["hello"], hello.get("pid"))
        if "error" in hello:
            raise NoAgent(self.path, f"the agent at {self.path} refused the connection: "
                                     f"{hello['error']}")
        self.hello = hello

    def _recv(self, deadline: float) -> Optional[dict[str, Any]]:
        """The next message that is a map, or None at ``deadline``.

        Raises AgentGone when the connection breaks.
        """
        try:
            if not self.hello:
                self._handshake(deadline)
            while True:
                message = self._read_message(deadline)
                if isinstance(message, dict):
                    return message
        except TimeoutError:
            return None
        except (_Closed, _NotAgent, OSError) as exc:
            raise AgentGone(f"lost the connection to the agent at {self.path}") from exc

    def call(self, op: str, args: Optional[dict[str, Any]] = None,
             timeout: float = 10.0) -> Any:
        """Send one request and return its result; ``AgentError`` when the agent refuses it.

        Raises ``AgentGone`` when no reply comes within ``timeout`` seconds.
        """
        self._next_id += 1
        rid = self._next_id
        data = self._unsent + frame({"op": op, "args": args or {}, "id": rid})
        self._unsent = b""
        try:
            self._sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it closed: what it sent before (a refusal) is read below
        except OSError as exc:
            raise AgentGone(f"lost the connection to the agent at {self.path}") from exc
        deadline = time.monotonic() + timeout
        while True:
            reply = self._recv(deadline)
            if reply is None:
                raise AgentGone(f"the agent at {self.path} did not answer within {timeout:g} s")
            if reply.get("id") != rid:
                continue  # a late answer to an earlier request, or a stream message
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
