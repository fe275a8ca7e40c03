"""An in-process network with the transport interface of ``peermesh.io.transport``.

How it works
------------
Time is virtual: a ``SimClock`` keeps a heap of timers; ``advance`` pops the
due ones in order, sets the clock to each one's time, runs it, then lets every
greenlet it woke run (``gevent.idle``) before the next. Node timers
(``transport.sleep``) and deliveries are such timers, so a node's 30-second
expiry takes milliseconds of real time.

Each host gets an address in 10.0.0.0/8. Beacons (UDP) sent to the broadcast
address reach every other host on the sender's island after the link's
latency (plus jitter), each copy lost with the link's ``loss`` probability;
unicast beacons reach the host they name. Mailbox messages (TCP) are
reliable and ordered per link while both ends are up and on one island;
across a partition, or to a mailbox that is gone, they are lost (a real
connection would break). Partitions split the hosts into islands and can be
healed; every setting may change while the simulation runs.

Everything due at one virtual instant travels as one timer: the beacon copies
of one send, and all mailbox messages that arrive at the same time (with a
fixed latency, a whole round of HELLOs), so a mesh of thousands of nodes does
not put millions of entries on the clock's heap. Jitter is drawn in
``JITTER_STEPS`` even steps rather than from a continuum, so that with jitter
too the copies and messages sent at one instant arrive at a few instants, not
each at its own (every distinct instant costs a pass through the event loop).
While time advances the cyclic garbage collector is paused: thousands of
nodes are millions of long-lived objects, every full collection scans them
all, and the simulator and nodes make almost no reference cycles (reference
counting frees the rest).
It runs as usual between ``advance`` calls.
"""

from __future__ import annotations

import errno
import functools
import gc
import heapq
import ipaddress
import random
import struct
from collections import deque
from itertools import count
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence

import gevent
import gevent.event

from ..config import UNBOUNDED_PEERS
from ..net.interfaces import Interface

if TYPE_CHECKING:
    from ..io.transport import Link, Mailbox, Transport

__all__ = ["SimClock", "SimNetwork", "SimTransport", "LinkSettings"]

NETWORK = ipaddress.IPv4Network("10.0.0.0/8")
BROADCAST = str(NETWORK.broadcast_address)
_BROADCAST_BYTES = NETWORK.broadcast_address.packed
#: jitter takes one of this many + 1 evenly spaced values from 0 to the link's jitter
JITTER_STEPS = 16


class SimClock:
    """Virtual time for every node of one simulated network."""

    def __init__(self) -> None:
        self._now = 0.0
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._order = count()

    def now(self) -> float:
        """Virtual seconds since the simulation began."""
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        """Run ``callback()`` once virtual time reaches ``when``."""
        heapq.heappush(self._timers, (max(when, self._now), next(self._order), callback))

    def sleep(self, seconds: float) -> None:
        """Block the calling greenlet for ``seconds`` of virtual time."""
        wake = gevent.event.Event()
        self.call_at(self._now + seconds, wake.set)
        wake.wait()

    def advance(self, seconds: float) -> None:
        """Move virtual time forward, running everything that falls due on the way."""
        if not gc.isenabled():
            self._advance(seconds)
            return
        gc.disable()
        try:
            self._advance(seconds)
        finally:
            gc.enable()

    def _advance(self, seconds: float) -> None:
        end = self._now + seconds
        timers = self._timers
        gevent.idle()
        while timers and timers[0][0] <= end:
            when = timers[0][0]
            self._now = when
            while timers and timers[0][0] == when:
                heapq.heappop(timers)[2]()
            gevent.idle()
        self._now = end


class LinkSettings:
    """Latency and jitter (seconds) and beacon loss probability of a link."""

    __slots__ = ("latency", "jitter", "loss")

    def __init__(self, latency: float = 0.0, jitter: float = 0.0, loss: float = 0.0) -> None:
        if latency < 0 or jitter < 0 or not 0 <= loss <= 1:
            raise ValueError("latency and jitter must be >= 0 and loss within 0..1")
        self.latency, self.jitter, self.loss = latency, jitter, loss


class SimNetwork:
    """One simulated LAN: hosts, islands, links and counters."""

    def __init__(self, latency: float = 0.0, jitter: float = 0.0, loss: float = 0.0,
                 seed: Optional[int] = None) -> None:
        self.clock = SimClock()
        self.default = LinkSettings(latency, jitter, loss)
        self.random = random.Random(seed)
        self._links: dict[tuple[str, str], LinkSettings] = {}
        self._island: dict[str, int] = {}          # host address -> island number
        self._beacons: dict[int, dict[str, "SimBeaconSocket"]] = {}  # port -> host -> socket
        self._mailboxes: dict[str, "SimMailbox"] = {}  # endpoint -> mailbox
        # messages due at one instant: up links to mailboxes, and down from mailboxes
        self._arriving: dict[float, list[tuple[SimLink, SimMailbox, Sequence[bytes]]]] = {}
        self._descending: dict[float, list[tuple[SimLink, SimMailbox, Sequence[bytes]]]] = {}
        #: what comes down links from mailboxes, for the links that have any (until closed)
        self._inboxes: dict[SimLink, _Inbox] = {}
        self._partitioned = False
        self._hosts = 0
        #: mailbox messages and beacon copies: sent = delivered + lost + in flight
        self.sent = self.delivered = self.lost = 0
        self.beacons_sent = self.beacons_delivered = self.beacons_lost = 0
        self.beacons_in_flight = 0

    # --- topology -------------------------------------------------------

    def transport(self) -> "SimTransport":
        """A transport for one new host (its own address)."""
        self._hosts += 1
        if self._hosts >= NETWORK.num_addresses - 2:
            raise ValueError("the simulated network is full")
        address = str(NETWORK.network_address + self._hosts)
        self._island[address] = 0
        return SimTransport(self, address)

    def set_link(self, a: str, b: str, latency: Optional[float] = None,
                 jitter: Optional[float] = None, loss: Optional[float] = None) -> None:
        """Change the link between hosts ``a`` and ``b`` (both directions)."""
        old = self._settings(a, b)
        new = LinkSettings(old.latency if latency is None else latency,
                           old.jitter if jitter is None else jitter,
                           old.loss if loss is None else loss)
        self._links[(a, b)] = self._links[(b, a)] = new

    def set_default(self, latency: Optional[float] = None, jitter: Optional[float] = None,
                    loss: Optional[float] = None) -> None:
        """Change every link without its own settings."""
        d = self.default
        self.default = LinkSettings(d.latency if latency is None else latency,
                                    d.jitter if jitter is None else jitter,
                                    d.loss if loss is None else loss)

    def partition(self, islands: Sequence[Iterable[str]]) -> None:
        """Split the hosts: each listed group of addresses becomes an island of its own.

        Hosts not listed stay together on island 0.
        """
        for address in self._island:
            self._island[address] = 0
        for number, island in enumerate(islands, start=1):
            for address in island:
                if address not in self._island:
                    raise ValueError(f"no simulated host {address}")
                self._island[address] = number
                self._partitioned = True

    def heal(self) -> None:
        """Join every island again."""
        for address in self._island:
            self._island[address] = 0
        self._partitioned = False

    def _settings(self, a: str, b: str) -> LinkSettings:
        return self._links.get((a, b), self.default) if self._links else self.default

    def _reachable(self, a: str, b: str) -> bool:
        return not self._partitioned or self._island.get(a) == self._island.get(b)

    def _delay(self, settings: LinkSettings) -> float:
        if settings.jitter:
            step = settings.jitter / JITTER_STEPS
            return settings.latency + step * self.random.randint(0, JITTER_STEPS)
        return settings.latency

    # --- beacons --------------------------------------------------------

    def _bind_beacon(self, sock: "SimBeaconSocket") -> None:
        self._beacons.setdefault(sock.port, {})[sock.host] = sock

    def _unbind_beacon(self, sock: "SimBeaconSocket") -> None:
        hosts = self._beacons.get(sock.port, {})
        if hosts.get(sock.host) is sock:
            del hosts[sock.host]

    def _send_beacon(self, source: str, data: bytes, host: str, port: int) -> None:
        sockets = self._beacons.get(port, {})
        if host in (BROADCAST, "255.255.255.255"):
            targets = [s for h, s in sockets.items() if h != source]
            destination = _BROADCAST_BYTES
        else:
            target = sockets.get(host)
            targets = [target] if target is not None else []
            destination = ipaddress.IPv4Address(host).packed if host in self._island else b""
        self.beacons_sent += len(targets)
        now = self.clock.now()
        batch: dict[float, list[SimBeaconSocket]] = {}
        default = self.default
        if not (self._partitioned or self._links or default.loss or default.jitter):
            if targets:  # (every copy alike: one batch, no draws, as below)
                batch[now + default.latency] = targets
        else:
            for target in targets:
                settings = self._settings(source, target.host)
                if not self._reachable(source, target.host) or (
                        settings.loss and self.random.random() < settings.loss):
                    self.beacons_lost += 1
                    continue
                batch.setdefault(now + self._delay(settings), []).append(target)
        for when, group in batch.items():
            self.beacons_in_flight += len(group)

            def deliver(group: list[SimBeaconSocket] = group) -> None:
                self.beacons_in_flight -= len(group)
                bound = self._beacons.get(port, {})
                for target in group:
                    if bound.get(target.host) is target:
                        self.beacons_delivered += 1
                        target.deliver(data, source, destination)
                    else:  # its host closed the socket meanwhile
                        self.beacons_lost += 1
            self.clock.call_at(when, deliver)

    @property
    def in_flight(self) -> int:
        """Mailbox messages sent and not yet delivered or lost."""
        return sum(map(len, self._arriving.values())) + sum(map(len, self._descending.values()))

    # --- mailboxes ------------------------------------------------------

    def _bind_mailbox(self, mailbox: "SimMailbox") -> None:
        self._mailboxes[mailbox.endpoint] = mailbox

    def _unbind_mailbox(self, mailbox: "SimMailbox") -> None:
        if self._mailboxes.get(mailbox.endpoint) is mailbox:
            del self._mailboxes[mailbox.endpoint]

    def _send(self, link: "SimLink", frames: Sequence[bytes]) -> None:
        # (every mailbox message of the simulation passes here: the common case, no
        # partition, no per-link settings and no jitter, costs no calls)
        self.sent += 1
        mailbox = self._mailboxes.get(link.endpoint)
        if mailbox is None or (self._partitioned
                               and not self._reachable(link.source, mailbox.host)):
            self.lost += 1
            return
        settings = self._settings(link.source, mailbox.host) if self._links else self.default
        when = self.clock._now + (self._delay(settings) if settings.jitter else settings.latency)
        if when < link.last_delivery:
            when = link.last_delivery
        link.last_delivery = when
        self._schedule(self._arriving, when, (link, mailbox, frames))

    def _send_down(self, mailbox: "SimMailbox", link: "SimLink", frames: Sequence[bytes]) -> None:
        """A mailbox sends back down a link connected to it (a ROUTER to a DEALER)."""
        self.sent += 1
        if not self._reachable(link.source, mailbox.host):
            self.lost += 1
            return
        inbox = link.inbox
        when = max(self.clock.now() + self._delay(self._settings(mailbox.host, link.source)),
                   inbox.last_arrival)
        inbox.last_arrival = when
        self._schedule(self._descending, when, (link, mailbox, frames))

    def _schedule(self, due: dict[float, list[tuple["SimLink", "SimMailbox", Sequence[bytes]]]],
                  when: float, entry: tuple["SimLink", "SimMailbox", Sequence[bytes]]) -> None:
        arriving = due.get(when)
        if arriving is None:
            arriving = due[when] = []
            down = due is self._descending
            self.clock.call_at(when, lambda: self._arrive(when, down))
        arriving.append(entry)

    def _arrive(self, when: float, down: bool = False) -> None:
        """Hand every message due at ``when`` to its mailbox (or, ``down``, its link), in
        the order they were sent."""
        mailboxes = self._mailboxes
        for link, mailbox, frames in (self._descending if down else self._arriving).pop(when):
            if mailboxes.get(link.endpoint) is mailbox and not link.closed:
                self.delivered += 1
                if down:
                    link.deliver(frames)
                else:
                    mailbox.deliver(link, frames)
            else:
                self.lost += 1


@functools.lru_cache(maxsize=4096)
def _pktinfo(destination: bytes) -> bytes:
    """IP_PKTINFO (struct in_pktinfo) naming ``destination``."""
    return struct.pack("=I4s4s", 0, destination, destination)


class SimBeaconSocket:
    """The UDP beacon socket of one simulated host."""

    def __init__(self, network: SimNetwork, host: str, port: int) -> None:
        self.network, self.host, self.port = network, host, port
        self._queue: deque[tuple[bytes, str, bytes]] = deque()
        self._ready = gevent.event.Event()
        network._bind_beacon(self)

    def deliver(self, data: bytes, source: str, destination: bytes) -> None:
        self._queue.append((data, source, destination))
        self._ready.set()

    def setsockopt(self, *args: Any) -> None:
        """Options mean nothing here."""

    def sendto(self, data: bytes, address: tuple[str, int]) -> int:
        self.network._send_beacon(self.host, bytes(data), address[0], address[1])
        return len(data)

    def recvmsg(self, size: int, ancillary: int = 0) -> tuple[bytes, list, int, tuple[str, int]]:
        """Like ``socket.recvmsg``, with IP_PKTINFO naming the destination address."""
        while not self._queue:
            self._ready.clear()
            self._ready.wait()
        data, source, destination = self._queue.popleft()
        return data[:size], [(0, 8, _pktinfo(destination))], 0, (source, self.port)

    def recvfrom(self, size: int) -> tuple[bytes, tuple[str, int]]:
        data, _, _, address = self.recvmsg(size)
        return data, address

    def close(self) -> None:
        self.network._unbind_beacon(self)


class SimMailbox:
    """A node's mailbox: messages arrive in order from the network."""

    def __init__(self, network: SimNetwork, host: str, port: int, max_message: int) -> None:
        self.network, self.host, self.port = network, host, port
        self.endpoint = f"tcp://{host}:{port}"
        self.max_message = max_message
        self._queue: deque[tuple[SimLink, Sequence[bytes]]] = deque()
        self._ready = gevent.event.Event()
        self._reading: Optional[SimLink] = None  # the link of the message ``serve`` hands on
        #: set by an owner that sends back down the links (a ROUTER, as the Flux tree
        #: uses it): only then are links remembered, by identity (a ZRE mailbox never
        #: sends, and thousands of them would keep a link per peer each)
        self.replies = False
        self._links: dict[bytes, SimLink] = {}
        network._bind_mailbox(self)

    def deliver(self, link: "SimLink", frames: Sequence[bytes]) -> None:
        if self.replies:
            self._links[link.identity] = link
        self._queue.append((link, frames))
        self._ready.set()

    def source_of(self, identity: bytes) -> Optional[str]:
        """The address the message ``serve`` is handing on came from, if ``identity``
        sent it (a real mailbox reads it as the message's "Peer-Address")."""
        link = self._reading
        return link.source if link is not None and link.identity == identity else None

    def try_send(self, frames: Sequence[bytes]) -> bool:
        """Send ``frames[1:]`` down the link whose identity is ``frames[0]`` (as a
        ROUTER with ROUTER_MANDATORY: ``OSError`` EHOSTUNREACH when it is gone)."""
        link = self._links.get(frames[0])
        if link is None or link.closed:
            self._links.pop(frames[0], None)
            raise OSError(errno.EHOSTUNREACH, "no such peer")
        self.network._send_down(self, link, frames[1:])
        return True

    def serve(self, on_message: Callable[[bytes, list[bytes]], None],
              on_oversized: Optional[Callable[[bytes], None]] = None, backpressure: Any = None, *,
              after_batch: Optional[Callable[[], None]] = None,
              metadata: Optional[str] = None) -> None:
        """Call ``on_message(identity, frames)`` for every message; ``after_batch()`` once
        the queue is drained (what arrived together is one batch). With ``metadata``,
        ``on_message`` gets that property as a third argument: the sender's address for
        "Peer-Address", else None (a simulated link has no other)."""
        queue = self._queue
        full = backpressure.full if backpressure is not None else None
        while True:
            while queue:
                if full is not None and full():
                    backpressure.wait_room()
                link, frames = queue.popleft()
                if sum(map(len, frames)) > self.max_message:
                    if on_oversized is not None:
                        on_oversized(link.identity)
                elif metadata is not None:
                    on_message(link.identity, list(frames),  # type: ignore[call-arg]
                               link.source if metadata == "Peer-Address" else None)
                else:  # a list of its own, as a real mailbox gives, made only now
                    self._reading = link
                    on_message(link.identity, list(frames))
                    self._reading = None
            if after_batch is not None:
                after_batch()
            self._ready.clear()
            self._ready.wait()

    def close(self, linger: float = 0) -> None:
        self.network._unbind_mailbox(self)


class _Inbox:
    """What comes down a link from the mailbox it connects to (made when first needed:
    nothing comes down a ZRE link, and a mesh has N*(N-1) links)."""

    __slots__ = ("queue", "ready", "last_arrival", "limit")

    def __init__(self) -> None:
        self.queue: deque[Sequence[bytes]] = deque()
        self.ready: Optional[gevent.event.Event] = None
        self.last_arrival = 0.0
        self.limit = 0  # bytes of a message ``serve`` hands on (0: no limit)


class SimLink:
    """A connection from one host to a mailbox endpoint; never full. The mailbox
    may send back down it (``serve`` reads what it sends)."""

    __slots__ = ("network", "source", "identity", "endpoint", "last_delivery", "closed")

    def __init__(self, network: SimNetwork, source: str, identity: bytes, endpoint: str) -> None:
        self.network, self.source, self.identity, self.endpoint = network, source, identity, endpoint
        self.last_delivery = 0.0
        self.closed = False

    @property
    def inbox(self) -> _Inbox:
        """What comes down this link (kept by the network, for the links that have any)."""
        inbox = self.network._inboxes.get(self)
        if inbox is None:
            inbox = self.network._inboxes[self] = _Inbox()
        return inbox

    @property
    def limit(self) -> int:
        """Bytes of a message ``serve`` hands on (0: no limit); larger ones are dropped."""
        inbox = self.network._inboxes.get(self)
        return inbox.limit if inbox is not None else 0

    @limit.setter
    def limit(self, value: int) -> None:
        self.inbox.limit = value

    def deliver(self, frames: Sequence[bytes]) -> None:
        inbox = self.inbox
        inbox.queue.append(frames)
        if inbox.ready is not None:
            inbox.ready.set()

    def serve(self, on_message: Callable[[bytes, list[bytes]], None],
              on_oversized: Optional[Callable[[bytes], None]] = None,
              backpressure: Any = None, *,
              after_batch: Optional[Callable[[], None]] = None) -> None:
        """Call ``on_message(first frame, the rest)`` for what the mailbox sends, until closed
        (``after_batch()`` once the queue is drained)."""
        inbox = self.inbox
        queue = inbox.queue
        ready = inbox.ready = gevent.event.Event()
        while not self.closed:
            while queue and not self.closed:
                frames = queue.popleft()
                if inbox.limit and sum(map(len, frames)) > inbox.limit:
                    if on_oversized is not None:
                        on_oversized(frames[0] if frames else b"")
                elif frames:
                    on_message(frames[0], list(frames[1:]))
            if after_batch is not None and not self.closed:
                after_batch()
            ready.clear()
            ready.wait()

    def try_send(self, frames: Sequence[bytes]) -> bool:
        self.network._send(self, frames)  # nodes never change frames once sent
        return True

    def try_send_each(self, messages: Sequence[Sequence[bytes]]) -> int:
        for frames in messages:
            self.network._send(self, frames)
        return len(messages)

    def wait_writable(self, timeout: Optional[float] = None) -> bool:
        return True

    def close(self, linger: float = 0) -> None:
        self.closed = True
        inbox = self.network._inboxes.pop(self, None)
        if inbox is not None:
            inbox.queue.clear()
            if inbox.ready is not None:
                inbox.ready.set()


class SimTransport:
    """The transport interface for one simulated host."""

    def __init__(self, network: SimNetwork, address: str) -> None:
        self.network = network
        self.address = address
        self.now = network.clock.now
        self.sleep = network.clock.sleep
        self._ports = count(0xC000)

    def interface(self, choice: Optional[str]) -> Interface:
        return Interface("sim0", self.address, NETWORK)

    def bind_mailbox(self, address: str, max_message: int,
                     endpoint: Optional[str] = None, **limits: Any) -> SimMailbox:
        """A mailbox on this host: at ``endpoint``'s port if given, else the next free one
        (the limits of real mailboxes, connections and handshake time, bound nothing here)."""
        port = int(endpoint.rpartition(":")[2]) if endpoint else next(self._ports)
        return SimMailbox(self.network, self.address, port, max_message)

    @staticmethod
    def guard(mailbox: SimMailbox, counters: Any = None, policy: Any = None,
              **options: Any) -> SimMailbox:
        """``mailbox`` itself: simulated hosts have no connections to bound."""
        return mailbox

    def connect(self, identity: bytes, endpoint: str, sndhwm: int,
                server_key: Optional[bytes] = None, handover: bool = False,
                max_message: Optional[int] = None) -> SimLink:
        """A link to ``endpoint`` (keys mean nothing here); with ``max_message`` larger
        messages back down it are dropped."""
        link = SimLink(self.network, self.address, identity, endpoint)
        if max_message is not None:
            link.limit = max_message
        return link

    def beacon_socket(self, port: int) -> SimBeaconSocket:
        return SimBeaconSocket(self.network, self.address, port)

    @staticmethod
    def peer_capacity() -> int:
        """Simulated hosts have no descriptors: no cap follows from them."""
        return UNBOUNDED_PEERS

    def check_capacity(self, peers: int) -> None:
        """Simulated hosts have no descriptor limit."""


if TYPE_CHECKING:  # the simulated network implements the transport interface
    def _conforms(transport: SimTransport) -> Transport:
        return transport

    def _mailbox_conforms(mailbox: SimMailbox) -> "Mailbox":
        return mailbox

    def _link_conforms(link: SimLink) -> "Link":
        return link
