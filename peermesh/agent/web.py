"""The agent's web view: one page that draws the mesh and follows it live.

``peermesh agent --web HOST:PORT`` serves, with gevent's own WSGI server on
the agent's hub:

========================  ====================================================
``GET /``                 the page (``webui/index.html``, ``view.js``,
                          ``view.css``, ``favicon.svg``: plain SVG and JavaScript
                          shipped in the package; nothing is fetched from
                          elsewhere)
``GET /api/mesh``         ``MeshView.snapshot()`` as JSON
``GET /api/stream``       server-sent events: ``snapshot`` (the whole picture,
                          first, every ``REFRESH`` seconds and after a client
                          fell behind), ``change`` (one event folded in),
                          ``flux`` (``{"flux": ...}``: a Flux tree changed)
========================  ====================================================

While a page follows the stream (or ``/api/mesh`` was asked lately), the
trees of the mesh's Flux instances are asked of the instances themselves
(``peermesh.agent.fluxtree``, bounded there).

The view is read-only: no request changes the node. Message content is never
shown (only its size).

Access
------
The address is loopback unless ``public`` is given: a loopback view is open
to every local user (as a loopback port is), and requests whose ``Host`` is not
a loopback name are refused, so a web page elsewhere cannot reach it through a
rebound DNS name. With ``public`` (any address) a token is required:
``?token=`` on the page's address (the answer sets it as a cookie for the page's own requests),
the cookie, or ``Authorization: Bearer``; compared in constant time.

Bounds
------
At most ``MAX_STREAMS`` (16) pages follow the stream at once (one more gets
503; a page that went away frees its place within ``KEEPALIVE``, 5 s) and
``MAX_CONNECTIONS`` (64) requests are served at once, and a client that
takes longer than ``SOCKET_TIMEOUT`` (10 s) to send its request or to read
what is sent is disconnected; each stream holds at most ``BACKLOG`` (2,000)
changes not yet sent: a page that falls further behind gets a fresh snapshot
instead of the changes it missed.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import time
from collections import deque
from http.cookies import SimpleCookie
from importlib import resources
from typing import Any, Callable, Iterator, Optional
from urllib.parse import parse_qs

from ..config import is_loopback
from .fluxtree import LINGER, TreeWatch
from .meshview import MeshView

__all__ = ["WebView", "MAX_STREAMS", "MAX_CONNECTIONS", "BACKLOG", "REFRESH"]

log = logging.getLogger(__name__)

#: pages following the stream at once
MAX_STREAMS = 16
#: requests served at once
MAX_CONNECTIONS = 64
#: seconds a client may take to send its request, or to take what is sent to it
SOCKET_TIMEOUT = 10.0
#: changes held for one page before it is sent a snapshot instead
BACKLOG = 2000
#: seconds between two snapshots on a stream (liveness fields move without events)
REFRESH = 10.0
#: seconds between two keep-alive comments on a quiet stream (a page that went away frees
#: its place when one is written)
KEEPALIVE = 5.0
_COOKIE = "peermesh_token"
_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
          "/view.js": ("view.js", "text/javascript; charset=utf-8"),
          "/view.css": ("view.css", "text/css; charset=utf-8"),
          "/favicon.svg": ("favicon.svg", "image/svg+xml")}
_SECURITY = [("X-Content-Type-Options", "nosniff"), ("Cache-Control", "no-store"),
             ("Referrer-Policy", "no-referrer"), ("X-Frame-Options", "DENY"),
             ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; "
                                         "frame-ancestors 'none'")]


class _Stream:
    """One page following the mesh: changes not yet sent and a wake-up."""

    __slots__ = ("backlog", "behind", "wake")

    def __init__(self) -> None:
        import gevent.event

        self.backlog: deque[bytes] = deque()
        self.behind = False
        self.wake = gevent.event.Event()


class WebView:
    """Serves the page for ``node`` at ``host:port`` on the current hub.

    ``publish(event)`` for each event (the owner drains the node's queue),
    ``close()`` to stop. ``public`` allows a non-loopback address and needs a
    token: ``token``, or one made (``self.token``). A token given without
    ``public`` is needed all the same.
    """

    def __init__(self, node: Any, host: str = "127.0.0.1", port: int = 0, *,
                 public: bool = False, token: Optional[str] = None) -> None:
        if not is_loopback(host) and not public:
            raise ValueError(f"the web view shows the mesh to whoever connects: {host} is not "
                             "a loopback address (give --web-public to serve it there, "
                             "behind a token)")
        self.node = node
        self.view = MeshView(node)
        self.host, self.port = host, port
        self.loopback = is_loopback(host)
        self.token = token or (secrets.token_urlsafe(24) if public else None)
        self._streams: set[_Stream] = set()
        self._server: Any = None
        self._hosts: frozenset[str] = frozenset()
        self._snapshot: Optional[bytes] = None   # cached until the next change
        self.refused = 0
        self._asked = float("-inf")   # when /api/mesh was last asked (monotonic)
        self.trees = TreeWatch(self.view, self._watched, self._trees_changed)

    @property
    def url(self) -> str:
        """The page's address (with the token, when one is needed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        query = f"/?token={self.token}" if self.token else "/"
        return f"http://{host}:{self.port}{query}"

    def start(self) -> "WebView":
        """Listen (OSError when the address cannot be bound) and serve."""
        import gevent.pool
        from gevent.pywsgi import WSGIServer

        class Server(WSGIServer):
            def handle(self, sock: Any, address: Any) -> None:
                sock.settimeout(SOCKET_TIMEOUT)   # a client that stalls gives its place up
                super().handle(sock, address)

        server = Server((self.host, self.port), self._app, log=None, error_log=_ErrorLog(),
                        spawn=gevent.pool.Pool(MAX_CONNECTIONS))
        server.start()
        self._server = server
        self.port = server.server_port
        self._hosts = frozenset(f"{name}:{self.port}" for name in
                                ("127.0.0.1", "localhost", "[::1]", self.host,
                                 f"[{self.host}]"))
        return self

    def close(self) -> None:
        """Stop serving; streams end."""
        if self._server is None:
            return
        server, self._server = self._server, None
        self.trees.close()
        for stream in list(self._streams):
            stream.wake.set()
        server.stop(timeout=1.0)

    @property
    def streams(self) -> int:
        """Pages following the stream now."""
        return len(self._streams)

    # --- events ---------------------------------------------------------

    def publish(self, event: Any) -> None:
        """Fold ``event`` into the view and queue the change for every page (never blocks)."""
        if self._server is None or str(getattr(event.type, "value", "")) == "STOP":
            return
        change = self.view.apply(event)
        self._snapshot = None
        if self._streams:
            self._push(_sse("change", change))

    def _push(self, data: bytes) -> None:
        """Queue ``data`` for every page."""
        for stream in self._streams:
            if stream.behind:
                continue
            if len(stream.backlog) >= BACKLOG:
                stream.backlog.clear()
                stream.behind = True
            else:
                stream.backlog.append(data)
            stream.wake.set()

    def _watched(self) -> bool:
        """Whether someone looks: the Flux trees are walked only then."""
        return self._server is not None and (
            bool(self._streams) or time.monotonic() - self._asked < LINGER)

    def _trees_changed(self) -> None:
        self._snapshot = None
        if self._streams:
            self._push(_sse("flux", {"flux": self.view.flux()}))

    def _snapshot_json(self) -> bytes:
        if self._snapshot is None:
            self._snapshot = json.dumps(self.view.snapshot(), separators=(",", ":"),
                                        ensure_ascii=False).encode()
        return self._snapshot

    # --- HTTP -----------------------------------------------------------

    def _app(self, environ: dict[str, Any], start: Callable[..., Any]) -> Any:
        method = environ.get("REQUEST_METHOD", "")
        path = environ.get("PATH_INFO", "")
        refusal = self._refusal(environ)
        if refusal is not None:
            self.refused += 1
            return _plain(start, refusal[0], refusal[1])
        if method not in ("GET", "HEAD"):
            return _plain(start, "405 Method Not Allowed", "the web view is read-only",
                          [("Allow", "GET, HEAD")])
        extra = []
        query = parse_qs(environ.get("QUERY_STRING", ""))
        if self.token and query.get("token"):
            extra.append(("Set-Cookie", f"{_COOKIE}={self.token}; HttpOnly; "
                                        "SameSite=Strict; Path=/"))
        if path in _FILES:
            name, kind = _FILES[path]
            body = _asset(name)
            start("200 OK", [("Content-Type", kind), ("Content-Length", str(len(body))),
                             *_SECURITY, *extra])
            return [b""] if method == "HEAD" else [body]
        if path == "/api/mesh":
            self._asked = time.monotonic()
            self.trees.poke()
            body = self._snapshot_json()
            start("200 OK", [("Content-Type", "application/json"),
                             ("Content-Length", str(len(body))), *_SECURITY])
            return [b""] if method == "HEAD" else [body]
        if path == "/api/stream":
            if len(self._streams) >= MAX_STREAMS:
                return _plain(start, "503 Service Unavailable",
                              f"{MAX_STREAMS} pages follow the mesh already")
            start("200 OK", [("Content-Type", "text/event-stream"),
                             ("X-Accel-Buffering", "no"), *_SECURITY])
            return self._stream()
        return _plain(start, "404 Not Found", "not found")

    def _refusal(self, environ: dict[str, Any]) -> Optional[tuple[str, str]]:
        """Why the request is refused (status, text), or None."""
        if self.loopback and environ.get("HTTP_HOST", "") not in self._hosts:
            return "421 Misdirected Request", "this view answers only to a loopback host name"
        if not self.token:
            return None
        given = parse_qs(environ.get("QUERY_STRING", "")).get("token", [""])[0]
        if not given:
            auth = environ.get("HTTP_AUTHORIZATION", "")
            if auth.startswith("Bearer "):
                given = auth[7:].strip()
        if not given and environ.get("HTTP_COOKIE"):
            cookie: SimpleCookie = SimpleCookie()
            try:
                cookie.load(environ["HTTP_COOKIE"])
            except Exception:   # a malformed cookie header: no token
                pass
            if _COOKIE in cookie:
                given = cookie[_COOKIE].value
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return "401 Unauthorized", "a token is needed: open the address the agent printed"
        return None

    def _stream(self) -> Iterator[bytes]:
        """The server-sent events of one page, until it goes or the view closes."""
        stream = _Stream()
        self._streams.add(stream)
        self.trees.poke()
        try:
            yield b"retry: 1000\n\n" + _sse_raw("snapshot", self._snapshot_json())
            refreshed = last = time.monotonic()
            while self._server is not None:
                stream.wake.wait(min(KEEPALIVE, REFRESH))
                stream.wake.clear()
                if self._server is None:
                    return
                now = time.monotonic()
                if stream.behind or now - refreshed >= REFRESH:
                    stream.backlog.clear()
                    stream.behind = False
                    refreshed = last = now
                    yield _sse_raw("snapshot", self._snapshot_json())
                elif stream.backlog:
                    batch = b"".join(stream.backlog)
                    stream.backlog.clear()
                    last = now
                    yield batch
                elif now - last >= KEEPALIVE:
                    last = now
                    yield b": keep-alive\n\n"
        finally:
            self._streams.discard(stream)


def _sse(kind: str, value: Any) -> bytes:
    return _sse_raw(kind, json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def _sse_raw(kind: str, data: bytes) -> bytes:
    """One server-sent event (JSON has no raw newline, so one ``data:`` line)."""
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def _plain(start: Callable[..., Any], status: str, text: str,
           headers: Optional[list[tuple[str, str]]] = None) -> list[bytes]:
    body = (text + "\n").encode()
    start(status, [("Content-Type", "text/plain; charset=utf-8"),
                   ("Content-Length", str(len(body))), *_SECURITY, *(headers or [])])
    return [body]


_ASSETS: dict[str, bytes] = {}


def _asset(name: str) -> bytes:
    """A file of ``peermesh/agent/webui`` (read once)."""
    if name not in _ASSETS:
        _ASSETS[name] = resources.files(__package__).joinpath("webui", name).read_bytes()
    return _ASSETS[name]


class _ErrorLog:
    """pywsgi's error log, to the module's logger at debug (a client's bad request is not
    the agent's error)."""

    def write(self, text: str) -> None:
        if text.strip():
            log.debug("web view: %s", text.rstrip())

    def flush(self) -> None:
        pass
