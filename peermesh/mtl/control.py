"""The MTL control flow as a sans-io state machine: one session per control client.

How it works
------------
The gateway's control ROUTER hands ``handle(identity, address, frames,
now)`` each request (without the identity and REQ's empty delimiter); the
answer is the reply's two frames, or None for an ill-formed request, which
is dropped silently as the spec asks (a REQ client then times out).

A session goes through these states (``State``)::

    NEW --Open--> OPENED --Authorize--> CHALLENGED --Authorize--> ...
    CHALLENGED --Authorize (exchange done)--> READY --Profile--> PROFILED
    PROFILED --Reader/Writer--> PROFILED (202 with a lease)

and ``TRANSITIONS`` says, per (state, command), which handler runs; a
command missing from it gets the state's ``REFUSALS`` answer (400 before
Open and before a profile, 401 before authentication). Further rules:

* Open in any state starts the session over (its leases are revoked); the
  answer is 401 with the mechanisms on offer (SCRAM-SHA-256; PLAIN when
  configured; ANONYMOUS when enabled).
* Authorize in READY or PROFILED re-authenticates: the profile and leases
  stay if the same user succeeds, go if another user does, and go with the
  authentication if it fails. In CHALLENGED an Authorize with the same
  mechanism continues the exchange, with another one starts anew.
* Before any request of an authenticated session, the user is checked
  (``still_valid``: unchanged in the credentials file, not expired, and
  authenticated less than ``session_lifetime`` ago): if not, the session
  falls back to OPENED, its leases are revoked and the answer is 401.
* A failed exchange answers 401 (with a reason); one refused because of
  failed-attempt throttling answers 429.
* ANONYMOUS (RFC 4505) authenticates as the credentials file's user
  ``anonymous``, whose grants apply; without that user it fails.

Sessions are kept at most ``max_sessions``; ``expire(now)`` forgets
sessions idle for ``session_idle`` seconds that hold no lease.

On the core contract (``peermesh.core``), under the control mailbox's driver:
``receive((identity, peer address), frames, now)`` takes a REQ envelope (the
empty delimiter and two frames; anything else is dropped) and returns the
reply as one ``Send``; while ``serving`` is false every request is answered
503 naming ``elsewhere()``, the gateway serving now. ``handle_timer`` is
``expire``, every ``EXPIRE_EVERY`` seconds while there are sessions.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from ..core import Output, Send
from ..errors import ProtocolError
from ..wire.mtl import (PROTOCOL_NAME, PROTOCOL_VERSION, Authorize, Challenged, DataLease,
                        Direction, Failure, InvalidRequest, LeaseRequest, Ok, Open, Ready, Reply,
                        Request, SelectProfile, Status, Unauthorized, decode_request,
                        encode_reply)
from .dataflow import DataFlow
from .profiles import PROFILES, Profile

if TYPE_CHECKING:
    from .credentials import Authenticator, SaslExchange, User

__all__ = ["State", "ControlSession", "ControlFlow", "TRANSITIONS", "ANONYMOUS", "ANONYMOUS_USER"]

log = logging.getLogger(__name__)

ANONYMOUS = "ANONYMOUS"
#: the credentials entry whose grants an ANONYMOUS client gets
ANONYMOUS_USER = "anonymous"
#: seconds between two looks for idle sessions
EXPIRE_EVERY = 1.0


class State(enum.Enum):
    """Where a control session is."""

    NEW = "new"                 # nothing yet: Open first
    OPENED = "opened"           # virtual host chosen, not authenticated
    CHALLENGED = "challenged"   # a SASL exchange is under way
    READY = "ready"             # authenticated, no profile yet
    PROFILED = "profiled"       # a profile is selected: leases may be requested


@dataclass(eq=False, slots=True)
class ControlSession:
    """One control client (a REQ socket, by its ROUTER identity)."""

    identity: bytes
    address: str
    seen: float
    state: State = State.NEW
    namespace: str = ""
    exchange: Optional["SaslExchange"] = None
    user: Optional["User"] = None
    authenticated: float = 0.0
    profile: Optional[Profile] = None
    leases: list[str] = field(default_factory=list)


class ControlFlow:
    """Control sessions of one gateway: ``handle`` a request, get the reply frames."""

    def __init__(self, authenticator: "Authenticator", data: DataFlow, *,
                 virtual_hosts: Optional[dict[str, str]] = None,
                 profiles: Sequence[str] = ("test", "mesh"),
                 plain: bool = False, anonymous: bool = False,
                 session_lifetime: Optional[float] = None, session_idle: float = 300.0,
                 max_sessions: int = 10_000, max_leases: int = 64,
                 gateways: Callable[[], tuple[str, ...]] = tuple,
                 unix_offset: float = 0.0) -> None:
        """``unix_offset``: seconds to add to ``now`` to read Unix time (users expire at a
        Unix time): the gateway's cores run on its transport's clock."""
        self.authenticator = authenticator
        self.unix_offset = unix_offset
        self.data = data
        #: virtual host -> the mesh-group prefix of its resources
        self.virtual_hosts = {"/": ""} if virtual_hosts is None else dict(virtual_hosts)
        self.profiles = [PROFILES[name.lower()] for name in profiles]
        mechanisms = ["SCRAM-SHA-256"]
        if plain:
            mechanisms.append("PLAIN")
        if anonymous:
            mechanisms.append(ANONYMOUS)
        self.mechanisms = tuple(mechanisms)
        self.session_lifetime = session_lifetime
        self.session_idle = session_idle
        self.max_sessions = max_sessions
        self.max_leases = max_leases
        self.gateways = gateways
        #: the data ROUTER's port, given in every 202
        self.data_port = 0
        self.sessions: dict[bytes, ControlSession] = {}
        #: authentications by outcome: ``ok``, ``failed``, ``throttled`` (the metrics' logins)
        self.logins = {"ok": 0, "failed": 0, "throttled": 0}
        #: False while another gateway serves: requests are answered 503 naming ``elsewhere()``
        self.serving = True
        self.elsewhere: Callable[[], Optional[str]] = lambda: None
        self._deadline: Optional[float] = None

    # --- the core contract (``peermesh.core``) ------------------------------------

    def receive(self, link: Any, frames: list[bytes], now: float) -> list[Output]:
        """One message of the control mailbox: ``link`` is ``(identity, peer address)``
        (or the identity alone), ``frames`` a REQ envelope; the reply, if any."""
        identity, address = link if type(link) is tuple else (link, "")
        if len(frames) != 3 or frames[0]:
            return []  # not a REQ envelope: dropped
        if self.serving:
            reply = self.handle(identity, address or "", frames[1:], now)
        else:
            reply = encode_reply(Failure(
                Status.SERVICE_UNAVAILABLE,
                f"not the elected gateway; use {self.elsewhere() or 'none yet'}"))
        if self._deadline is None:
            self._deadline = now + EXPIRE_EVERY
        return [Send(identity, [b"", *reply])] if reply is not None else []

    def handle_timer(self, now: float) -> list[Output]:
        """``expire``; nothing to send."""
        self.expire(now)
        self._deadline = now + EXPIRE_EVERY if self.sessions else None
        return []

    def next_deadline(self) -> Optional[float]:
        """When idle sessions are next looked for (None: there are none)."""
        return self._deadline

    # --- requests ---------------------------------------------------------------

    def handle(self, identity: bytes, address: str, frames: list[bytes], now: float
               ) -> Optional[list[bytes]]:
        """The reply frames to one request, or None to drop it (ill-formed)."""
        try:
            request = decode_request(frames)
        except ProtocolError as error:
            log.debug("dropped an ill-formed control request from %s: %s", address,
                      error.reason)
            return None
        session = self.sessions.get(identity)
        if session is None:
            if len(self.sessions) >= self.max_sessions and not self._evict():
                return encode_reply(Failure(Status.SERVICE_UNAVAILABLE, "too many sessions"))
            session = self.sessions[identity] = ControlSession(identity, address, now)
        else:
            del self.sessions[identity]  # re-inserted last: the dict stays in idle order
            self.sessions[identity] = session
        session.seen = now
        return encode_reply(self._answer(session, request, now))

    def _answer(self, session: ControlSession, request: Request, now: float) -> Reply:
        if isinstance(request, InvalidRequest):
            return Failure(Status.BAD_REQUEST, request.reason)
        if session.user is not None and not isinstance(request, Open) \
                and not self._valid(session, now):
            self._unauthenticate(session)
            return Unauthorized(self.mechanisms, "credentials changed or expired")
        handler = TRANSITIONS.get((session.state, type(request)))
        if handler is None:
            status, reason = REFUSALS[session.state]
            if status == Status.UNAUTHORIZED:
                return Unauthorized(self.mechanisms, reason)
            return Failure(status, reason)
        return handler(self, session, request, now)

    def _valid(self, session: ControlSession, now: float) -> bool:
        assert session.user is not None
        if self.session_lifetime is not None \
                and now - session.authenticated > self.session_lifetime:
            return False
        return self.authenticator.credentials.still_valid(session.user, now + self.unix_offset)

    def _revoke(self, session: ControlSession) -> None:
        for token in session.leases:
            self.data.revoke(token)
        session.leases.clear()

    def _unauthenticate(self, session: ControlSession) -> None:
        self._revoke(session)
        session.user = None
        session.profile = None
        session.exchange = None
        session.state = State.OPENED

    # --- handlers -----------------------------------------------------------------

    def _open(self, session: ControlSession, request: Open, now: float) -> Reply:
        self._revoke(session)
        session.user, session.profile, session.exchange = None, None, None
        session.state = State.NEW
        if request.protocol_name.upper() != PROTOCOL_NAME \
                or request.protocol_version != PROTOCOL_VERSION:
            return Failure(Status.BAD_REQUEST, f"protocol {request.protocol_name} "
                           f"{request.protocol_version} not supported: {PROTOCOL_NAME} "
                           f"{PROTOCOL_VERSION} is")
        namespace = self.virtual_hosts.get(request.virtual_host)
        if namespace is None:
            return Failure(Status.BAD_REQUEST, f"unknown virtual host {request.virtual_host!r}")
        session.namespace = namespace
        session.state = State.OPENED
        return Unauthorized(self.mechanisms)

    def _authorize(self, session: ControlSession, request: Authorize, now: float) -> Reply:
        mechanism = request.mechanism.upper()
        if mechanism not in self.mechanisms:
            if session.state is State.CHALLENGED:
                self._unauthenticate(session)
            return Unauthorized(self.mechanisms, f"mechanism {request.mechanism!r} not offered")
        if mechanism == ANONYMOUS:
            user = self.authenticator.credentials.user(ANONYMOUS_USER)
            if user is None or user.expired(now + self.unix_offset):
                self._unauthenticate(session)
                return Unauthorized(self.mechanisms, "anonymous access has no grants")
            return self._authenticated(session, user, now)
        exchange = session.exchange
        if exchange is None or session.state is not State.CHALLENGED \
                or exchange.mechanism != mechanism:
            exchange = session.exchange = self.authenticator.begin(
                mechanism, session.address, now + self.unix_offset)
        step = exchange.respond(request.response, now + self.unix_offset)
        if step.challenge is not None:
            if session.state is not State.CHALLENGED:
                # a re-authentication under way: no leases until it finishes
                session.state = State.CHALLENGED
            return Challenged(mechanism, step.challenge)
        session.exchange = None
        if step.user is None:
            self._unauthenticate(session)
            self.logins["throttled" if step.retry_after > 0 else "failed"] += 1
            if step.retry_after > 0:
                return Failure(Status.TOO_MANY_REQUESTS,
                               f"too many failed attempts: retry in {step.retry_after:.0f} s")
            return Unauthorized(self.mechanisms, "authentication failed")
        return self._authenticated(session, step.user, now, step.additional)

    def _authenticated(self, session: ControlSession, user: "User", now: float,
                       additional: Optional[bytes] = None) -> Reply:
        if session.user is not None and session.user.name != user.name:
            self._revoke(session)
            session.profile = None
        session.user = user
        session.authenticated = now
        self.logins["ok"] += 1
        session.state = State.PROFILED if session.profile is not None else State.READY
        return Ready(tuple(p.name for p in self.profiles), additional, self.gateways())

    def _profile(self, session: ControlSession, request: SelectProfile, now: float) -> Reply:
        profile = PROFILES.get(request.profile.lower())
        if profile is None or profile not in self.profiles:
            return Failure(Status.BAD_REQUEST, f"unknown profile {request.profile!r}")
        session.profile = profile
        session.state = State.PROFILED
        return Ok()

    def _lease(self, session: ControlSession, request: LeaseRequest, now: float) -> Reply:
        profile, user = session.profile, session.user
        assert profile is not None and user is not None
        if request.confirm not in self.data.confirms(profile):
            return Failure(Status.NOT_IMPLEMENTED,
                           f"profile {profile.name} does not offer confirm {request.confirm!r}")
        unknown = [r for r in request.resources if not profile.knows(r)]
        if unknown:
            return Failure(Status.BAD_REQUEST,
                           f"no resource {unknown[0]!r} in profile {profile.name}")
        reading = request.direction == Direction.READ
        may = user.may_read if reading else user.may_write
        denied = [r for r in request.resources if not may(r)]
        if denied:
            return Failure(Status.FORBIDDEN, f"{user.name} may not "
                           f"{'read' if reading else 'write'} {denied[0]!r}")
        session.leases[:] = [t for t in session.leases if t in self.data.grants]
        if len(session.leases) >= self.max_leases:
            return Failure(Status.TOO_MANY_REQUESTS, f"at most {self.max_leases} leases")
        grant = self.data.grant(session.identity, user, profile, session.namespace,
                                request.direction, request.resources, request.confirm, now)
        session.leases.append(grant.token)
        return DataLease(self.data_port, grant.token)

    # --- time -------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """Forget sessions idle for ``session_idle`` seconds that hold no live lease."""
        horizon = now - self.session_idle
        for identity, session in list(self.sessions.items()):
            if session.seen > horizon:
                break  # in idle order: the rest are younger
            if not any(t in self.data.grants for t in session.leases):
                del self.sessions[identity]

    def _evict(self) -> bool:
        """Make room by forgetting the longest idle session without leases."""
        for identity, session in self.sessions.items():
            if not any(t in self.data.grants for t in session.leases):
                del self.sessions[identity]
                return True
        return False


_Handler = Callable[[ControlFlow, ControlSession, Any, float], Reply]
#: (state, request type) -> handler; every other pair gets the state's refusal
#: (``LeaseRequest`` is Connection.Reader and Connection.Writer)
TRANSITIONS: dict[tuple[State, type], _Handler] = {
    **{(state, Open): ControlFlow._open for state in State},
    **{(state, Authorize): ControlFlow._authorize
       for state in (State.OPENED, State.CHALLENGED, State.READY, State.PROFILED)},
    (State.READY, SelectProfile): ControlFlow._profile,
    (State.PROFILED, SelectProfile): ControlFlow._profile,
    (State.PROFILED, LeaseRequest): ControlFlow._lease,
}
#: the answer to a command a state does not take
REFUSALS: dict[State, tuple[Status, str]] = {
    State.NEW: (Status.BAD_REQUEST, "send Connection.Open first"),
    State.OPENED: (Status.UNAUTHORIZED, "authenticate first"),
    State.CHALLENGED: (Status.UNAUTHORIZED, "finish authenticating first"),
    State.READY: (Status.BAD_REQUEST, "select a profile first"),
    State.PROFILED: (Status.BAD_REQUEST, "not allowed now"),
}
