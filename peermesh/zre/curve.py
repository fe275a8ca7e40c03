"""What a node with a CURVE keypair checks before its session hears a beacon or a message.

How it works
------------
With a keypair a node speaks Zyre's secure ZRE: its mailbox is a CURVE
server whose clients the ZAP responder vets against the allowlist, and it
connects to each peer as a CURVE client of the key that peer announced, so a
link only completes with the holder of that key's secret. What is left to
check, here, without I/O:

* **Beacons** must be version 3 (the beacon listener decodes nothing else)
  with a key that does not start with a zero octet, and an allowed key. The
  key of a UUID is that of its first beacon, or the one its HELLO
  authenticated with (which wins: beacons are not authenticated). A beacon
  whose key differs from the key a known peer authenticated with is
  ignored. A port-0 beacon (which anyone can forge, copying a peer's
  public key from its beacons) counts only if it carries the key the peer
  authenticated with, and then as ``Session.peer_left`` says: the peer's
  own authenticated connection decides (closed: EXIT "left" at once; open:
  PINGed, and removed if it closes within ``interval`` or no answer came by
  then), so a live peer cannot be cut off by a forged beacon.
* **Messages** carry the key their connection authenticated with (the ZAP
  User-Id, read by the mailbox with each message). A routing identity is
  bound to the key of the HELLO that introduced it: any other message under
  that identity from another key (a second connection taking it over) is
  dropped, and so is a HELLO without ``X-PUBLICKEY`` or whose header is not
  the key it authenticated with.
* **Reports without a key** (mDNS, peer exchange) only refresh known peers:
  a node cannot connect to a peer whose key it does not know.

``tick`` re-reads the allowlist when its directory changed and removes
peers whose keys it no longer holds (also after an explicit ``reload``). A link whose peer refused our key stays
dead (libzmq does not retry a handshake the ZAP handler refused), so a peer
that sent no HELLO within ``evasive`` is dropped without an event and made
again from its next beacon: a node admitted later meets it within
``evasive`` plus a beacon interval. Keys of UUIDs that are no longer peers
are forgotten, so the tables stay the size of the peer table.
"""

from __future__ import annotations

import logging
from typing import Optional
from uuid import UUID

from zmq.utils import z85

from ..errors import ProtocolError
from ..io.zap import Allowlist
from ..wire import zre
from .session import Session

__all__ = ["KeyGate"]

log = logging.getLogger(__name__)

_HELLO_PREFIX = b"\xaa\xa1\x01\x02"  # signature, HELLO, version 2
#: keys announced by beacons for UUIDs not yet peers, kept between ticks at most
MAX_ANNOUNCED = 4096


class KeyGate:
    """The key checks of one secure node in front of its ``Session``."""

    def __init__(self, session: Session, allowlist: Allowlist) -> None:
        self.session = session
        self.allowlist = allowlist
        #: UUID of a peer connected to but not yet ready -> when it was first seen so
        self.pending: dict[UUID, float] = {}
        self._checked = allowlist.keys  # the allowed keys the peers were last checked against
        #: routing identity -> the Z85 key (str) its HELLO authenticated with
        self.authenticated: dict[bytes, str] = {}
        #: UUID -> the Z85 key (str) its beacon announced
        self.announced: dict[UUID, str] = {}

    def _allowed(self, key: str) -> bool:
        allowlist = self.allowlist
        return allowlist.any_key or key.encode() in allowlist.keys

    def server_key(self, uuid: UUID) -> Optional[str]:
        """The key to connect to ``uuid`` with: authenticated, else announced."""
        return self.authenticated.get(b"\x01" + uuid.bytes) or self.announced.get(uuid)

    # --- discovery ---------------------------------------------------------------

    def appeared(self, uuid: UUID, key: Optional[bytes]) -> bool:
        """A report of ``uuid`` with the raw key its beacon carried (None: a report
        without a key); True when the session may hear it."""
        peer = self.session.peers.get(uuid)
        if key is None:
            return peer is not None
        if key[0] == 0:
            log.debug("dropped beacon of %s: key starts with a zero octet", uuid)
            return False
        text = z85.encode(key).decode()
        if not self._allowed(text):
            log.debug("dropped beacon of %s: key %s not allowed", uuid, text)
            return False
        if peer is not None:
            known = self.server_key(uuid)
            if known is not None and known != text:
                log.debug("dropped beacon of %s: key %s is not the peer's %s", uuid, text, known)
                return False
            return True
        if len(self.announced) >= MAX_ANNOUNCED and uuid not in self.announced:
            return False  # a flood of new UUIDs: the next tick makes room
        self.announced[uuid] = text
        return True

    def left(self, uuid: UUID, key: Optional[bytes], now: float) -> None:
        """A port-0 beacon of ``uuid``: heard (``Session.peer_left``: its authenticated
        link decides) only for a ready peer and with the key it authenticated with."""
        peer = self.session.peers.get(uuid)
        if peer is None or not peer.ready or key is None:
            return
        if self.authenticated.get(peer.identity) != z85.encode(key).decode():
            log.debug("ignored port-0 beacon of %s: not the key it authenticated with", uuid)
            return
        self.session.peer_left(uuid, now)

    # --- the mailbox ---------------------------------------------------------------

    def admit(self, identity: bytes, frames: list[bytes], key: Optional[str]) -> bool:
        """True when a message from ``identity`` authenticated as ``key`` may reach the
        session."""
        if key is not None and self.authenticated.get(identity) == key:
            return True
        head = frames[0] if frames else b""
        if key is None or head[:4] != _HELLO_PREFIX:
            log.debug("dropped message from %r: identity not introduced by key %s",
                      identity, key)
            return False
        try:
            hello = zre.decode(frames)
        except ProtocolError:
            return True  # the session drops (and logs) it
        assert isinstance(hello, zre.Hello)
        if hello.headers.get(zre.PUBLIC_KEY_HEADER) != key:
            log.debug("ignored HELLO from %r: %s is not %s", identity,
                      zre.PUBLIC_KEY_HEADER, key)
            return False
        if not self._allowed(key):
            log.debug("ignored HELLO from %r: key %s no longer allowed", identity, key)
            return False
        peer = self.session.by_identity.get(identity)
        if peer is not None:
            if peer.ready:
                log.debug("ignored HELLO from %r: %s holds that identity", identity, peer.name)
                return False
            if self.server_key(peer.uuid) != key:
                # connecting to the key a beacon announced, but the peer authenticated
                # with another: the authenticated one wins, connect again with it
                self.session.remove(peer, "announced another key")
        self.authenticated[identity] = key
        return True

    # --- timers ------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Re-read a changed allowlist, remove peers it no longer holds, give up links
        that brought no HELLO for ``evasive``, prune the tables."""
        session = self.session
        self.allowlist.refresh()
        if self.allowlist.keys is not self._checked and not self.allowlist.any_key:
            self._checked = self.allowlist.keys
            for identity, key in list(self.authenticated.items()):
                peer = session.by_identity.get(identity)
                if peer is not None and not self._allowed(key):
                    session.remove(peer, "key no longer allowed")
        # A peer that refused our key (ZAP) never reconnects by itself: drop the link, and
        # the next beacon makes a new one (its allowlist may hold our key by then).
        pending, lifetime = self.pending, session.config.evasive
        for uuid, peer in list(session.peers.items()):
            if peer.ready:
                pending.pop(uuid, None)
            elif now - pending.setdefault(uuid, now) >= lifetime:
                session.remove(peer, "no HELLO")
        by_identity, awaits = session.by_identity, session.awaits
        for identity in [i for i in self.authenticated
                         if i not in by_identity and not awaits(i)]:
            del self.authenticated[identity]
        peers = session.peers
        for table in (self.announced, pending):
            for uuid in [u for u in table if u not in peers]:
                del table[uuid]
