"""A node's CURVE settings, and the socket options they give every socket.

``Curve`` holds a node's keypair, the ``Allowlist`` of keys it admits and
the ZAP domain the allowlist answers for (by default the allowlist's own:
the domain is local to the process, never on the wire).
``make_socket(..., curve=...)`` applies it: a socket that binds (or any
socket without ``server_key``) is a CURVE server whose clients the ZAP
responder of its context vets; a socket given the ``server_key`` of the peer
it connects to is a CURVE client, which only completes its handshake with
the holder of that key's secret.
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass
from typing import Optional, Union

import zmq

from .keys import Keypair, KeyFileError, load_keypair, z85_key
from .zap import Allowlist, zap_responder

__all__ = ["Curve", "shared_allowlist"]

log = logging.getLogger(__name__)

_allowlists: "weakref.WeakValueDictionary[Optional[str], Allowlist]" = \
    weakref.WeakValueDictionary()


@dataclass(frozen=True, eq=False)
class Curve:
    """A keypair (with its secret), the keys it admits, and their ZAP domain (None: the
    allowlist's own)."""

    keypair: Keypair
    allowlist: Allowlist
    domain: Optional[str] = None

    @classmethod
    def load(cls, key_file: Union[str, os.PathLike[str]],
             allowed_keys: Union[str, os.PathLike[str], None] = None,
             domain: Optional[str] = None) -> "Curve":
        """The keypair of secret certificate ``key_file``; admitting the certificates in
        directory ``allowed_keys`` (None: any key). KeyFileError saying what is wrong."""
        keypair = load_keypair(key_file)
        if keypair.public_raw[0] == 0:
            log.warning("the public key in %s starts with a zero octet: Zyre and peermesh "
                        "peers drop beacons carrying it, so they will not connect to this "
                        "node; make a new one with `peermesh keygen`", key_file)
        return cls(keypair, shared_allowlist(allowed_keys), domain)

    @property
    def zap_domain(self) -> str:
        """The ZAP domain its CURVE servers name: ``domain``, else the allowlist's own."""
        return self.domain or self.allowlist.domain

    @property
    def public(self) -> bytes:
        """The public key in Z85."""
        return self.keypair.public

    def options(self, context: zmq.Context,
                server_key: Optional[bytes] = None) -> dict[int, Union[int, bytes]]:
        """Socket options: a CURVE client of ``server_key`` (Z85 or 32 octets; ``b""``: a
        client whose server key is set before each connect, see ``connect``), or without it
        a CURVE server whose domain the ZAP responder of ``context`` answers."""
        assert self.keypair.secret is not None
        if server_key is not None:
            client: dict[int, Union[int, bytes]] = {
                zmq.CURVE_PUBLICKEY: self.keypair.public, zmq.CURVE_SECRETKEY: self.keypair.secret}
            if server_key:
                client[zmq.CURVE_SERVERKEY] = _server_key(server_key)
            return client
        zap_responder(context).register(self.zap_domain, self.allowlist, self)
        return {zmq.CURVE_SERVER: 1, zmq.CURVE_SECRETKEY: self.keypair.secret,
                zmq.ZAP_DOMAIN: self.zap_domain.encode(), zmq.ZAP_ENFORCE_DOMAIN: 1}

    @staticmethod
    def connect(sock: zmq.Socket, endpoint: str, server_key: Union[bytes, str]) -> None:
        """Connect client ``sock`` to ``endpoint``, whose owner holds ``server_key`` (Z85):
        the key of each connection is the one set when it is made."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, _server_key(server_key))
        sock.connect(endpoint)

    def release(self, context: zmq.Context) -> None:
        """No more CURVE servers of these keys in ``context``: free the ZAP domain (until a
        socket is made again). A node calls it when it stops."""
        zap_responder(context).release(self.zap_domain, self)

    def __repr__(self) -> str:
        return f"Curve({self.public.decode()!r}, {self.allowlist!r}, domain={self.zap_domain!r})"


def _server_key(key: Union[bytes, str]) -> bytes:
    if isinstance(key, bytes) and len(key) == 32:
        return key
    return z85_key(key, "server key")


def shared_allowlist(directory: Union[str, os.PathLike[str], None]) -> Allowlist:
    """The process's ``Allowlist`` of ``directory`` (one per directory while in use)."""
    key = None if directory is None else os.path.abspath(os.fspath(directory))
    allowlist = _allowlists.get(key)
    if allowlist is None:
        if key is not None and not os.path.isdir(key):
            raise KeyFileError(f"allowed keys: {key} is not a directory"
                               if os.path.exists(key) else f"allowed keys: no directory {key}")
        allowlist = _allowlists[key] = Allowlist(key)
    return allowlist
