"""SASL exchanges of MTL logins against the credentials file (``users``).

``Authenticator(credentials).begin(mechanism, client, now)`` gives a
``SaslExchange``; feed it each ``Connection.Authorize`` response with
``respond(data, now)``; the ``SaslStep`` it returns says what to answer: a
challenge (402), an authenticated ``User`` (201, with ``additional`` data
for the client when the mechanism has some) or a failure (401, with the
reason for the log only and ``retry_after`` while throttled). SCRAM-SHA-256
takes two responses: client-first, answered by the server-first challenge;
client-final, answered by success with the server-final message as
additional data (RFC 4422 "additional data with success", the 201's
``"additional"``). PLAIN (RFC 4616) takes one. An empty first response is
answered with an empty challenge. Unknown and expired users go through the
whole exchange against a decoy verifier, so that the answer never tells a
user name exists.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import scramp

from .throttle import Throttle
from .users import DEFAULT_ITERATIONS, MECHANISMS, CredentialsError, CredentialsFile, User, Verifier

__all__ = ["SaslStep", "Authenticator", "SaslExchange"]

log = logging.getLogger(__name__)

_SCRAM = scramp.ScramMechanism("SCRAM-SHA-256")


@dataclass(frozen=True, slots=True)
class SaslStep:
    """What to answer an Authorize: a ``challenge`` (402), a ``user`` (201: authenticated,
    with the mechanism's ``additional`` data if any) or a ``failure`` (401; the reason is
    for the log, ``retry_after`` > 0 while throttled)."""

    challenge: Optional[bytes] = None
    user: Optional[User] = None
    failure: Optional[str] = None
    retry_after: float = 0.0
    additional: Optional[bytes] = None

    @property
    def done(self) -> bool:
        """True when the exchange ended (authenticated or failed)."""
        return self.challenge is None


class Authenticator:
    """Runs SASL exchanges against a credentials file, with throttling (sans-io)."""

    def __init__(self, credentials: CredentialsFile,
                 mechanisms: Sequence[str] = ("SCRAM-SHA-256",),
                 throttle: Optional[Throttle] = None) -> None:
        offered = tuple(m.upper() for m in mechanisms)
        unknown = sorted(set(offered) - set(MECHANISMS))
        if unknown or not offered:
            raise CredentialsError(f"mechanism(s) {', '.join(unknown) or '(none)'} not "
                                   f"supported; choose from {', '.join(MECHANISMS)}")
        self.credentials = credentials
        self.mechanisms = offered
        self.throttle = throttle if throttle is not None else Throttle()
        self._decoy_key = secrets.token_bytes(32)

    def offers(self, mechanism: str) -> bool:
        """True if ``mechanism`` (any case) is one this authenticator runs."""
        return isinstance(mechanism, str) and mechanism.upper() in self.mechanisms

    def begin(self, mechanism: str, client: str, now: float,
              nonce: Optional[str] = None) -> "SaslExchange":
        """A new exchange for ``client`` (its address, for throttling); CredentialsError
        if ``mechanism`` is not offered. ``nonce``: the server nonce (tests only)."""
        if not self.offers(mechanism):
            raise CredentialsError(f"mechanism {mechanism!r} is not offered")
        return SaslExchange(self, mechanism.upper(), client, nonce)

    def lookup(self, name: str, now: float) -> tuple[Optional[User], Verifier]:
        """The user ``name`` if it may authenticate at ``now`` (Unix time), and the
        verifier to run the exchange against (a decoy when it may not)."""
        user = self.credentials.user(name)
        if user is not None and not user.expired(now):
            return user, user.verifier
        digest = hmac.digest(self._decoy_key, name.encode("utf-8", "surrogatepass"), "sha256")
        return None, Verifier(digest[:16], digest, digest, DEFAULT_ITERATIONS)


_CLIENT_FIRST, _CLIENT_FINAL, _DONE = range(3)


class SaslExchange:
    """One client's SASL exchange; ``respond`` to each Authorize in turn."""

    def __init__(self, authenticator: Authenticator, mechanism: str, client: str,
                 nonce: Optional[str]) -> None:
        self.mechanism = mechanism
        self.client = client
        self.name: Optional[str] = None     # the user name, once the client sent it
        self._auth = authenticator
        self._state = _CLIENT_FIRST
        self._prompted = False               # an empty challenge was sent already
        self._user: Optional[User] = None
        self._server: Any = None
        self._nonce = nonce

    def respond(self, response: bytes, now: float) -> SaslStep:
        """The answer to the client's next response (``now``: Unix time)."""
        if self._state == _DONE:
            return SaslStep(failure="the exchange has ended")
        throttle = self._auth.throttle
        wait = throttle.retry_after(None, self.client, now)
        if wait > 0:
            return self._fail("address throttled", now, wait, count=False)
        if not isinstance(response, bytes):
            return self._fail("response is not bytes", now)
        if self._state == _CLIENT_FIRST and not response and not self._prompted:
            self._prompted = True
            return SaslStep(challenge=b"")
        try:
            text = response.decode("utf-8")
        except UnicodeDecodeError:
            return self._fail("response is not UTF-8", now)
        if self.mechanism == "PLAIN":
            return self._plain(text, now)
        return self._scram(text, now)

    def _scram(self, text: str, now: float) -> SaslStep:
        try:
            if self._state == _CLIENT_FIRST:
                found: list[Optional[User]] = []

                def auth_fn(name: str) -> tuple[bytes, bytes, bytes, int]:
                    self.name = name
                    user, verifier = self._auth.lookup(name, now)
                    found.append(user)
                    return verifier.as_scramp()

                self._server = _SCRAM.make_server(auth_fn, s_nonce=self._nonce)
                self._server.set_client_first(text)
                self._user = found[0]
                wait = self._auth.throttle.retry_after(self.name, self.client, now)
                if wait > 0:
                    return self._fail("user throttled", now, wait, count=False)
                self._state = _CLIENT_FINAL
                return SaslStep(challenge=self._server.get_server_first().encode("utf-8"))
            if self._state == _CLIENT_FINAL:
                self._server.set_client_final(text)
                if self._user is None:     # a decoy cannot be passed, but never trust that
                    return self._fail("unknown or expired user", now)
                return self._succeed(self._server.get_server_final().encode("utf-8"))
        except scramp.ScramException as exc:
            reason = "unknown or expired user" if self._user is None and self.name else \
                exc.args[0] if exc.args else "SCRAM failed"
            return self._fail(str(reason), now)
        raise AssertionError("unreachable")   # (_DONE is answered before)

    def _plain(self, text: str, now: float) -> SaslStep:
        # message = [authzid] UTF8NUL authcid UTF8NUL passwd   (RFC 4616)
        parts = text.split("\0")
        if len(parts) != 3 or not parts[1] or not parts[2] or parts[0] not in ("", parts[1]):
            return self._fail("malformed PLAIN message", now)
        self.name = parts[1]
        wait = self._auth.throttle.retry_after(self.name, self.client, now)
        if wait > 0:
            return self._fail("user throttled", now, wait, count=False)
        user, verifier = self._auth.lookup(self.name, now)
        if not verifier.check_password(parts[2]) or user is None:
            return self._fail("wrong password" if user else "unknown or expired user", now)
        self._user = user
        return self._succeed()

    def _succeed(self, additional: Optional[bytes] = None) -> SaslStep:
        assert self._user is not None
        self._state = _DONE
        self._auth.throttle.succeeded(self._user.name, self.client)
        return SaslStep(user=self._user, additional=additional)

    def _fail(self, reason: str, now: float, wait: float = 0.0, count: bool = True) -> SaslStep:
        self._state = _DONE
        throttle = self._auth.throttle
        if count:
            throttle.failed(self.name, self.client, now)
            wait = throttle.retry_after(self.name, self.client, now)
        log.debug("SASL %s from %s (user %r) failed: %s", self.mechanism, self.client,
                  self.name, reason)
        return SaslStep(failure=reason, retry_after=wait)
