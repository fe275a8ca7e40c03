"""``peermesh.mtl.Client``: an 11/MTL client for programs off the LAN, on plain pyzmq.

How it works
------------
A client is not a mesh node: it needs no gevent, no beacons, no hub. It
talks to a gateway with two kinds of socket, in the caller's thread:

* the control flow, a REQ socket to the gateway's control endpoint:
  ``Connection.Open``, SASL (SCRAM-SHA-256 through ``scramp``: the client
  checks the server's signature in the 201's ``additional`` data, so a
  gateway that does not hold the user's verifier is refused; PLAIN when
  asked for; ANONYMOUS without a user), ``Connection.Profile``, then one
  ``Connection.Reader`` or ``Connection.Writer`` per lease. A request not
  answered within ``timeout`` closes the socket (a REQ socket cannot send
  again before it has a reply) and counts the gateway as gone. A 401 to
  any other request (the user's credentials changed or expired) is
  answered by authenticating again and selecting the profile again, then
  the request is sent once more.
* one DEALER per lease (``Reader``, ``Writer``) to the data port the 202
  named, on the control endpoint's host: ``Lease``, then ``Summon`` and
  ``Dismiss`` (each waits for its ``Response``), ``Content``, ``Confirm``,
  ``Reject``, ``Ping`` / ``Pong``.

Heartbeats and failover: while it is called (``receive``, ``send``,
``wait``), a lease pings the gateway after ``heartbeat`` seconds without
hearing from it, answers its Pings, and presents its lease again every
``heartbeat * liveness * 2`` seconds (a second ``Lease``: 400 means it is
still bound, 200 that it was bound again, 403 that the gateway revoked it:
then it asks for a new one). A lease nobody called for ``heartbeat *
liveness`` seconds may have been unbound by the gateway: it binds again
before it sends. When the gateway stays silent for ``heartbeat * liveness``
seconds, or a command's Response does not come within ``timeout``, the
lease reconnects: first a new DEALER with the same lease (the gateway keeps
an unbound lease for a while), else a new control session on the same
gateway or the next one in ``gateways`` (also those a 201 named; a standby
gateway's 503 names the elected one, which is tried first), a new lease with
the same resources, the same Summons again. A writer with
``confirm: full`` keeps each content until the gateway confirms it (at most
``window`` at a time; ``send`` waits for room) and sends the unconfirmed
ones again after a reconnection: delivery is at least once. A reader's
``Received`` remembers which connection brought it; confirming one that an
earlier connection brought does nothing (the gateway hands it out again).

On keys: a gateway on a node with keys speaks CURVE on both flows; give the
client its public key (``server_key``: Z85, one for every gateway, or
``{control endpoint: key}`` when the gateways hold different keys; a
gateway without a key is then not tried). The client makes a keypair of its
own for its connections (the gateway admits any client key: SASL says who
the user is).

Bounds: a control reply is at most the codec's ``MAX_REQUEST`` + 1 KiB and a
data command ``MAX_CONTENT`` bytes (libzmq drops a gateway that sends more); a
reader takes content off its socket only when its queue is empty (or while
a Summon or Dismiss waits for its Response), at most 1,000 commands a read,
so the rest waits in the socket, bounded by its ``RCVHWM``; a writer with
``confirm: full`` keeps at most ``window`` contents.

Threads and asyncio: a ``Client`` serialises its control requests with a
lock, and each ``Reader`` and ``Writer`` owns its socket, so different
threads may use different leases of one client; one lease must be used by
one thread at a time. ``AsyncClient`` gives the same API as coroutines for
asyncio programs: each lease runs its blocking calls on a thread of its own.

    with Client(["tcp://gw1:5560", "tcp://gw2:5560"], "alice", password) as client:
        reader = client.reader(["chat"], confirm="full")
        reader.summon("chat")
        for received in reader:
            print(received.body)
            reader.confirm(received)
"""

from __future__ import annotations

import asyncio
import logging
import re
import struct
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator, Mapping, Optional, Sequence, TypeVar

import scramp
import zmq
from zmq.utils import z85

from ..errors import PeermeshError, ProtocolError
from ..wire.mtl import (MAX_REQUEST, Authorize, Challenged, Confirm, Content, DataCommand,
                        DataLease, Direction, Dismiss, Failure, Lease, LeaseRequest, Ok, Open,
                        Ping, Pong, Ready, Reject, Reply, Request, Response, SelectProfile,
                        Summon, Unauthorized, decode_data, decode_reply, encode_data,
                        encode_request, encode_string)

__all__ = ["Client", "Reader", "Writer", "Received", "AsyncClient", "AsyncReader",
           "AsyncWriter", "ClientError", "GatewayUnavailable", "AuthenticationFailed",
           "RequestRefused"]

log = logging.getLogger(__name__)

T = TypeVar("T")
_MAX_GATEWAYS = 64     # endpoints kept, given and learnt from 201s
_WINDOW = 10_000       # unconfirmed contents a confirm-full writer holds at most
#: largest data command taken from a gateway (bytes, all frames); libzmq drops the
#: connection of a gateway that sends more (the lease then reconnects)
MAX_CONTENT = 64 * 1024 * 1024
_CONTENT_HEAD = struct.Struct(">BQ").pack   # a data command's type and sequence
_EMPTY_TABLE = b"\x00\x00"
_MAX_TAILS = 1024      # resources whose encoded Content header a writer keeps
_Backend: Any = zmq.backend.Socket  # the Cython socket under pyzmq's Python layer
#: pyzmq's send without its Python layer (flag enums, keyword handling): a third of the
#: cost per frame, which counts on a writer's hot path
_send_frame: Callable[..., Any] = _Backend.send
_SNDMORE = int(zmq.SNDMORE)


def _send_content(dealer: "zmq.Socket[Any]", header: bytes, body: "bytes | memoryview"
                  ) -> bool:
    """Send a Content command's two frames (waiting up to the socket's SNDTIMEO); False
    if the socket took nothing in that time. Bodies past pyzmq's copy threshold go
    without a copy."""
    try:
        _send_frame(dealer, header, _SNDMORE)
    except zmq.Again:
        return False
    # (once ZeroMQ took the first part of a message it takes the rest: this never waits)
    _send_frame(dealer, body, 0, len(body) < zmq.COPY_THRESHOLD)
    return True


class ClientError(PeermeshError):
    """An MTL client call failed."""


class GatewayUnavailable(ClientError):
    """No gateway answered in time."""


class AuthenticationFailed(ClientError):
    """The gateway refused the credentials (or could not prove it holds them)."""


class _Moved(GatewayUnavailable):
    """A gateway that is not the elected one answered 503, naming the one to use."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        found = re.search(r"tcp://[^\s;,]+:\d+", reason)
        self.endpoint = found.group(0) if found else None


class RequestRefused(ClientError):
    """The gateway answered a request with an error status (``status``, ``reason``)."""

    def __init__(self, what: str, status: int, reason: str = "") -> None:
        super().__init__(f"{what}: {status}{' ' + reason if reason else ''}")
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Received:
    """Content from a resource; give it to ``Reader.confirm`` or ``Reader.reject``."""

    sequence: int
    resource: str
    body: bytes
    properties: Mapping[str, Any]
    link: int = field(default=0, repr=False, compare=False)   # the connection it came on


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
        self._context = context if context is not None else zmq.Context.instance()
        self._req: Optional[zmq.Socket[Any]] = None
        self._index = 0
        self._lock = threading.RLock()
        self._leases: list[_Leased] = []
        self._closed = False
        #: the gateways' public keys (Z85) by control endpoint ("": every gateway's), and
        #: this client's keypair, on CURVE
        self._keys = _server_keys(server_key)
        self._keypair = zmq.curve_keypair() if self._keys is not None else None

    def _secure(self, sock: "zmq.Socket[Any]", gateway: Optional[str]) -> None:
        """Make ``sock`` a CURVE client of ``gateway`` (its control endpoint), if keys."""
        if self._keys is None or self._keypair is None:
            return
        key = self._keys.get(gateway or "", self._keys.get(""))
        if key is None:
            raise GatewayUnavailable(f"no public key for gateway {gateway}")
        sock.curve_publickey, sock.curve_secretkey = self._keypair
        sock.curve_serverkey = key

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
                self._req = self._context.socket(zmq.REQ)
                self._req.setsockopt(zmq.LINGER, 0)
                self._req.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST + 1024)
                self._secure(self._req, endpoint)
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


class _Leased:
    """One lease and its data connection (a DEALER); Reader and Writer build on it."""

    direction = Direction.READ

    def __init__(self, client: Client, resources: tuple[str, ...], confirm: str) -> None:
        self.client = client
        self.resources = resources
        #: "none" or "full"
        self.confirm_model = confirm.lower()
        #: which data connection this is (goes up with each reconnection)
        self.link = 0
        self._dealer: Optional[zmq.Socket[Any]] = None
        self._endpoint = ""
        self._token = ""
        self._generation = -1
        self._sequence = 0                   # command sequence
        self._heard = self._said = self._pinged = self._probed = 0.0
        self._probe: Optional[int] = None    # sequence of a Lease sent to check the binding
        self._revoked = False                # the gateway answered the probe with 403
        self._pings = self._pongs = 0        # on this connection (the k-th Pong answers ...)
        self._closed = False
        self._bind(renew=True)

    # --- the connection ---------------------------------------------------------

    def _bind(self, renew: bool) -> None:
        """A new DEALER presenting the lease (a new lease from the control flow if
        ``renew``); then what the lease had (Summons, unconfirmed content) again."""
        if renew:
            if self.link:   # it was bound before: its session may be gone with the gateway
                self.client._failover(self._generation)
            self._endpoint, self._token, self._generation = self.client._lease(
                self.direction, self.resources, self.confirm_model)
        self._close_dealer()
        dealer = self.client._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.SNDTIMEO, int(self.client.timeout * 1000))
        dealer.setsockopt(zmq.MAXMSGSIZE, MAX_CONTENT)
        try:
            self.client._secure(dealer, self.client.gateway)
        except GatewayUnavailable:
            dealer.close()
            raise
        dealer.connect(self._endpoint)
        self._dealer = dealer
        self.link += 1
        self._heard = self._said = self._pinged = self._probed = time.monotonic()
        self._probe, self._revoked = None, False
        self._pings = self._pongs = 0
        code = self._exchange(lambda seq: Lease(seq, self._token), self._patience())
        if code == 403 and not renew:
            self._bind(renew=True)
            return
        if code != 200:
            raise RequestRefused("Lease", code)
        self._bound()

    def _patience(self) -> float:
        return min(self.client.timeout, self.client.heartbeat * self.client.liveness)

    def _bound(self) -> None:
        """Restore what the lease had on its new connection (Reader, Writer)."""

    def _recover(self) -> None:
        """Reconnect: the same lease again, else a new one (failing over if need be)."""
        if self._closed:
            raise ClientError("the lease is closed")
        log.info("MTL %s lease on %s: reconnecting", self.direction.name.lower(),
                 self._endpoint)
        try:
            self._bind(renew=False)
        except GatewayUnavailable:
            self._bind(renew=True)

    def _send(self, command: DataCommand) -> None:
        assert self._dealer is not None
        try:
            self._dealer.send_multipart(encode_data(command), copy=False)
        except zmq.Again:
            raise GatewayUnavailable(f"the gateway at {self._endpoint} takes nothing "
                                     f"(send timed out)") from None
        self._said = time.monotonic()

    def _awake(self) -> None:
        """Reconnect first if the gateway may have unbound the link: it heard nothing from
        it for ``heartbeat * liveness`` seconds (nobody called this lease)."""
        if time.monotonic() - self._said >= self.client.heartbeat * self.client.liveness:
            self._recover()

    def _exchange(self, make: Callable[[int], DataCommand], patience: float) -> int:
        """Send a command with the next sequence and wait for its Response code;
        GatewayUnavailable if it does not come within ``patience`` seconds."""
        self._sequence += 1
        sequence = self._sequence
        self._send(make(sequence))
        deadline = time.monotonic() + patience
        code: Optional[int] = None
        while True:
            for command in self._read(deadline - time.monotonic()):
                if isinstance(command, Response) and command.sequence == sequence:
                    code = command.code
                else:
                    self._incoming(command)      # (also what came after the Response)
            if code is not None:
                return code
            if time.monotonic() >= deadline:
                raise GatewayUnavailable(f"no Response from {self._endpoint} within "
                                         f"{patience:g} s")

    def _command(self, make: Callable[[int], DataCommand]) -> int:
        """``_exchange`` with a reconnection (and one more try) if the gateway is gone."""
        try:
            return self._exchange(make, self.client.timeout)
        except GatewayUnavailable:
            self._recover()
            return self._exchange(make, self.client.timeout)

    def _read(self, timeout: float) -> list[DataCommand]:
        """Data commands that arrive within ``timeout`` seconds (what is there at once)."""
        dealer = self._dealer
        assert dealer is not None
        commands: list[DataCommand] = []
        if not dealer.poll(max(0, int(timeout * 1000)), zmq.POLLIN):
            return commands
        while len(commands) < 1000:
            try:
                frames = dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._heard = time.monotonic()
            try:
                commands.append(decode_data(frames))
            except ProtocolError as exc:
                log.debug("dropped an ill-formed data command: %s", exc.reason)
        return commands

    def ping(self, timeout: Optional[float] = None) -> bool:
        """A round trip to the gateway: True once it answered, so everything this lease sent
        before (Confirms too) has been handled; False after ``timeout`` seconds."""
        self._ping()
        wanted = self._pings
        deadline = time.monotonic() + (self.client.timeout if timeout is None else timeout)
        link = self.link
        while self._pongs < wanted and self.link == link:
            if time.monotonic() >= deadline:
                return False
            self._pump(self._slice(deadline))
        return self.link == link

    def _ping(self) -> None:
        self._send(Ping())
        self._pings += 1

    def _incoming(self, command: DataCommand) -> None:
        """A data command that is not the Response being waited for."""
        if isinstance(command, Ping):
            self._send(Pong())
        elif isinstance(command, Pong):
            self._pongs += 1
        elif isinstance(command, Response) and command.sequence == self._probe:
            self._probe = None
            self._revoked = command.code == 403

    def _pump(self, timeout: float) -> None:
        """Read and handle what arrives within ``timeout``; keep the connection alive."""
        for command in self._read(timeout):
            self._incoming(command)
        now = time.monotonic()
        heartbeat, liveness = self.client.heartbeat, self.client.liveness
        if self._revoked:             # the gateway revoked the lease: a new one
            self._bind(renew=True)
        elif now - self._heard >= heartbeat * liveness:
            self._recover()
        elif now - self._heard >= heartbeat and now - self._pinged >= heartbeat:
            self._pinged = now
            self._ping()
        elif now - self._probed >= heartbeat * liveness * 2 and self._probe is None:
            self._probed = now
            self._sequence += 1
            self._probe = self._sequence
            self._send(Lease(self._sequence, self._token))

    def _slice(self, deadline: Optional[float]) -> float:
        """How long one wait may last: until ``deadline``, at most one heartbeat."""
        limit = self.client.heartbeat
        return limit if deadline is None else max(0.0, min(limit, deadline - time.monotonic()))

    def _close_dealer(self, linger: float = 0.0) -> None:
        if self._dealer is not None:
            self._dealer.close(int(linger * 1000))
            self._dealer = None

    def close(self) -> None:
        """Close the data connection (the gateway forgets the lease after a while); what
        is still queued to send gets up to ``timeout`` seconds to leave."""
        self._closed = True
        self._close_dealer(self.client.timeout)

    def __enter__(self: "_L") -> "_L":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_L = TypeVar("_L", bound=_Leased)


class Reader(_Leased):
    """A read lease: ``summon`` resources, ``receive`` content, ``confirm`` / ``reject`` it."""

    direction = Direction.READ

    def __init__(self, client: Client, resources: tuple[str, ...], confirm: str) -> None:
        self.summoned: list[str] = []
        self._inbox: deque[Received] = deque()
        super().__init__(client, resources, confirm)

    def summon(self, resource: str) -> None:
        """Start receiving ``resource``; RequestRefused if the gateway says no."""
        code = self._command(lambda seq: Summon(seq, resource))
        if code != 200:
            raise RequestRefused(f"Summon {resource!r}", code)
        if resource not in self.summoned:
            self.summoned.append(resource)

    def dismiss(self, resource: str) -> None:
        """Stop receiving ``resource``: the gateway sends none of it after its Response
        (content that came before may still be in ``receive``'s queue)."""
        code = self._command(lambda seq: Dismiss(seq, resource))
        if resource in self.summoned:
            self.summoned.remove(resource)
        if code != 200:
            raise RequestRefused(f"Dismiss {resource!r}", code)

    def receive(self, timeout: Optional[float] = None) -> Optional[Received]:
        """The next content, waiting at most ``timeout`` seconds (None: for ever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._inbox:
            self._pump(self._slice(deadline))
            if deadline is not None and time.monotonic() >= deadline:
                break
        return self._inbox.popleft() if self._inbox else None

    def __iter__(self) -> Iterator[Received]:
        while True:
            received = self.receive()
            if received is not None:
                yield received

    def confirm(self, received: Received, multiple: bool = False) -> bool:
        """Confirm ``received`` (``multiple``: and everything before it); False if it came
        on an earlier connection (the gateway hands it out again)."""
        if received.link != self.link:
            return False
        self._send(Confirm(received.sequence, multiple))
        return True

    def reject(self, received: Received, multiple: bool = False,
               recycle: bool = False) -> bool:
        """Refuse ``received``: the gateway hands it out again (``recycle``) or drops it."""
        if received.link != self.link:
            return False
        self._send(Reject(received.sequence, multiple, recycle))
        return True

    def _incoming(self, command: DataCommand) -> None:
        if isinstance(command, Content):
            self._inbox.append(Received(command.sequence, command.resource, command.body,
                                        command.properties, self.link))
        else:
            super()._incoming(command)

    def _bound(self) -> None:
        if self.confirm_model == "full":   # held content comes again on the new connection
            self._inbox = deque(r for r in self._inbox if r.link == self.link)
        for resource in list(self.summoned):
            code = self._exchange(lambda seq: Summon(seq, resource), self._patience())
            if code != 200:
                log.warning("MTL: Summon %r refused (%d) after reconnecting", resource, code)
                self.summoned.remove(resource)


class Writer(_Leased):
    """A write lease: ``send`` content; with ``confirm="full"``, ``wait`` for confirms."""

    direction = Direction.WRITE

    def __init__(self, client: Client, resources: tuple[str, ...], confirm: str) -> None:
        #: content the gateway rejected: (sequence, resource), the most recent 1000
        self.rejected: deque[tuple[int, str]] = deque(maxlen=1000)
        self._unconfirmed: OrderedDict[int, Content] = OrderedDict()
        self._content = 0
        self._sends = 0
        self._tails: dict[str, bytes] = {}   # resource -> the rest of a Content header
        super().__init__(client, resources, confirm)

    @property
    def unconfirmed(self) -> int:
        """Contents sent and not confirmed yet (``confirm="full"``)."""
        return len(self._unconfirmed)

    def send(self, body: bytes, resource: str = "",
             properties: Optional[Mapping[str, Any]] = None) -> int:
        """Send content (``resource`` may be empty when the lease names one); its sequence.

        With ``confirm="full"`` it waits while ``window`` contents are unconfirmed."""
        client = self.client
        if time.monotonic() - self._said >= client.heartbeat * client.liveness:
            self._recover()      # (as ``_awake``, inline: this is the hot path)
        full = self.confirm_model == "full"
        while full and len(self._unconfirmed) >= client.window:
            self._pump(client.heartbeat)
        # (numbered after any reconnection above: what it sent again has lower numbers)
        # TypeError unless bytes-like, before anything goes
        data: "bytes | memoryview" = body if type(body) is bytes else memoryview(body)
        self._content += 1
        sequence = self._content
        if properties:
            header = encode_data(Content(sequence, resource, b"", properties))[0]
        else:
            tail = self._tails.get(resource)
            if tail is None:     # ValueError for a bad resource
                tail = encode_string(resource) + _EMPTY_TABLE
                if len(self._tails) >= _MAX_TAILS:
                    self._tails.clear()
                self._tails[resource] = tail
            header = _CONTENT_HEAD(5, sequence) + tail
        if full:
            self._unconfirmed[sequence] = Content(sequence, resource, body, properties or {})
        assert self._dealer is not None
        if _send_content(self._dealer, header, data):
            self._said = time.monotonic()
        else:                    # the gateway took nothing for ``timeout``
            self._recover()      # (full: resent with the others)
            if not full:
                self._send(Content(sequence, resource, body, properties or {}))
        self._sends += 1
        if not self._sends & 255:   # Confirms, Pings: handled as we go
            self._pump(0)
        return sequence

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until the gateway confirmed everything sent (at most ``timeout`` seconds);
        True if it did. Without ``confirm="full"`` nothing waits: True."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._pump(0)
        while self._unconfirmed:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            self._pump(self._slice(deadline))
        return True

    def _incoming(self, command: DataCommand) -> None:
        if isinstance(command, (Confirm, Reject)):
            done = []
            if command.multiple:
                while self._unconfirmed and next(iter(self._unconfirmed)) <= command.sequence:
                    done.append(self._unconfirmed.popitem(last=False)[1])
            elif command.sequence in self._unconfirmed:
                done.append(self._unconfirmed.pop(command.sequence))
            if isinstance(command, Reject):
                if not done:   # confirm none: only the sequence is known
                    self.rejected.append((command.sequence, ""))
                for content in done:
                    if command.recycle:
                        self._resend(content)
                    else:
                        self.rejected.append((content.sequence, content.resource))
        else:
            super()._incoming(command)

    def _resend(self, content: Content) -> None:
        self._content += 1
        again = Content(self._content, content.resource, content.body, content.properties)
        self._unconfirmed[again.sequence] = again
        self._send(again)

    def _bound(self) -> None:
        old, self._unconfirmed = self._unconfirmed, OrderedDict()
        for content in old.values():
            self._resend(content)


# --------------------------------------------------------------------------
# asyncio


class _OnThread:
    """Runs one object's blocking calls on a thread of its own, for asyncio."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _shutdown(self) -> None:
        self._executor.shutdown(wait=False)


class AsyncClient(_OnThread):
    """``Client`` for asyncio: the same arguments, every call a coroutine."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("peermesh-mtl-control")
        self.client = Client(*args, **kwargs)
        self._leases: list[_OnThread] = []

    async def connect(self) -> "AsyncClient":
        await self._run(self.client.connect)
        return self

    async def reader(self, resources: Sequence[str] = (), confirm: str = "none"
                     ) -> "AsyncReader":
        """As ``Client.reader``."""
        lease = AsyncReader()
        lease.lease = await lease._run(self.client.reader, resources, confirm)
        self._leases.append(lease)
        return lease

    async def writer(self, resources: Sequence[str] = (), confirm: str = "none"
                     ) -> "AsyncWriter":
        """As ``Client.writer``."""
        lease = AsyncWriter()
        lease.lease = await lease._run(self.client.writer, resources, confirm)
        self._leases.append(lease)
        return lease

    async def close(self) -> None:
        await self._run(self.client.close)
        for lease in self._leases:
            lease._shutdown()
        self._shutdown()

    async def __aenter__(self) -> "AsyncClient":
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncReader(_OnThread):
    """``Reader`` for asyncio (``async for received in reader``)."""

    lease: Reader

    def __init__(self) -> None:
        super().__init__("peermesh-mtl-reader")

    async def summon(self, resource: str) -> None:
        await self._run(self.lease.summon, resource)

    async def dismiss(self, resource: str) -> None:
        await self._run(self.lease.dismiss, resource)

    async def receive(self, timeout: Optional[float] = None) -> Optional[Received]:
        """As ``Reader.receive``; waits in slices of 50 ms so other calls get their turn."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = 0.05 if deadline is None else max(0.0, min(0.05, deadline - time.monotonic()))
            received = await self._run(self.lease.receive, wait)
            if received is not None or (deadline is not None and time.monotonic() >= deadline):
                return received

    async def confirm(self, received: Received, multiple: bool = False) -> bool:
        return await self._run(self.lease.confirm, received, multiple)

    async def ping(self, timeout: Optional[float] = None) -> bool:
        return await self._run(self.lease.ping, timeout)

    async def reject(self, received: Received, multiple: bool = False,
                     recycle: bool = False) -> bool:
        return await self._run(self.lease.reject, received, multiple, recycle)

    async def __aiter__(self) -> AsyncIterator[Received]:
        while True:
            received = await self.receive()
            if received is not None:
                yield received


class AsyncWriter(_OnThread):
    """``Writer`` for asyncio."""

    lease: Writer

    def __init__(self) -> None:
        super().__init__("peermesh-mtl-writer")

    async def send(self, body: bytes, resource: str = "",
                   properties: Optional[Mapping[str, Any]] = None) -> int:
        return await self._run(self.lease.send, body, resource, properties)

    async def wait(self, timeout: Optional[float] = None) -> bool:
        return await self._run(self.lease.wait, timeout)

    async def ping(self, timeout: Optional[float] = None) -> bool:
        return await self._run(self.lease.ping, timeout)
