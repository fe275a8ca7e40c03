"""A link to a flux-core broker through its local connector (``local://PATH``).

``LocalLink`` is what ``FluxClient`` uses in place of a ZeroMQ DEALER for a
``local://`` endpoint: a Unix stream socket on the caller's gevent hub,
carrying the framing of ``peermesh.wire.flux_local``. It connects and
reads the broker's one-octet answer (0: accepted, else an errno value);
``try_send`` writes one whole message (sends from several greenlets never
interleave), ``serve`` hands each message read to ``on_message(first,
rest)`` until the broker closes the connection (then ``eof`` is true) or
sends what the framing refuses (a message over ``limit`` octets included:
the stream cannot be resynchronised, so the link ends). ``uri_path`` reads
a ``local://`` URI (``FLUX_URI``'s form).
"""

from __future__ import annotations

import errno as errnos
import logging
import socket
from typing import Callable, Optional, Sequence

import gevent.lock
import gevent.socket

from ..errors import ProtocolError
from ..wire.flux import Errno
from ..wire.flux_local import AUTH_OK, Reader, encode
from .errors import FluxError

__all__ = ["LocalLink", "uri_path", "LOCAL_SCHEME", "is_local"]

log = logging.getLogger(__name__)

LOCAL_SCHEME = "local://"
_READ = 1 << 16


def is_local(endpoint: str) -> bool:
    """Whether ``endpoint`` names a local connector (``local://PATH``)."""
    return endpoint.startswith(LOCAL_SCHEME)


def uri_path(uri: str) -> str:
    """The socket path of ``local://PATH``; ValueError for another URI."""
    if not is_local(uri) or len(uri) == len(LOCAL_SCHEME):
        raise ValueError(f"{uri!r} is not a local connector URI (local://PATH)")
    return uri[len(LOCAL_SCHEME):]


class LocalLink:
    """A Unix stream socket to a broker's local connector (see the module's docstring)."""

    def __init__(self, uri: str, timeout: float, limit: int) -> None:
        path = uri_path(uri)
        sock = gevent.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            answer = sock.recv(1)
        except OSError as exc:
            sock.close()
            raise FluxError(Errno.EHOSTUNREACH, f"cannot connect to {uri}: "
                            f"{exc.strerror or type(exc).__name__}", "connect") from None
        if answer != AUTH_OK:
            sock.close()
            code = answer[0] if answer else errnos.ECONNRESET
            raise FluxError(code, f"the broker at {uri} refused the connection "
                            f"({errnos.errorcode.get(code, code)})", "connect")
        sock.settimeout(None)
        self.socket = sock
        self.uri = uri
        #: octets of body a message read may have
        self.limit = limit
        self.closed = False
        #: the broker closed the connection (or broke the framing)
        self.eof = False
        self._writing = gevent.lock.Semaphore()

    def try_send(self, frames: Sequence[bytes], look: bool = True) -> bool:
        """Write one message whole; OSError once the connection is gone."""
        data = encode(frames)
        with self._writing:
            self.socket.sendall(data)
        return True

    def serve(self, on_message: Callable[[bytes, list[bytes]], None],
              on_oversized: Optional[Callable[[bytes], None]] = None) -> None:
        """Read messages until the connection ends (``eof``) or the link is closed."""
        reader = Reader(self.limit)
        while not self.closed:
            try:
                data = self.socket.recv(_READ)
            except OSError:
                data = b""
            if not data:
                break
            try:
                messages = reader.feed(data)
            except ProtocolError as exc:
                log.debug("flux local link %s: %s; closing", self.uri, exc.reason)
                if on_oversized is not None and "limit" in exc.reason:
                    on_oversized(b"")
                break
            for frames in messages:
                on_message(frames[0], frames[1:])
        self.eof = not self.closed

    def close(self, linger: float = 0.0) -> None:
        if not self.closed:
            self.closed = True
            self.socket.close()
