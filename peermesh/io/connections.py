"""One connection policy for every listening ROUTER: caps, shedding, EMFILE, revoked keys.

How it works
------------
libzmq accepts every connection it can; once the process is out of
descriptors, ``accept`` fails and libzmq retries it at once, for ever: the
I/O thread spins and no client gets in. A ``GuardedListener`` watches a
bound ROUTER through its socket monitor (``ACCEPTED`` and ``DISCONNECTED``
carry the connection's descriptor) and keeps it under its
``ConnectionPolicy``:

* **a cap per listener** (``max_connections``, and at most half the
  descriptors beyond a reserve): over it, connections are shut down to 7/8 of
  the cap, oldest first those that never sent a whole ZMTP greeting (no
  handshake), then those that sent under 1 KiB (nothing since the handshake
  but a greeting), then those that sent the fewest octets, so a client that
  talks is shed last (``connections_shed``);
* **a cap per source address** (``max_per_address``; the listener's own host
  is not counted): the connections from one other host over it are shed the
  same way (``connections_shed``);
* **known senders kept**: a listener whose owner can tell who it knows
  (``keep(routing_id)``: the ZRE mailbox keeps its peers' connections) learns
  the routing id of each connection from the messages it reads, and never
  sheds the connections ``keep`` accepts; the others are at most
  ``max_unknown`` (over it, they are shed the same way down to 7/8 of it):
  a flood of connections, with or without a greeting or a HELLO, never cuts
  a known sender's connection, and holds no more than ``max_unknown`` of its
  own;
* **accept held under a flood of unknown connections**: a client whose
  connection was shed connects again (a ZeroMQ DEALER 0.1 s later, and so on
  for ever), so shedding alone turns a flood into a storm of connections
  accepted, greeted and shed again, and that storm takes the CPU the known
  senders wait for. So when unknown connections were over ``max_unknown``,
  the listener takes no new connection for ``accept_pause`` seconds
  (``accept_held``): a filter on the listening socket has the kernel drop
  each SYN (the first segment of a new connection) and nothing else, so
  the connections open, and handshakes under way, go on; the kernels of the
  clients send their SYN again 1 s later, then 3 s, 7 s ... (TCP's own
  back-off), which costs the listener nothing. A peer that connects
  meanwhile (also a real newcomer) gets in once its SYN comes while the
  listener accepts again;
* **accept paused at EMFILE**: an ``ACCEPT_FAILED`` for lack of descriptors
  sheds the quietest eighth of the listener's connections; a listener that
  has none stops listening (``unbind``) and binds again ``accept_pause``
  seconds later (``accept_paused``), so the I/O thread never spins;
* **memory returned**: once the connections fall to half of a peak of at
  least ``TRIM_AFTER``, or ``TRIM_AFTER`` connections were shut down (a flood
  whose clients reconnect turns them over), the C heap is trimmed
  (``malloc_trim``), at most once every ``TRIM_PERIOD`` seconds (a fall
  within it is trimmed once it is over): libzmq's per-connection buffers go
  back to the system instead of staying in its allocator's arenas;
* **revoked keys** (a CURVE listener with an allowlist directory): each
  message is read with the key it was authenticated with and the descriptor
  it came by (``KEY_AND_FD``), so the listener knows each connection's key.
  Every ``revoke_check`` seconds it re-reads the allowlist if its directory
  changed; the connections of a key no longer in it are shut down
  (``connections_revoked``), ``on_revoked(keys)`` lets the overlay fail the
  work in flight of keys no longer allowed, and a message of such a key still unread is dropped,
  never served (``messages_revoked``). A key's connections are therefore
  closed within ``revoke_check`` (0.25 s) of the change, and at once when a
  handshake elsewhere re-read the directory first.

The guard installs itself on the ``HubSocket``'s batch reader, so every way
of reading it (``serve``, ``read``, ``recv_batch``, with or without
``metadata``) drops what a revoked key sent; a listener without revocable
keys reads as before, at no cost.

Kept whole: one policy (``GuardedListener``) and the descriptor-level helpers only it
uses (out of descriptors, the SYN filter, ``tcp_info``).
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import socket
import struct
import time
from collections import Counter
from functools import cache
from dataclasses import dataclass
from typing import Any, Callable, Optional

import gevent
import zmq

from ..counters import Counters, take_one
from .descriptors import FD_RESERVE
from .socket import KEY_AND_FD, HubSocket, make_socket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .zap import Allowlist

__all__ = ["ConnectionPolicy", "GuardedListener", "default_policy", "set_default_policy",
           "COUNTERS"]

log = logging.getLogger(__name__)

#: the counters a guarded listener adds to (see the module's docstring)
COUNTERS = ("connections_shed", "connections_revoked", "messages_revoked", "accept_paused",
            "accept_held")
#: connections a listener must have held before a fall to half of them trims the heap
TRIM_AFTER = 256
#: seconds between two trims of the heap
TRIM_PERIOD = 10.0


@dataclass(frozen=True)
class ConnectionPolicy:
    """How many connections a listener keeps, and how often it looks for revoked keys."""

    #: connections to one listener (at most half the descriptors beyond ``FD_RESERVE``)
    max_connections: int = 1024
    #: connections to one listener from one other host (None: no bound)
    max_per_address: Optional[int] = 128
    #: seconds between two looks at the allowlist for keys removed from it
    revoke_check: float = 0.25
    #: seconds a listener that could not accept for lack of descriptors stops listening,
    #: and one whose unknown connections were over ``max_unknown`` takes no new ones
    accept_pause: float = 0.5
    #: connections whose sender the owner does not know (``GuardedListener``'s ``keep``),
    #: at most (None: no bound but ``max_connections``)
    max_unknown: Optional[int] = None

    def __post_init__(self) -> None:
        if not self.max_connections >= 1:
            raise ValueError(f"max_connections must be at least 1, not {self.max_connections}")
        for name in ("max_per_address", "max_unknown"):
            value = getattr(self, name)
            if value is not None and not value >= 1:
                raise ValueError(f"{name} must be at least 1, not {value}")
        if not 0 < self.revoke_check <= 1.0:
            raise ValueError(f"revoke_check must be in (0, 1] seconds, not {self.revoke_check}")
        if not self.accept_pause > 0:
            raise ValueError(f"accept_pause must be positive, not {self.accept_pause}")


_default = ConnectionPolicy()


def default_policy() -> ConnectionPolicy:
    """The policy of every overlay listener of the process (unless one is given its own)."""
    return _default


def set_default_policy(policy: ConnectionPolicy) -> ConnectionPolicy:
    """Make ``policy`` the process's default for listeners bound from now on; the old one."""
    global _default
    old, _default = _default, policy
    return old


class GuardedListener:
    """A bound ROUTER kept under a ``ConnectionPolicy`` (see the module's docstring).

    ``allowlist`` (an ``Allowlist`` with a directory): connections of keys
    removed from it are closed and ``on_revoked(keys)`` is called on the hub after
    each change of it (``keys``: those it knew that are gone; the overlay fails the
    work of every key the allowlist no longer holds).
    ``on_event(event, value, endpoint)`` hears the monitor events of
    ``events`` too (libzmq allows one monitor per socket). ``keep(routing_id)``:
    whether the owner knows the sender of a connection that sent under that
    routing id (its connections are never shed; the others are bounded by the
    policy's ``max_unknown``).
    """

    def __init__(self, listener: HubSocket, counters: Counters,
                 policy: Optional[ConnectionPolicy] = None, *,
                 allowlist: Optional[Allowlist] = None,
                 on_revoked: Optional[Callable[[frozenset[str]], None]] = None,
                 events: int = 0,
                 on_event: Optional[Callable[[int, int, str], None]] = None,
                 keep: Optional[Callable[[bytes], bool]] = None) -> None:
        policy = policy or default_policy()
        self.listener = listener
        self.policy = policy
        self.port = listener.port
        self.counters = counters
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.cap = policy.max_connections if limit == resource.RLIM_INFINITY else \
            max(1, min(policy.max_connections, (limit - FD_RESERVE) // 2))
        self.max_per_address = policy.max_per_address
        #: accepted connections still open: descriptor -> when accepted (oldest first)
        self.accepted: dict[int, float] = {}
        #: accepted connections from other hosts: descriptor -> the address
        self.sources: dict[int, str] = {}
        self.per_address: Counter[str] = Counter()
        #: descriptor -> the key (Z85) its messages were authenticated with
        self.keys: dict[int, str] = {}
        #: descriptor -> the routing id its messages came under (learned with ``keep``)
        self.routes: dict[int, bytes] = {}
        self.keep = keep
        self.max_unknown = policy.max_unknown if keep is not None else None
        self._known = 0  # connections ``keep`` accepted at the last count
        self._counted = 0.0  # when the unknown connections were last counted
        self.on_revoked = on_revoked
        self.on_event = on_event
        self._events = events
        #: accepts libzmq reported failed for lack of descriptors (a spinning listener
        #: would report them as fast as it can)
        self.accept_failures = 0
        #: times the heap was trimmed after the connections fell (see ``TRIM_AFTER``)
        self.trims = 0
        self._peak = 0
        self._trimmed = -TRIM_PERIOD
        self._trim_due = False  # a trim waits for TRIM_PERIOD to pass
        self._shed_since = 0  # connections shut down since the last trim
        self._paused = False
        self._held: Optional[int] = None  # the listening descriptor while accept is held
        self._listening: Optional[int] = None  # the listening descriptor, once looked up
        self._closed = False
        self._mandatory = False  # ROUTER_MANDATORY set (by the first ``routes_to``)
        self._greenlets: list[gevent.Greenlet] = []
        # the socket's own, without ``__getattr__`` on each call
        self.socket, self.endpoint = listener.socket, listener.endpoint
        self.try_send, self.try_send_each = listener.try_send, listener.try_send_each
        self.readable, self.recv_batch, self.read = \
            listener.readable, listener.recv_batch, listener.read
        self.allowlist = allowlist if allowlist is not None and not allowlist.any_key else None
        if keep is not None:
            routes = self.routes
            listener.wrap_reader(lambda read: lambda count, limit, max_frames, name:
                                 read(count, limit, max_frames, name, routes))
        if self.allowlist is not None:
            self._checked = self.allowlist.keys
            listener.wrap_reader(self._admitting)
            self._greenlets.append(gevent.spawn(self._watch_keys))
        router = listener.socket
        address = f"inproc://peermesh-monitor-{id(self):x}"
        router.monitor(address, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
                       | zmq.EVENT_ACCEPT_FAILED | events)
        # libzmq sends monitor events blocking (its I/O thread, every connection of the
        # context with it, would wait for this reader): no high-water mark on them
        monitor = make_socket(zmq.PAIR, {zmq.RCVHWM: 0}, router.context)
        monitor.connect(address)
        self._monitor = HubSocket(monitor)
        self._greenlets.append(gevent.spawn(self._monitor.read, self._on_events))

    @property
    def connections(self) -> int:
        """Connections to the listener now open."""
        return len(self.accepted)

    def routes_to(self, identity: bytes) -> bool:
        """True while a connection under routing ``identity`` is open to the listener.

        The ROUTER is asked by sending that identity one empty frame with
        ``ROUTER_MANDATORY`` (which fails at once for an identity it no longer
        routes to); the peer's DEALER receives it, and ZRE peers never read
        their DEALERs (what piles up there stays under the DEALER's receive
        high-water mark, 1000 messages by default). A full pipe means the
        connection is open.
        """
        listener = self.listener
        if not self._mandatory:
            listener.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
            self._mandatory = True
        try:
            listener.try_send([identity, b""])
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                return False
            log.debug("cannot ask the listener about %r: %s", identity, exc)
            return listener.closed is False and exc.errno == zmq.EAGAIN
        return True

    def source_of(self, identity: bytes) -> Optional[str]:
        """The address of the host whose connection a message under routing ``identity``
        came by: "" for this host's own, None when no such message was read (needs
        ``keep``). It scans the connections: for the few messages that ask, as a new
        peer's HELLO (``Session.source``)."""
        for fd, route in self.routes.items():
            if route == identity:
                address = self.sources.get(fd)
                return address if address is not None else _remote_address(fd, self.port)
        return None

    def peer_address(self, identity: bytes) -> Optional[str]:
        """The address the connection a message under routing ``identity`` came by comes
        from, as ZeroMQ's ``Peer-Address`` gives it ("" when it is no TCP connection any
        more), or None when no such message was read (needs ``keep``). It scans the
        connections: for the few messages that ask (a new sender's first)."""
        for fd, route in self.routes.items():
            if route == identity:
                sock = _borrow(fd, self.port)
                if sock is None:
                    return ""
                try:
                    return str(sock.getpeername()[0])
                except (OSError, IndexError):
                    return ""
                finally:
                    sock.detach()
        return None

    #: ``serve`` takes ``take`` (``HubSocket.serve``)
    takes_batches = True

    def serve(self, on_message: Callable[..., None], on_oversized: Any = None,
              backpressure: Any = None, *, metadata: Optional[str] = None,
              after_batch: Optional[Callable[[], None]] = None,
              take: Optional[Callable[[list, int], int]] = None) -> None:
        """``HubSocket.serve`` of the listener."""
        self.listener.serve(on_message, on_oversized, backpressure, metadata=metadata,
                            after_batch=after_batch, take=take)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.listener, name)  # try_send, readable, endpoint ... of the socket

    # --- connections -------------------------------------------------------------

    def _on_events(self, batch: list) -> None:
        accepted, per_address, limit = self.accepted, self.per_address, self.max_per_address or 0
        crowded = set()
        failed = 0
        for first, rest in batch:
            if len(first) < 6:
                continue
            event, fd = _MONITOR_EVENT.unpack_from(first)
            if event == zmq.EVENT_ACCEPTED:
                accepted[fd] = time.monotonic()  # (its first messages may be read already)
                address = _remote_address(fd, self.port) if limit else ""
                if address:
                    self.sources[fd] = address
                    per_address[address] += 1
                    if per_address[address] > limit:
                        crowded.add(address)
            elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                if accepted.pop(fd, None) is not None:
                    self._forget(fd)
            elif event == zmq.EVENT_ACCEPT_FAILED:
                if fd in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    failed += 1
            if self.on_event is not None and rest and event & self._events:
                self.on_event(event, fd, rest[0].decode("utf-8", "replace"))
        for address in crowded:
            self._shed(per_address[address] - limit, address)
        if len(accepted) > self.cap:  # down to 7/8 of it: one scan sheds many
            self._shed(len(accepted) - self.cap + self.cap // 8)
        if self.max_unknown is not None:
            self._bound_unknown(self.max_unknown)
        self.accept_failures += failed
        if failed and not self._paused:
            self._out_of_descriptors()
        count = len(accepted)
        if count > self._peak:
            self._peak = count
        elif self._peak >= TRIM_AFTER and count <= self._peak // 2:
            self._peak = count
            self._trim()
        elif self._shed_since >= TRIM_AFTER:  # a flood turning connections over
            self._trim()

    def _kept(self, fd: int) -> bool:
        """Whether ``keep`` accepts the routing id connection ``fd`` sent under."""
        route = self.routes.get(fd)
        return route is not None and self.keep is not None and self.keep(route)

    def _bound_unknown(self, bound: int) -> None:
        """Over ``bound``, hold the accepts (``_hold``) and shed connections ``keep``
        does not accept down to 7/8 of it. They are counted (each asks ``keep``) only
        when so many connections are open that they could be over it, going by the last
        count, or a second after it (a sender the owner forgot since)."""
        accepted, now = self.accepted, time.monotonic()
        if len(accepted) - self._known <= bound and not (
                len(accepted) > bound and now - self._counted >= 1.0):
            return
        self._counted = now
        kept = self._kept
        self._known = known = sum(1 for fd in list(accepted) if kept(fd))
        unknown = len(accepted) - known
        if unknown > bound:  # no new ones a while: they would be the flood's again,
            self._hold()  # and those shed come back once accepts are no longer held
            self._shed(unknown - bound + bound // 8)  # down to 7/8: one scan sheds many

    def _forget(self, fd: int) -> None:
        self.routes.pop(fd, None)
        self.keys.pop(fd, None)
        address = self.sources.pop(fd, "")
        if address:
            take_one(self.per_address, address)

    def _shed(self, count: int, address: Optional[str] = None) -> int:
        """Shut down ``count`` connections (from ``address`` if given) but those of
        senders ``keep`` accepts; how many were.

        First, oldest first, those that never sent a whole ZMTP greeting
        (``_GREETING`` octets: no handshake), then those that sent under
        ``_SMALL`` octets (no more than a handshake and a greeting), then the
        fewest. Asking the kernel costs a few system calls per connection, so
        the scan stops once it has found enough of the first kind, and lets
        other greenlets run every ``_SHED_BATCH`` connections.
        """
        accepted, small, larger, shed = self.accepted, [], [], 0
        kept = self._kept if self.keep is not None else None
        for i, (fd, when) in enumerate(list(accepted.items())):  # oldest first
            if shed >= count:
                return shed
            if address is not None and self.sources.get(fd) != address:
                continue
            if kept is not None and kept(fd):
                continue  # a known sender's: never shed
            if i and not i % _SHED_BATCH:
                gevent.idle()  # (not sleep(0): that would not let the hub poll for I/O)
            if accepted.get(fd) != when:  # closed (and maybe reused) meanwhile
                continue
            octets = _octets_received(fd, self.port)
            if octets is None:  # not a connection of ours any more: its event is late
                del accepted[fd]
                self._forget(fd)
            elif octets < _GREETING:
                self._shut_down(fd, "connections_shed")
                shed += 1
            elif octets < _SMALL:
                small.append((when, fd))
            else:
                larger.append((octets, when, fd))
        for i, (when, fd) in enumerate(small + [(when, fd) for _, when, fd in sorted(larger)]):
            if shed >= count:
                break
            if i and not i % _SHED_BATCH:
                gevent.idle()
            if accepted.get(fd) == when:
                self._shut_down(fd, "connections_shed")
                shed += 1
        return shed

    def _shut_down(self, fd: int, why: str) -> None:
        del self.accepted[fd]  # (its DISCONNECTED follows)
        self._forget(fd)
        self._shed_since += 1
        if _shut_down(fd, self.port):
            self.counters.add(why)

    def _out_of_descriptors(self) -> None:
        """Accept failed for lack of descriptors: free some, or stop listening a while."""
        self.counters.add("accept_paused")
        if self._shed(max(1, len(self.accepted) // 8)):
            return  # the next accept has descriptors again
        endpoint = self.listener.endpoint
        try:
            self.listener.socket.unbind(endpoint)
        except zmq.ZMQError as exc:
            log.debug("cannot pause listening at %s: %s", endpoint, exc)
            return
        self._paused = True
        log.warning("out of descriptors: not listening at %s for %.1fs", endpoint,
                    self.policy.accept_pause)
        self._later(self.policy.accept_pause, self._listen_again)

    def _listen_again(self) -> None:
        while not self._closed:
            try:
                self.listener.socket.bind(self.listener.endpoint)
            except zmq.ZMQError as exc:
                log.debug("cannot listen at %s again yet: %s", self.listener.endpoint, exc)
                gevent.sleep(self.policy.accept_pause)
                continue
            self._paused = False
            return

    def _later(self, seconds: float, function: Callable[[], None]) -> None:
        """Call ``function`` on the hub in ``seconds`` (unless the guard stops first)."""
        self._greenlets = [g for g in self._greenlets if not g.dead]
        self._greenlets.append(gevent.spawn_later(seconds, function))

    def _hold(self) -> None:
        """Take no new connection for ``accept_pause`` seconds (see the module's docstring)."""
        if self._held is not None or self._paused or self._closed:
            return
        fd = self._listening
        if fd is None or not _listens(fd, self.port):
            fd = self._listening = _listening_descriptor(self.port)
        if fd is None or not _hold_accepts(fd, True):
            return
        self._held = fd
        self.counters.add("accept_held")
        self._later(self.policy.accept_pause, self._release)

    def _release(self) -> None:
        """Accept new connections again."""
        fd, self._held = self._held, None
        if fd is not None and _listens(fd, self.port):
            _hold_accepts(fd, False)

    def _trim(self) -> None:
        """Trim the heap now, or once ``TRIM_PERIOD`` has passed since the last trim (a
        flood's connections rise and fall many times: its last fall is trimmed too)."""
        now = time.monotonic()
        wait = self._trimmed + TRIM_PERIOD - now
        if wait > 0:
            if not self._trim_due:
                self._trim_due = True
                self._later(wait, self._trim_later)
            return
        trim = _malloc_trim()
        if trim is not None:
            self._trimmed = now
            self._shed_since = 0
            self.trims += 1
            trim(0)

    def _trim_later(self) -> None:
        self._trim_due = False
        if not self._closed:
            self._trim()

    # --- revoked keys --------------------------------------------------------------

    def _admitting(self, read: Callable[..., list]) -> Callable[..., list]:
        """``read`` (a ``HubSocket``'s batch reader) reading each message's key and
        descriptor, learning the key of each connection and dropping what keys no longer
        allowed sent; it returns what the caller asked for (``metadata`` None, a key
        for "User-Id", an address for "Peer-Address")."""
        allowlist, keys, counters = self.allowlist, self.keys, self.counters
        assert allowlist is not None
        seen: list = [None, frozenset()]  # the allowlist's keys (bytes) last read, as str

        def batch(count: int, limit: int, max_frames: int, name: Optional[str]) -> list:
            out: list = []
            append = out.append
            pick = 0 if name == "User-Id" else 2 if name == "Peer-Address" else -1
            if pick < 0 and name is not None:
                raise ValueError(f"a guarded listener cannot read {name!r} with the keys")
            while True:
                wanted = count - len(out)
                got = read(wanted, limit, max_frames, KEY_AND_FD)
                if allowlist.keys is not seen[0]:
                    seen[0] = allowlist.keys
                    seen[1] = frozenset(k.decode() for k in seen[0])
                allowed = seen[1]
                last_fd = last_key = None  # a batch mostly comes from few connections
                for first, rest, (key, fd, address) in got:
                    if fd != last_fd or key != last_key:
                        if key is not None and key not in allowed:
                            counters.add("messages_revoked")
                            if fd in self.accepted:
                                self._shut_down(fd, "connections_revoked")
                            continue
                        if key is not None and keys.get(fd) != key:
                            keys[fd] = key
                        last_fd, last_key = fd, key
                    if pick == 0:
                        append((first, rest, key))
                    elif pick < 0:
                        append((first, rest))
                    else:
                        append((first, rest, address))
                # fewer than asked must still mean "found empty" (the edge re-armed)
                if len(got) < wanted or len(out) == count:
                    return out

        return batch

    def _watch_keys(self) -> None:
        allowlist = self.allowlist
        assert allowlist is not None
        while not self._closed:
            gevent.sleep(self.policy.revoke_check)
            allowlist.refresh()
            if allowlist.keys is not self._checked:
                # every key this listener knew that is gone (also one added and removed
                # again between two looks)
                allowed = allowlist.keys
                known = {k.decode() for k in self._checked} | set(self.keys.values())
                self._checked = allowed
                self.revoke(frozenset(k for k in known if k.encode() not in allowed))

    def revoke(self, keys: frozenset[str]) -> int:
        """Close the connections of ``keys`` (Z85) and call ``on_revoked(keys)``, which
        also follows every change of the allowlist (its work may be of keys this listener
        never saw: it checks against the allowlist); how many were closed."""
        closed = 0
        for fd, key in list(self.keys.items()):
            if key in keys and fd in self.accepted:
                self._shut_down(fd, "connections_revoked")
                closed += 1
        if keys:
            log.info("keys no longer allowed: closed %d connection(s) at %s", closed,
                     self.listener.endpoint)
        if self.on_revoked is not None:
            try:
                self.on_revoked(keys)
            except Exception:
                log.exception("failing the work of revoked keys failed")
        return closed

    # --- closing ----------------------------------------------------------------------

    def stop(self) -> None:
        """Stop guarding (the monitor before its reader: libzmq sends its events blocking);
        the socket stays open."""
        if self._closed:
            return
        self._closed = True
        try:
            self.listener.socket.disable_monitor()
        except zmq.ZMQError:
            pass
        gevent.killall(self._greenlets, block=False)
        self._release()
        self._monitor.close()

    def close(self, linger: float = 0.0) -> None:
        """Stop guarding and close the socket."""
        self.stop()
        self.listener.close(linger)


_SHED_BATCH = 16  # connections asked about between two yields of the monitor's reader
_SMALL = 1024  # octets: a connection that sent fewer did no more than a handshake and a HELLO
_GREETING = 64  # octets of a ZMTP 3 greeting: a connection that sent fewer has no handshake
_MONITOR_EVENT = struct.Struct("=HI")  # event number, value (a descriptor for ours)
_TCP_INFO_SIZE = 232
_BYTES_RECEIVED = struct.Struct("=Q")  # struct tcp_info's tcpi_bytes_received ...
_BYTES_RECEIVED_AT = 128  # ... at this offset (Linux 4.1 and later)


@cache
def _malloc_trim() -> Optional[Callable[[int], int]]:
    """glibc's ``malloc_trim``, None elsewhere; looked up on first use (ctypes is
    loaded only by a listener that had many connections to give back)."""
    import ctypes
    try:
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not glibc
        return None


def _borrow(fd: int, port: int) -> Optional[socket.socket]:
    """A socket object on descriptor ``fd`` (not a copy: ``detach`` it after) if ``fd`` is
    still a TCP connection accepted on local ``port``; otherwise None."""
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=fd)  # (no probing)
    except OSError:  # closed already (its event is on the way)
        return None
    try:
        if sock.getsockname()[1] == port:
            return sock
    except (OSError, IndexError, TypeError):
        pass
    sock.detach()
    return None


def _listens(fd: int, port: int) -> bool:
    """Whether ``fd`` is a TCP socket listening on local ``port``."""
    try:
        sock = socket.socket(fileno=fd)  # (probes its family: a listener may be IPv6)
    except OSError:
        return False
    try:
        return sock.type == socket.SOCK_STREAM and sock.getsockname()[1] == port and \
            bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    except (OSError, IndexError, TypeError):
        return False
    finally:
        sock.detach()


def _listening_descriptor(port: int) -> Optional[int]:
    """The descriptor of this process listening on TCP ``port`` (libzmq's, for a bound
    ROUTER), None if there is none."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in names:
        if name.isdigit() and _listens(int(name), port):
            return int(name)
    return None


#: classic BPF on a listening TCP socket (the data starts at the TCP header): drop a
#: segment that has SYN and not ACK (a new connection), keep every other (handshakes
#: under way; connections accepted meanwhile inherit the filter, and never get such one)
_DROP_SYN = ((0x30, 0, 0, 13),  # ldb [13]: the flags
             (0x54, 0, 0, 0x12),  # and #(SYN | ACK)
             (0x15, 0, 1, 0x02),  # jeq #SYN: the next, else the one after
             (0x06, 0, 0, 0),  # ret #0: drop
             (0x06, 0, 0, 0xFFFFFFFF))  # ret #-1: keep it whole
_SO_ATTACH_FILTER, _SO_DETACH_FILTER = 26, 27  # Linux's <asm-generic/socket.h>


@cache
def _syn_filter() -> tuple[Any, bytes]:
    """``_DROP_SYN`` in memory and a ``struct sock_fprog`` pointing at it (ctypes is
    loaded only by a listener that holds its accepts)."""
    import ctypes
    code = ctypes.create_string_buffer(b"".join(struct.pack("=HBBI", *op) for op in _DROP_SYN))
    return code, struct.pack("@HP", len(_DROP_SYN), ctypes.addressof(code))


def _hold_accepts(fd: int, hold: bool) -> bool:
    """Have the kernel drop (``hold``) or take again the new connections to listening
    socket ``fd``; whether it did."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return False
    try:
        if hold:
            sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, _syn_filter()[1])
        else:
            sock.setsockopt(socket.SOL_SOCKET, _SO_DETACH_FILTER, 0)
        return True
    except OSError as exc:  # not Linux, or no filter attached
        log.debug("cannot %s new connections on descriptor %d: %s",
                  "hold" if hold else "take again", fd, exc)
        return False
    finally:
        sock.detach()


def _remote_address(fd: int, port: int) -> str:
    """The address connection ``fd`` comes from; "" when it is the connection's own local
    address (this host) or ``fd`` is no longer one of ``port``'s connections."""
    sock = _borrow(fd, port)
    if sock is None:
        return ""
    try:
        remote, local = sock.getpeername()[0], sock.getsockname()[0]
    except (OSError, IndexError):
        return ""
    finally:
        sock.detach()
    return "" if remote == local else remote


def _octets_received(fd: int, port: int) -> Optional[int]:
    """Octets connection ``fd`` has received so far (0 if the kernel cannot tell), or None
    when ``fd`` is no longer one of ``port``'s connections."""
    sock = _borrow(fd, port)
    if sock is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
    except OSError:
        return 0
    finally:
        sock.detach()
    if len(info) < _BYTES_RECEIVED_AT + 8:
        return 0
    return int(_BYTES_RECEIVED.unpack_from(info, _BYTES_RECEIVED_AT)[0])


def _shut_down(fd: int, port: int) -> bool:
    """Shut connection ``fd`` down both ways if it is still one of ``port``'s (libzmq sees
    it end and closes it); whether it was."""
    sock = _borrow(fd, port)
    if sock is None:
        return False
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()
    return True
