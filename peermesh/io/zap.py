"""Who may connect to a CURVE socket: allowlists of public keys and the ZAP responder.

How it works
------------
libzmq asks a ZAP handler (RFC 27), over ``inproc://zeromq.zap.01`` in the
socket's context, whether each client that completed a CURVE handshake may
in. Sockets name a ZAP *domain* and set ``ZAP_ENFORCE_DOMAIN``, so without
an answer nobody gets in. The domain never leaves the process (ZMTP's CURVE
handshake does not carry it; it only tells the handler which allowlist to
ask), so each ``Allowlist`` has a domain of its own by default
(``Allowlist.domain``): nodes, overlays and Spark workers of one process
that admit different keys never answer for each other. An explicit domain
(``zap_domain``) still works; two allowlists naming the same one are refused.

``ZapResponder`` is that handler, one per context: a ROUTER served by a
``HubSocket`` on a private gevent hub in a daemon thread of its own, so it
answers whatever thread or hub the nodes of the process run on (and goes on
answering when the node that started it stops). In a monkey-patched program
that "thread" is a greenlet on the hub that first needed it. Each domain maps to one
``Allowlist``; a key it allows is accepted with the key itself (Z85) as the
ZAP User-Id, which libzmq then attaches to every message of that connection:
that is how a node knows which key sent a message.

An ``Allowlist`` is a directory of public certificates (the files ``peermesh
keygen`` or ``zcert_save`` write; ``*_secret`` files and dot files are
skipped), or ``None`` for "any key" (encryption without an allowlist, as in
Zyre). It re-reads the directory whenever the directory changed (a file
added, removed or renamed into it: its mtime), checked at each handshake and
by ``refresh()``, and on ``reload()``; a file that is not a certificate is
logged and skipped, the others still count.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import threading
from typing import Any, Optional

import gevent
import gevent.monkey
import zmq
from zmq.utils import z85

from .keys import CurveError, KeyFileError, load_public_key
from .socket import HubSocket

__all__ = ["Allowlist", "ZapResponder", "zap_responder", "ZAP_ENDPOINT"]

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
_OK, _DENIED = b"200", b"400"
#: largest allowlist directory read (entries); a bound on what one reload may cost
MAX_KEYS = 100_000
_numbers = itertools.count(1)


class Allowlist:
    """The public keys (Z85 bytes) allowed in: those of the certificates in ``directory``,
    or any key when ``directory`` is None."""

    def __init__(self, directory: Optional[os.PathLike[str] | str]) -> None:
        self.directory = None if directory is None else os.path.abspath(os.fspath(directory))
        #: the ZAP domain of this allowlist alone, used unless a domain is named
        self.domain = f"peermesh-allowlist-{next(_numbers)}"
        #: the keys allowed now (empty and unused when any key is)
        self.keys: frozenset[bytes] = frozenset()
        self._stamp: Optional[int] = None
        self._lock = threading.Lock()
        if self.directory is not None:
            self.reload()

    @property
    def any_key(self) -> bool:
        """True when every key is allowed (no directory)."""
        return self.directory is None

    def allows(self, key: bytes) -> bool:
        """Whether Z85 ``key`` may connect, after re-reading the directory if it changed."""
        if self.directory is None:
            return True
        self.refresh()
        return key in self.keys

    def refresh(self) -> bool:
        """Re-read the directory if it changed since it was last read; True if it was.

        Never raises: a directory that cannot be read is logged (once) and the
        keys read before stay allowed.
        """
        if self.directory is None:
            return False
        try:
            stamp: Optional[int] = os.stat(self.directory).st_mtime_ns
        except OSError as exc:
            stamp = None
            if self._stamp is not None:
                log.warning("allowed keys: cannot read %s (%s); the %d keys read before stay "
                            "allowed", self.directory, exc.strerror, len(self.keys))
        if stamp is None or stamp == self._stamp:
            self._stamp = stamp
            return False
        try:
            self.reload()
        except KeyFileError as exc:
            log.warning("%s; the %d keys read before stay allowed", exc, len(self.keys))
            self._stamp = stamp
            return False
        return True

    def reload(self) -> int:
        """Read the directory again now; the number of keys allowed.

        KeyFileError when the directory cannot be listed (the keys allowed so
        far stay as they were).
        """
        if self.directory is None:
            return 0
        with self._lock:
            try:
                stamp = os.stat(self.directory).st_mtime_ns
                names = sorted(os.listdir(self.directory))
            except NotADirectoryError:
                raise KeyFileError(f"allowed keys: {self.directory} is not a directory") from None
            except OSError as exc:
                raise KeyFileError(f"allowed keys: cannot read directory {self.directory}: "
                                   f"{exc.strerror}") from None
            keys = set()
            for name in names[:MAX_KEYS]:
                if name.startswith(".") or name.endswith("_secret"):
                    continue
                path = os.path.join(self.directory, name)
                if not os.path.isfile(path):
                    continue
                try:
                    keys.add(load_public_key(path))
                except KeyFileError as exc:
                    log.warning("allowed keys: skipped %s", exc)
            if len(names) > MAX_KEYS:
                log.warning("allowed keys: read only the first %d entries of %s", MAX_KEYS,
                            self.directory)
            changed = keys != self.keys
            self.keys = frozenset(keys)
            self._stamp = stamp
        if changed:
            log.info("allowed keys: %d from %s", len(keys), self.directory)
        return len(keys)

    def __repr__(self) -> str:
        return f"<Allowlist {self.directory or 'any key'}: {len(self.keys)} keys>"


class ZapResponder:
    """Answers libzmq's ZAP requests for one context from the allowlist of each domain."""

    def __init__(self, context: zmq.Context) -> None:
        self.context = context
        #: domain -> its allowlist and the ids of those using it
        self._domains: dict[bytes, tuple[Allowlist, set[int]]] = {}
        self._lock = threading.Lock()
        sock = context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(ZAP_ENDPOINT)
        except zmq.ZMQError as exc:
            sock.close()
            raise CurveError(f"cannot install the ZAP handler ({ZAP_ENDPOINT}): {exc}; "
                             "is another one (zmq.auth) running in this context?") from None
        self._socket = HubSocket(sock)
        self._loop: Any = None  # the private hub's loop, once it serves
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,),
                                        name="peermesh-zap", daemon=True)
        self._thread.start()
        started.wait()

    @property
    def alive(self) -> bool:
        """True while it answers (its context was not terminated)."""
        return self._thread.is_alive()

    def register(self, domain: str, allowlist: Allowlist, user: object) -> None:
        """Answer requests of ``domain`` from ``allowlist`` while ``user`` (or another user
        of the same allowlist) holds it; CurveError if another allowlist holds it."""
        name = domain.encode()
        with self._lock:
            current, users = self._domains.get(name, (allowlist, set()))
            if current is not allowlist and users:
                raise CurveError(
                    f"ZAP domain {domain!r} already admits the keys of "
                    f"{current.directory or 'any key'} in this process; leave zap_domain unset "
                    "(each allowlist then has a domain of its own) or name another one")
            self._domains[name] = (allowlist, users | {id(user)})

    def release(self, domain: str, user: object) -> None:
        """``user`` no longer needs ``domain``; once no one does, nobody is admitted there."""
        name = domain.encode()
        with self._lock:
            allowlist, users = self._domains.get(name, (None, set()))
            if allowlist is not None:
                if users - {id(user)}:
                    self._domains[name] = (allowlist, users - {id(user)})
                else:
                    del self._domains[name]

    def _serve(self, started: threading.Event) -> None:
        hub = gevent.get_hub()
        self._loop = hub.loop
        started.set()
        try:
            self._socket.serve(self._on_request)
        finally:
            self._socket.close()
            if not gevent.monkey.is_module_patched("threading"):  # else: the caller's hub
                hub.destroy(destroy_loop=True)

    def close(self, timeout: float = 1.0) -> None:
        """Stop answering and end the thread (from any thread; at exit, before the
        interpreter stops its threads under a running hub)."""
        if self._thread.is_alive() and self._loop is not None:
            try:
                self._loop.run_callback_threadsafe(self._socket.close)
            except Exception:  # the loop is gone already
                return
            self._thread.join(timeout)

    def _on_request(self, route: bytes, frames: list[bytes]) -> None:
        # [b"", version, request id, domain, address, identity, mechanism, *credentials]
        if len(frames) < 7 or frames[0] != b"" or frames[1] != b"1.0":
            log.debug("dropped malformed ZAP request")
            return
        request_id, domain, mechanism = frames[2], frames[3], frames[6]
        allowlist = self._domains.get(domain, (None,))[0]
        status, text, user = _DENIED, b"unknown ZAP domain", b""
        if allowlist is not None:
            if mechanism != b"CURVE" or len(frames) != 8 or len(frames[7]) != 32:
                text = b"CURVE only"
            else:
                key = z85.encode(frames[7])
                if allowlist.allows(key):
                    status, text, user = _OK, b"OK", key
                else:
                    text = b"key not allowed"
                    log.debug("refused CURVE key %s from %s (not in %s)", key.decode(),
                              frames[4].decode(errors="replace"), allowlist.directory)
        self._socket.try_send([route, b"", b"1.0", request_id, status, text, user, b""])


_responders: dict[int, ZapResponder] = {}
_responders_lock = threading.Lock()


@atexit.register
def _close_responders() -> None:
    for responder in list(_responders.values()):
        responder.close()


def zap_responder(context: zmq.Context) -> ZapResponder:
    """The ZAP responder of ``context``, started on first use."""
    with _responders_lock:
        responder = _responders.get(id(context))
        if responder is None or responder.context is not context or not responder.alive:
            responder = _responders[id(context)] = ZapResponder(context)
        return responder
