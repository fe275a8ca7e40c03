"""An MTL client's control session: ``Client`` (Connection.Open, SASL, profile, leases).

The control flow is a REQ socket to the gateway's control endpoint; the
session, its failover over ``gateways`` and the leases it hands out
(``peermesh.mtl.client.leases``) are described in ``peermesh.mtl.client``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import deque
from typing import Any, Mapping, Optional, Sequence, Union

import scramp
import zmq
from zmq.utils import z85

from ...errors import ProtocolError
from ...io.context import shared_context
from ...io.curve import Curve, shared_allowlist
from ...io.keys import generate
from ...io.socket import make_socket
from ...wire.mtl import (MAX_REQUEST, Authorize, Challenged, DataLease, Direction, Failure,
                         LeaseRequest, Ok, Open, Ready, Reply, Request, SelectProfile,
                         Unauthorized, decode_reply, encode_request)
from ..errors import AuthenticationFailed, ClientError, GatewayUnavailable, RequestRefused
from .leases import Reader, Writer, _L, _Leased

__all__ = ["Client"]

log = logging.getLogger("peermesh.mtl.client")

_MAX_GATEWAYS = 64     # endpoints kept, given and learnt from 201s
_WINDOW = 10_000       # unconfirmed contents a confirm-full writer holds at most


class _Moved(GatewayUnavailable):
    """A gateway that is not the elected one answered 503, naming the one to use."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        found = re.search(r"tcp://[^\s;,]+:\d+", reason)
        self.endpoint = found.group(0) if found else None


def _data_endpoint(control: str, port: int) -> str:
    """``tcp://host:PORT`` for the control endpoint ``tcp://host:port``."""
    host = control.rpartition(":")[0]
    return f"{host}:{port}"


def _check_endpoint(endpoint: Any) -> str:
    if not isinstance(endpoint, str) or not endpoint.startswith("tcp://") \
            or not endpoint.rpartition(":")[2].isdigit():
        raise ValueError(f"gateway endpoint {endpoint!r} is not tcp://HOST:PORT")
    return endpoint


def _server_keys(given: "bytes | str | Mapping[str, bytes | str] | None"
                 ) -> Optional[dict[str, bytes]]:
    """``server_key`` as {control endpoint or "" (any): Z85 bytes}; ValueError if malformed."""
    if given is None:
        return None
    pairs = given.items() if isinstance(given, Mapping) else [("", given)]
    keys = {}
    for endpoint, key in pairs:
        raw = key.encode("ascii", "replace") if isinstance(key, str) else key
        try:
            if not isinstance(raw, bytes) or len(raw) != 40:
                raise ValueError
            z85.decode(raw)
        except (KeyError, ValueError):
            raise ValueError(f"server key {key!r} is not 40 Z85 characters") from None
        keys[endpoint] = raw
    return keys




class Client:
    """A connection to an MTL gateway (with failover to the others); see the module doc."""

    def __init__(self, gateways: Sequence[str] | str, user: Optional[str] = None,
                 password: Optional[str] = None, *, virtual_host: str = "/",
                 profile: str = "mesh", mechanism: str = "SCRAM-SHA-256",
                 timeout: float = 5.0, heartbeat: float = 1.0, liveness: int = 3,
                 window: int = _WINDOW, context: Optional[zmq.Context[Any]] = None,
                 server_key: "bytes | str | Mapping[str, bytes | str] | None" = None) -> None:
        endpoints = [gateways] if isinstance(gateways, str) else list(gateways)
        if not endpoints:
            raise ValueError("no gateway endpoint given")
        self.gateways = [_check_endpoint(e) for e in endpoints][:_MAX_GATEWAYS]
        if user is not None and password is None and mechanism.upper() != "ANONYMOUS":
            raise ValueError(f"user {user!r} needs a password")
        if not timeout > 0 or not heartbeat > 0 or liveness < 1 or window < 1:
            raise ValueError("timeout and heartbeat must be positive, liveness and window "
                             "at least 1")
        self.user, self._password = user, password
        self.virtual_host, self.profile = virtual_host, profile
        self.mechanism = "ANONYMOUS" if user is None else mechanism.upper()
        self.timeout, self.heartbeat, self.liveness, self.window = \
            timeout, heartbeat, liveness, window
        #: the gateway now in use, and the profiles it offered
        self.gateway: Optional[str] = None
        self.profiles: tuple[str, ...] = ()
        #: goes up with every new control session (a lease from an older one may be gone)
        self.generation = 0
        self._context = context if context is not None else shared_context()
        self._req: Optional[zmq.Socket[Any]] = None
        self._index = 0
        self._lock = threading.RLock()
        self._leases: list[_Leased] = []
        self._closed = False
        #: the gateways' public keys (Z85) by control endpoint ("": every gateway's), and
        #: this client's own keys, on CURVE
        self._keys = _server_keys(server_key)
        self._curve = None if self._keys is None else Curve(generate(), shared_allowlist(None))

    def _socket(self, kind: int, options: Mapping[int, Union[int, bytes]],
                gateway: Optional[str] = None) -> "zmq.Socket[Any]":
        """A socket (``io.make_socket``) to ``gateway`` (a control endpoint; None: the one
        in use): a CURVE client of its key if keys were given; GatewayUnavailable if it has
        none."""
        gateway = self.gateway if gateway is None else gateway
        key = None
        if self._keys is not None:
            key = self._keys.get(gateway or "", self._keys.get(""))
            if key is None:
                raise GatewayUnavailable(f"no public key for gateway {gateway}")
        return make_socket(kind, options, self._context, curve=self._curve, server_key=key)

    # --- the control flow -----------------------------------------------------

    def connect(self) -> "Client":
        """Open a session on the first gateway that answers; GatewayUnavailable if none
        does, AuthenticationFailed or RequestRefused if one refuses."""
        with self._lock:
            if self._closed:
                raise ClientError("the client is closed")
            if self.gateway is None:
                self._establish()
        return self

    def _establish(self) -> None:
        """A new session: the current gateway, else each next one in turn (first the one
        a standby gateway's 503 names)."""
        tried: dict[str, str] = {}      # endpoint -> why not
        count = len(self.gateways)
        candidates = deque(self.gateways[(self._index + i) % count] for i in range(count))
        while candidates:
            endpoint = candidates.popleft()
            if endpoint in tried:
                continue
            self._close_req()
            self.gateway = None
            try:
                self._req = self._socket(zmq.REQ, {zmq.MAXMSGSIZE: MAX_REQUEST + 1024},
                                         endpoint)
                self._req.connect(endpoint)
                self._handshake()
            except GatewayUnavailable as exc:
                tried[endpoint] = str(exc)
                if isinstance(exc, _Moved) and exc.endpoint is not None:
                    self._learn(exc.endpoint)
                    candidates.appendleft(exc.endpoint)
                continue
            if endpoint in self.gateways:       # (not if the list was full)
                self._index = self.gateways.index(endpoint)
            self.gateway = endpoint
            self.generation += 1
            log.info("MTL session %d with %s", self.generation, endpoint)
            return
        self._close_req()
        raise GatewayUnavailable("no gateway answered: " + "; ".join(
            f"{endpoint} ({why})" for endpoint, why in tried.items()))

    def _learn(self, endpoint: str) -> None:
        """Keep ``endpoint`` among the gateways to fail over to."""
        if endpoint not in self.gateways and len(self.gateways) < _MAX_GATEWAYS:
            try:
                self.gateways.append(_check_endpoint(endpoint))
            except ValueError:
                log.debug("ignored gateway endpoint %r", endpoint)

    def _handshake(self) -> None:
        reply = self._send(Open(self.virtual_host))
        if isinstance(reply, Unauthorized):
            self._authenticate(reply.mechanisms)
        elif isinstance(reply, Ready):
            self._ready(reply)
        else:
            self._refused("Connection.Open", reply)
        self._select_profile()

    def _authenticate(self, offered: Sequence[str]) -> None:
        mechanism = self.mechanism
        if mechanism not in (m.upper() for m in offered):
            raise AuthenticationFailed(f"the gateway offers {', '.join(offered) or 'nothing'}, "
                                       f"not {mechanism}")
        scram = None
        if mechanism == "SCRAM-SHA-256":
            scram = scramp.ScramClient(["SCRAM-SHA-256"], self.user, self._password)
            response = scram.get_client_first().encode("utf-8")
        elif mechanism == "PLAIN":
            response = f"\0{self.user}\0{self._password}".encode("utf-8")
        else:
            response = (self.user or "").encode("utf-8")
        reply = self._send(Authorize(mechanism, response))
        try:
            if scram is not None and isinstance(reply, Challenged):
                scram.set_server_first(reply.challenge.decode("utf-8"))
                reply = self._send(Authorize(mechanism, scram.get_client_final().encode()))
            if isinstance(reply, Ready):
                if scram is not None:
                    if reply.additional is None:
                        raise AuthenticationFailed("the gateway sent no SCRAM server signature")
                    scram.set_server_final(reply.additional.decode("utf-8"))
                self._ready(reply)
                return
        except (scramp.ScramException, UnicodeDecodeError) as exc:
            raise AuthenticationFailed(f"SCRAM with the gateway failed: {exc}") from None
        if isinstance(reply, Unauthorized):
            raise AuthenticationFailed(f"the gateway refused {self.user or 'anonymous'}"
                                       f"{': ' + reply.reason if reply.reason else ''}")
        if isinstance(reply, Failure) and reply.status == 429:
            raise AuthenticationFailed(f"too many failed attempts: {reply.reason}")
        self._refused("Connection.Authorize", reply)

    def _ready(self, reply: Ready) -> None:
        self.profiles = reply.profiles
        for endpoint in reply.gateways:
            self._learn(endpoint)

    def _select_profile(self) -> None:
        reply = self._send(SelectProfile(self.profile))
        if not isinstance(reply, Ok):
            self._refused(f"Connection.Profile {self.profile!r}", reply)

    @staticmethod
    def _refused(what: str, reply: Reply) -> None:
        if isinstance(reply, Failure) and reply.status == 503:
            raise _Moved(f"{what}: 503 {reply.reason}")
        if isinstance(reply, Failure):
            raise RequestRefused(what, reply.status, reply.reason)
        raise RequestRefused(what, 500, f"unexpected reply {type(reply).__name__}")

    def _send(self, request: Request) -> Reply:
        """One request and its reply on the REQ socket (closed if none comes in time)."""
        req = self._req
        assert req is not None
        try:
            req.send_multipart(encode_request(request))
            if req.poll(int(self.timeout * 1000), zmq.POLLIN):
                return decode_reply(req.recv_multipart())
            why = f"no reply within {self.timeout:g} s"
        except ProtocolError as exc:
            why = f"malformed reply: {exc.reason}"
        except zmq.ZMQError as exc:
            why = str(exc)
        self._close_req()
        raise GatewayUnavailable(why)

    def _close_req(self) -> None:
        if self._req is not None:
            self._req.close(0)
            self._req = None

    def _lease(self, direction: Direction, resources: tuple[str, ...],
               confirm: str) -> tuple[str, str, int]:
        """A new lease: (data endpoint, lease token, session generation)."""
        what = f"Connection.{'Reader' if direction == Direction.READ else 'Writer'}"
        with self._lock:
            if self._closed:
                raise ClientError("the client is closed")
            if self.gateway is None:
                self._establish()
            request = LeaseRequest(direction, resources, confirm)
            try:
                reply = self._send(request)
                if isinstance(reply, Unauthorized):     # credentials changed: again
                    self._authenticate(reply.mechanisms)
                    self._select_profile()
                    reply = self._send(request)
                if isinstance(reply, Failure) and reply.status == 503:
                    raise _Moved(reply.reason)          # this gateway stepped down
            except GatewayUnavailable:
                self._establish()
                reply = self._send(request)
            if not isinstance(reply, DataLease):
                self._refused(what, reply)
            assert isinstance(reply, DataLease) and self.gateway is not None
            return _data_endpoint(self.gateway, reply.port), reply.lease, self.generation

    def _failover(self, generation: int) -> None:
        """A new control session, unless one newer than ``generation`` exists already."""
        with self._lock:
            if self._closed:
                raise ClientError("the client is closed")
            if self.generation == generation or self.gateway is None:
                self._establish()

    # --- leases -----------------------------------------------------------------

    def reader(self, resources: Sequence[str] = (), confirm: str = "none") -> "Reader":
        """A read lease on ``resources`` ([]: all the user may read); Summon to receive."""
        return self._add(Reader(self, tuple(resources), confirm))

    def writer(self, resources: Sequence[str] = (), confirm: str = "none") -> "Writer":
        """A write lease on ``resources``; with ``confirm="full"`` each content is kept
        until the gateway confirms it (``Writer.wait``)."""
        return self._add(Writer(self, tuple(resources), confirm))

    def _add(self, lease: "_L") -> "_L":
        with self._lock:
            self._leases.append(lease)
        return lease

    def _release(self, lease: _Leased) -> None:
        """Forget a closed lease (``_Leased.close``)."""
        with self._lock:
            if lease in self._leases:
                self._leases.remove(lease)

    def close(self) -> None:
        """Close every lease and the control socket."""
        with self._lock:
            self._closed = True
            leases, self._leases = self._leases, []
            self._close_req()
            self.gateway = None
        for lease in leases:
            lease.close()

    def __enter__(self) -> "Client":
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

