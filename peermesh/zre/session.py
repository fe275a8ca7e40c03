"""The ZRE v2 session of one node, without I/O: a peer table fed frames, reports and time.

How it works
------------
A ``Session`` is what a node knows and decides; its driver (``node.Node``)
moves bytes and time. It is a core of ``peermesh.core``:

* ``receive(identity, frames, now)`` - one message from the mailbox (named
  by its sender's routing identity); its fast path ``delivery`` returns the
  event of the next WHISPER or SHOUT itself, no output list, for a driver
  that hands events on (``Node``'s mailbox reader: most of the traffic);
* ``handle_timer(now)`` at ``next_deadline()`` - the liveness timers (at
  most ``min(interval, evasive / 2)`` apart) and, while a claim or departure
  waits on a peer's link, its settling (at once, then every few milliseconds
  backing off to ``SETTLE_STEP``);
* reports of discovery sources - ``peer_appeared(uuid, endpoint, now)`` /
  ``peer_alive(uuid, now)`` / ``peer_left(uuid, now)`` - and the
  application's ``add_group`` / ``remove_group`` / ``contest`` / ``ping``,
  whose outputs ``take()`` hands over.

Outputs: ``Dial(uuid, endpoint, our identity)`` opens a link to a peer's
mailbox; the driver answers it with ``attach(uuid, outbox)`` (or None: none
could be made) before it feeds the session again, and what was sent to the
peer meanwhile goes to that outbox first. ``Emit(event)`` carries ENTER,
EXIT, JOIN, LEAVE, LEADER, EVASIVE, SILENT, CONFIRM; ``Deliver(event)`` a
WHISPER or SHOUT. Commands to a peer are not ``Send`` outputs: they are
numbered and ``offer``-ed to the peer's ``Outbox`` at once, the
flow-controlled path (its bounded backlog, ``has_room``; see below). Two
queries are injected: ``linked(identity)`` says whether that routing
identity holds a connection to our mailbox now (None: cannot tell), and
``source(identity)`` the address the message being handled came from (None:
cannot tell). Nothing here reads a clock, opens a socket or blocks, and
nothing is called back: every input's outputs are returned or left for
``take``.

Peer states and transitions (all of them are in this module)::

    (none) --beacon/PEX/mDNS report------> connecting  (link opened, HELLO sent)
    (none) --HELLO from a new node-------> ready       (link opened, HELLO sent; ENTER)
    connecting --its HELLO---------------> ready       (ENTER, JOINs)
    ready --next command in sequence-----> ready       (WHISPER/SHOUT/JOIN/LEAVE, PING-OK...)
    ready --sequence gap, out of order---> connecting  (EXIT "sequence gap"; HELLO again
                                                        at once, so the peer restarts too)
    ready --a second HELLO (restart)-----> ready again (EXIT "restarted", then ENTER)
    ready --the same HELLO again, -------> ready       (our HELLO again on a fresh link;
          nothing unconfirmed                           no event: see below)
    ready, link closed --HELLO of a ----> (none)      (EXIT "replaced by another node at
          new UUID at its endpoint                      its endpoint"; the new one ENTERs)
    any --HELLO of a new UUID at its ---> claimed     (PINGed; see below; what the new
          endpoint                                      node sends after it is held)
    claimed --sign of life in interval---> as before   (the claim and what it held dropped)
    claimed --link closes, or none ------> (none)      (EXIT "replaced by another node
          in interval                                   at its endpoint"; the new one
                                                        ENTERs, then its held commands)
    ready --silent >= evasive------------> PINGed      (EVASIVE once; SILENT at ``silent``)
    any --silent >= expired--------------> (none)      (EXIT "expired"), unless its send
                                                        backlog is still draining
    any --backlog stalled >= expired-----> (none)      (EXIT "not responding")
    any --port-0 beacon from its address-> (none)      (EXIT "left"; reports ignored
          / mDNS goodbye, link closed                   for ``expired`` after)
    ready --the same, link open----------> leaving     (PINGed)
    leaving --link closes in interval,---> (none)      (EXIT "left")
          or no PING-OK by then
    leaving --PING-OK, link open at -----> ready       (the beacon was forged:
          interval                                      ``leaves_ignored``)
    connecting --no HELLO in hello_timeout-> (none)    (no event)

Sequence numbers: HELLO is 1, every later command the next number mod
65536; anything else disconnects the peer and sends it a fresh HELLO at
once: to Zyre as to peermesh a second HELLO means a restart, so the peer
starts over and says HELLO back instead of sending on into a session that
ignores it. A second HELLO from a ready peer's endpoint with its name and
headers, while nothing sent to it waits to be confirmed (``unconfirmed``,
a ``flush``), is that node starting over with us (it gave up on us: our
HELLO never reached it, as when its allowlist refused our key then): our
HELLO goes again on a fresh link and no event is emitted, as nothing was
lost (``sessions_restarted``). The first same HELLO after ours went again
so (or after a restart), within ``evasive``, answers ours or crossed it on
the way: it is taken in without a word back and is no restart, whatever
was sent meanwhile. Any message, and any discovery report, is a sign of
life.

A node at a known endpoint under a new UUID: a peer that crashed and came
back at the same port (Zyre does: it binds the first free port from 49152)
sends HELLO under its new UUID. Only one process listens at an endpoint,
so if the old peer's connection to our mailbox has closed (``linked``), or
it has been silent for ``evasive``, it is replaced at once. Otherwise the
old peer is PINGed: if its connection closes, or it shows no sign of life
within ``interval`` (a live node beacons that often, and answers a PING
sooner), it is replaced by the new one then; if it lives, the claim was
false and is dropped, so no one can evict a live peer by claiming its
mailbox. Zyre sends as soon as it has heard our beacon, so what the new
node sends after its HELLO is held meanwhile (``HELD_MESSAGES`` and
``max_message`` octets; more is dropped, ``held_dropped``, and the gap it
leaves resynchronises as above) and applied in order once it is in.

Zyre's leader election (ELECT, LEADER) runs in ``election``; the session
feeds it the waves of its own groups from their members, sends what it
asks, reports LEADER and keeps each group's winner (``leaders``). A
contested group (``contest``) starts a wave when a peer joins it and when
its leader leaves (or a wave was under way); a wave not over within
``interval`` (they take milliseconds) is dropped, and a contester starts
again.

Flow control lives in the ``Outbox``: ``has_room`` is False once a peer's
backlog reaches its bound; ``queued``/``limit`` let control commands go past
that bound up to twice it, after which the peer counts as not responding.
A link whose backlog drains (``stalled_since`` recent) keeps its peer from
expiring: its process still takes what is sent, it is only busy.

Bounds on what remote senders control (``NodeConfig``; each refusal is
counted in ``counters`` and logged at most once per ``REPORT_PERIOD``):
``max_peers`` peers in the table, of which at most ``max_pending`` found by
discovery and still waiting for HELLO (a new one found when they are
full sheds the oldest if that has waited ``interval``, as a live node
answers at once; a HELLO, which proves a live connection, sheds the oldest
of those when the table is full, else a peer that is EVASIVE);
``max_unproven`` peers that said HELLO before any report of them and have
not proven since that a node lives at the endpoint they name (a PING-OK, or
a report there; ``unproven``): a new one sheds the oldest if a PING to it
went unanswered for ``hello_timeout`` (the PINGs go when the bound is first met,
unless ``rtt_probe`` sent them), else its HELLO waits, with no link, until a
report comes from its endpoint (it enters then) or ``hello_timeout`` passed
(refused: at most ``max_pending`` HELLOs and ``HELD_HELLO_OCTETS`` wait);
a HELLO that came from the address its endpoint names (when the driver can
tell, ``source``), another host's and not loopback, is not unproven: only
that host could send it, and the next bound caps what one address makes;
``max_peers_per_address`` peers at one address (their endpoint's; the
node's own address, where its host's other nodes live, is not counted: a
flood from one host cannot fill the table, and a peer that said HELLO sheds
one of its address's peers still waiting for HELLO rather than being
refused); ``hello_timeout`` for a found peer to say HELLO; ``max_hello``
octets of HELLO; ``max_groups`` groups per peer (a join or leave costs O(1)); and the
departed peers remembered, at most ``max_peers``. A port-0 beacon removes a
peer only when it comes from the peer's own address and its link confirms
it (above), and a report of a known UUID at another endpoint neither moves
nor refreshes it.

Peer exchange (``X-PM-PEX``, a peermesh extension): a node that uses seeds
asks for it in its HELLO headers; a node that sees that header sends it the
UUID and endpoint of every other ready peer in ``PEER-EXCHANGE`` commands.

Kept whole: one state machine (``Session``): one input reads and changes the peer table,
the groups, the claims and the waves together (a HELLO may shed a pending peer, settle a
claim, join groups, start a wave and send PEX in one call), so no part of it can be
followed apart from the rest; the parts that stand alone are apart already (the table's
rows, ``Peer`` and its ``Outbox``, in ``table``, Zyre's election in ``election``,
round-trip times in ``roundtrip``, the key gate in ``curve``, the send backlog in
``peer``). Moving methods out would need mixins or a back-reference to the session: the
reading split, the state not.
"""

from __future__ import annotations

import functools
import logging
import re
from collections import Counter, deque
from typing import Callable, Hashable, Optional, Sequence
from uuid import UUID

from ..config import UNBOUNDED_PEERS, NodeConfig
from ..core import Deliver, Dial, Emit, Output, Outputs
from ..counters import Counters, take_one
from ..errors import ProtocolError
from ..events import Event, EventType
from ..wire import zre
from .election import Elected, Election, SendElect, parse_id, zyre_id
from .roundtrip import RoundTrip
from .table import Dialling, Outbox, Peer

__all__ = ["Session", "Outbox", "Dialling", "Peer", "PEX_HEADER"]

log = logging.getLogger(__name__)

_PEEK_HEADER = zre.peek_header
_SIGNATURE = zre.SIGNATURE
_HELLO = 1
_whisper_header = zre.whisper_header
_SHOUT_PREFIX = zre.SHOUT_PREFIX
#: HELLO header of nodes that want peer exchange (they use seeds, not broadcast)
PEX_HEADER = "X-PM-PEX"
_PEX_CHUNK = 1024  # peers per PEX message
_PEX_ENTRY = re.compile(r"([0-9a-f]{32}) (tcp://\d{1,3}(?:\.\d{1,3}){3}:\d{1,5})")
_HELLO_CACHED = 1024  # octets: longer HELLO frames are decoded every time
#: commands held per claimant while its claim waits (and at most ``max_message`` octets)
HELD_MESSAGES = 1024
#: octets of the HELLOs refused by ``max_unproven`` that are kept for their sender's proof
HELD_HELLO_OCTETS = 1 << 20
#: what ``Session.counters`` counts (and ``Node.stats`` reports); see the module docstring
COUNTERS = ("peers_refused", "address_refused", "pending_refused", "pending_shed",
            "evasive_shed", "pending_timed_out", "unproven_refused", "unproven_shed",
            "hellos_refused", "groups_refused", "leaves_ignored", "reports_ignored",
            "events_dropped", "connections_shed", "descriptors_refused", "held_dropped",
            "sequence_resyncs", "sessions_restarted", "messages_refused")

#: seconds between ``_settle`` runs while a claim or departure waits, at most (the first
#: is at once, then 1/32 of this, doubling)
SETTLE_STEP = 0.064

#: why mailbox input is dropped without a word to its sender (``Session.dropped``)
DROP_REASONS = ("short", "bad_signature", "before_hello", "sequence_gap", "malformed")

ENTER, EXIT, JOIN, LEAVE = EventType.ENTER, EventType.EXIT, EventType.JOIN, EventType.LEAVE
LEADER = EventType.LEADER
WHISPER, SHOUT = EventType.WHISPER, EventType.SHOUT
#: what ``compiled_take`` makes, and of which headers (``Session.delivery_each``)
_TAKEN_SHAPE = (Event, zre.WHISPER_PREFIX, WHISPER, zre.SHOUT_PREFIX, SHOUT)


class _Claim:
    """A HELLO from a new UUID at a known peer's endpoint, waiting on that peer, and the
    commands its sender sent after it (held, up to ``HELD_MESSAGES`` / ``held_octets``)."""

    __slots__ = ("uuid", "identity", "hello", "since", "held", "octets", "overflow")

    def __init__(self, uuid: UUID, identity: bytes, hello: zre.Hello, since: float) -> None:
        self.uuid, self.identity, self.hello, self.since = uuid, identity, hello, since
        self.held: list[list[bytes]] = []
        self.octets = 0
        self.overflow = False  # some were dropped: the first after them is a gap

    def hold(self, frames: list[bytes], octets: int) -> bool:
        """Keep one command for later; False (dropped) past the bounds."""
        size = sum(map(len, frames))
        if self.overflow or len(self.held) >= HELD_MESSAGES or self.octets + size > octets:
            self.overflow = True
            return False
        self.held.append(frames)
        self.octets += size
        return True


@functools.lru_cache(maxsize=2048)
def _decode_hello(frame: bytes) -> zre.Message:
    """``zre.decode`` of a one-frame HELLO, remembered for the whole process.

    Where many nodes share a process (the simulator, meshes in one process)
    every one of them decodes each sender's same HELLO. Only frames up to
    ``_HELLO_CACHED`` octets are cached, so the cache stays under a few
    megabytes whatever peers send; decoded messages are immutable.
    """
    return zre.decode([frame])


def _same(peer: Peer, hello: zre.Hello) -> bool:
    """Whether ``hello`` says what ``peer``'s last HELLO said (endpoint, name, headers)."""
    return (hello.endpoint == peer.endpoint and hello.name == peer.name
            and dict(hello.headers) == peer.headers)


def _asked(peer: Peer) -> Optional[float]:
    """When the oldest timed PING to ``peer`` still unanswered went; None if none."""
    for _, when in peer.pings or ():
        if when is not None:
            return when
    return None


@functools.lru_cache(maxsize=4096)
def _host(endpoint: str) -> str:
    """The address of ``tcp://address:port`` (remembered: a node asks for each peer's,
    and where many nodes share a process they share the strings)."""
    return endpoint[6:].rpartition(":")[0]


class Session(Outputs):
    """One node's ZRE state: own identity and groups, the peer table, the timers.

    A core of ``peermesh.core`` (see the module docstring): ``receive``,
    ``handle_timer`` and ``next_deadline``, and its other inputs (discovery
    reports, group changes, ``ping``), leave ``Dial``, ``Emit`` and ``Deliver``
    outputs that ``receive``/``handle_timer`` return and ``take`` hands over;
    the driver answers each ``Dial`` with ``attach``. Commands to a peer go
    to its ``Outbox`` (``peer.link.offer``): that is the flow-controlled path.
    ``linked`` and ``source`` are the driver's two queries (the module docstring).
    """

    def __init__(self, uuid: UUID, name: str, headers: dict[str, str], config: NodeConfig,
                 linked: Optional[Callable[[bytes], Optional[bool]]] = None,
                 source: Optional[Callable[[bytes], Optional[str]]] = None) -> None:
        super().__init__()
        self.uuid = uuid
        self.uuid_bytes = uuid.bytes
        self._identity = b"\x01" + self.uuid_bytes  # our routing identity
        self.name = name
        self.headers = headers
        self.config = config
        #: ``config.max_peers``; None (not fitted by a driver to what its transport can
        #: hold, as ``Node`` does): no cap
        self.max_peers: int = UNBOUNDED_PEERS if config.max_peers is None else config.max_peers
        #: does a routing identity hold a connection to our mailbox now (None: cannot tell)
        self.linked = linked
        #: the address the message being handled, from a routing identity, came from
        #: (None: cannot tell); ``_from_its_host``
        self.source = source
        self.groups: set[str] = set()
        #: each of ``groups`` by its encoded ZRE string (a SHOUT header's tail)
        self._group_fields: dict[bytes, str] = {}
        #: ``delivery_each`` compiled (``zre_take`` of ``peermesh.io.zmqbatch.native``: a
        #: pure function the owner hands in); used with ``batch_sink``
        self.compiled_take: Optional[Callable[..., tuple[int, int, int]]] = None
        #: where ``delivery_each`` hands a batch's events at once, ``(events, octets of
        #: each one's content)``, instead of one by one to its ``sink`` (the owner's event
        #: queue's ``put_each`` while nothing else hears them); None: to ``sink``
        self.batch_sink: Optional[Callable[[list[Event], list[int]], None]] = None
        self.status = 0
        self.endpoint: Optional[str] = None  # our mailbox; set by ``start``
        self._own_host: Optional[str] = None  # its address (``_address``)
        self.running = False  # taking new peers (the driver clears it when it starts leaving)
        #: PINGs become CONFIRM events, answered by the application (``Node.hold_confirms``)
        self.hold_confirms = False
        self.peers: dict[UUID, Peer] = {}
        self.by_identity: dict[bytes, Peer] = {}
        self.by_endpoint: dict[str, Peer] = {}
        self.members: dict[str, dict[UUID, Peer]] = {}
        #: peers found by discovery, waiting for their HELLO, oldest first
        self.pending: dict[UUID, Peer] = {}
        #: peers that said HELLO before any discovery report of them and have neither been
        #: reported at their endpoint nor answered a PING since, oldest first (a HELLO
        #: names any endpoint: only a PING-OK or a report shows a node lives there)
        self.unproven: dict[UUID, Peer] = {}
        #: the HELLOs refused as ``unproven`` was full (when, the HELLO, its octets), oldest
        #: first: a report of the sender at the endpoint it names lets it in at once
        self._held_hellos: dict[UUID, tuple[float, zre.Hello, int]] = {}
        self._held_octets = 0
        #: peers per address (their endpoint's), but those at our own
        self.per_address: Counter[str] = Counter()
        #: what remote senders made the session refuse, drop or shed
        self.counters = Counters(log, f"node {name} hit its limits", COUNTERS)
        #: when our HELLO last went to a peer on a fresh link for its second HELLO (a
        #: restart or a start-over): the first same HELLO after it, within ``evasive``, is
        #: no restart (``_on_hello``)
        self._restarts: dict[UUID, float] = {}
        self._departed: dict[UUID, float] = {}  # when a peer said it was leaving, oldest first
        self._claims: dict[UUID, _Claim] = {}   # holder's UUID -> a new node claiming its endpoint
        self._claimants: dict[bytes, _Claim] = {}  # the same claims by the claimant's identity
        #: peers a port-0 beacon said are leaving -> (when, ``total`` after the probe PING)
        self._leaving: dict[UUID, tuple[float, int]] = {}
        self._evasive: list[Peer] = []  # ready peers EVASIVE at the last tick (shed first)
        #: ZRE commands received: WHISPER, SHOUT, any other (after HELLO, in sequence)
        self.received_whispers = self.received_shouts = self.received_control = 0
        #: control commands sent (HELLO aside); messages sent to peers no longer in the table
        self.sent_control = self.sent_departed = 0
        #: input dropped as malformed or out of place, by reason (never logged each time)
        self.dropped: Counter[str] = Counter(dict.fromkeys(DROP_REASONS, 0))
        self._hello: Optional[list[bytes]] = None
        #: Zyre's leader election: the groups this node contests, its waves, the winners
        self.contested: set[str] = set()
        self.election: Election[UUID] = Election(zyre_id(uuid))
        self.leaders: dict[str, UUID] = {}
        self._now = 0.0  # the latest time a command or tick brought (waves start then)
        self._caps_said: set[str] = set()  # the bounds the node said once it is at
        self._tick_at = 0.0  # when ``_tick`` is due (``handle_timer``)
        #: when ``_settle`` is due while claims or departures wait, and the step to the next
        self._settle_at: Optional[float] = None
        self._settle_step = SETTLE_STEP

    # --- the core contract (``peermesh.core``) ---------------------------

    def handle_timer(self, now: float) -> list[Output]:
        """The timers due at ``now``: the liveness timers (``_tick``) when their time came,
        else the settling of claims and departures (``_settle``)."""
        if now >= self._tick_at:
            self._tick_at = self._tick(now)  # (it settles too)
            waiting = bool(self._claims or self._leaving)
        elif self._settle_at is not None and now >= self._settle_at:
            waiting = self._settle(now)
        else:
            waiting = self._settle_at is not None
        if not waiting:
            self._settle_at = None
        elif self._settle_at is None or now >= self._settle_at:
            self._settle_step = min(self._settle_step * 2, SETTLE_STEP)
            self._settle_at = now + self._settle_step
        return self.take()

    def next_deadline(self) -> float:
        """When ``handle_timer`` is next due: the next liveness tick (at most
        ``min(interval, evasive / 2)`` after the last), sooner while claims or departures
        wait on a peer's link (at once, then every few milliseconds backing off to
        ``SETTLE_STEP``)."""
        settle = self._settle_at
        return self._tick_at if settle is None or settle > self._tick_at else settle

    def attach(self, uuid: UUID, link: Optional[Outbox]) -> bool:
        """The driver's answer to ``Dial(uuid, ...)``: the peer's ``Outbox`` (what was offered
        meanwhile goes to it, in order), or None if none could be made (the peer is
        forgotten without an event: the driver drops the events of it that came after the
        ``Dial``). False if the link is not wanted (the peer left meanwhile): close it."""
        peer = self.peers.get(uuid)
        waiting = peer.link if peer is not None else None
        if type(waiting) is not Dialling:
            return False
        assert peer is not None and isinstance(waiting, Dialling)
        if link is None:
            peer.ready = False  # (no EXIT: its ENTER is not told either)
            self.remove(peer, "no link")
            return False
        peer.link = link
        for frames in waiting.frames:
            link.offer(frames)
        return True

    def _emit(self, event: Event) -> None:
        self._outputs.append(Emit(event))

    def _deliver(self, event: Event) -> None:
        self._outputs.append(Deliver(event))

    def _dial(self, uuid: UUID, endpoint: str) -> Dialling:
        """Ask the driver for a link to ``uuid``'s mailbox at ``endpoint`` (``Dial``); what
        is offered until it answers waits in the ``Dialling`` returned."""
        self._outputs.append(Dial(uuid, endpoint, self._identity))
        return Dialling(self.config.send_buffer)

    def _wake(self) -> None:
        """A claim or departure waits on a peer's link: settle it soon and again."""
        if self._settle_at is None:
            self._settle_step = SETTLE_STEP / 64
            self._settle_at = self._now

    # --- own state --------------------------------------------------------

    def start(self, endpoint: str) -> None:
        """Our mailbox is at ``endpoint``; take peers from now on."""
        self.endpoint = endpoint
        self._own_host = _host(endpoint)
        self.running = True

    def stop(self) -> list[Peer]:
        """Take no more peers; forget them all (no events). Returns those forgotten."""
        self.running = False
        peers = list(self.peers.values())
        self.peers.clear()
        self.by_identity.clear()
        self.by_endpoint.clear()
        self.members.clear()
        self.pending.clear()
        self.unproven.clear()
        self._held_hellos.clear()
        self._held_octets = 0
        self.per_address.clear()
        self._claims.clear()
        self._claimants.clear()
        self._leaving.clear()
        self.election.waves.clear()
        self.leaders.clear()
        self._settle_at = None
        self._outputs = []
        return peers

    def add_group(self, group: str) -> bool:
        """Join ``group``; tell every peer (JOIN). False if already in it."""
        if group in self.groups:
            return False
        self.groups.add(group)
        self._group_fields[zre.encode_string(group)] = group
        self.status = (self.status + 1) & 0xFF
        self._hello = None
        for peer in list(self.peers.values()):
            self.send_control(peer, zre.Join(peer.next_sequence(), group, self.status))
        if group in self.contested and self.members.get(group):
            self.elect(group)
        return True

    def remove_group(self, group: str) -> bool:
        """Leave ``group``; tell every peer (LEAVE). False if not in it."""
        if group not in self.groups:
            return False
        self.groups.discard(group)
        self._group_fields.pop(zre.encode_string(group), None)
        self.status = (self.status + 1) & 0xFF
        self._hello = None
        for peer in list(self.peers.values()):
            self.send_control(peer, zre.Leave(peer.next_sequence(), group, self.status))
        self.election.forget(group)
        self.leaders.pop(group, None)
        return True

    # --- leader election (Zyre's; see ``election``) ---------------------------

    def contest(self, group: str) -> None:
        """Stand for leader of ``group`` (now, if in it with peers; then whenever a peer
        joins it or its leader goes)."""
        self.contested.add(group)
        if group in self.groups and self.members.get(group) and not self.election.running(group):
            self.elect(group)

    def elect(self, group: str) -> None:
        """Start a wave of our own in ``group`` (Zyre: on a peer's HELLO or JOIN)."""
        self.leaders.pop(group, None)
        self._act(group, self.election.start(group, self.members.get(group, {}), self._now))

    def _act(self, group: str, actions: list) -> None:
        """Carry out what the election asks: ELECT and LEADER messages, LEADER events."""
        members = self.members.get(group, {})
        for action in actions:
            if isinstance(action, Elected):
                self._elected(group, action.leader)
                continue
            make = zre.Elect if isinstance(action, SendElect) else zre.Leader
            text = action.challenger if isinstance(action, SendElect) else action.leader
            for uuid in action.to:
                peer = members.get(uuid)
                if peer is not None:
                    self.send_control(peer, make(peer.next_sequence(), group, text))

    def _elected(self, group: str, leader: str) -> None:
        uuid = parse_id(leader)
        if uuid == self.uuid:
            name = self.name
        else:
            peer = self.peers.get(uuid) if uuid is not None else None
            if peer is None or not peer.ready:
                log.debug("group %s elected %s, not a peer", group, leader)
                return
            name = peer.name
        assert uuid is not None
        self.leaders[group] = uuid
        self._emit(Event(LEADER, uuid, name, group))

    def _on_wave(self, peer: Peer, message: "zre.Elect | zre.Leader", now: float) -> None:
        """ELECT or LEADER from a member of one of our groups (others are ignored)."""
        group = message.group
        members = self.members.get(group)
        if group not in self.groups or members is None or peer.uuid not in members:
            log.debug("ignored %s for %r from %s: not a member of it here",
                      type(message).__name__.upper(), group[:40], peer.name)
            return
        if isinstance(message, zre.Elect):
            if parse_id(message.challenger) is None:
                log.debug("ignored ELECT with ID %r from %s", message.challenger[:40], peer.name)
                return
            if (group in self.contested and not self.election.running(group)
                    and message.challenger > self.election.me):
                self.elect(group)  # a worse challenger while we stand: challenge it
            actions = self.election.on_elect(group, peer.uuid, message.challenger, members,
                                             now, origin=peer.uuid == parse_id(message.challenger))
        else:
            if parse_id(message.leader) is None:
                log.debug("ignored LEADER with ID %r from %s", message.leader[:40], peer.name)
                return
            actions = self.election.on_leader(group, peer.uuid, message.leader, members)
        self._act(group, actions)

    def _member_gone(self, peer: Peer, group: str) -> None:
        """``peer`` is no longer in our ``group``: Zyre re-elects if it led, or if a wave
        was under way (a contesting node starts it; the rest forget a gone leader)."""
        if group not in self.groups:
            return
        led = self.leaders.get(group) == peer.uuid
        if led:
            del self.leaders[group]
        if group in self.contested and (led or self.election.running(group)):
            self.elect(group)
        else:  # a wave under way may have waited only on it
            self._act(group, self.election.member_gone(group, peer.uuid,
                                                       self.members.get(group, {})))

    # --- sending control commands ------------------------------------------

    def send_control(self, peer: Peer, message: zre.Message) -> None:
        """Queue one command; a peer whose backlog is twice over its bound is removed."""
        link = peer.link
        if link.queued() > 2 * link.limit:
            self.remove(peer, "not responding: send queue full")
            return
        self.sent_control += 1
        link.offer(zre.encode(message))

    def ping(self, peer: Peer, now: Optional[float] = None) -> None:
        """PING ``peer``; its PING-OK confirms everything sent before (``peer.confirmed``)
        and, given ``now``, times the round trip (``peer.rtt``)."""
        self.send_control(peer, zre.Ping(peer.next_sequence()))
        if peer.pings is None:
            peer.pings = deque()
        peer.pings.append((peer.total, now))

    # --- discovery reports -------------------------------------------------

    def peer_appeared(self, uuid: UUID, endpoint: str, now: float) -> None:
        """A discovery source saw ``uuid`` accepting connections at ``endpoint``."""
        if not self.running or uuid == self.uuid:
            return
        peer = self.peers.get(uuid)
        if peer is not None:
            if peer.endpoint == endpoint:
                peer.refresh(now)
                if self.unproven:
                    self.unproven.pop(uuid, None)
            else:  # a stale or forged report: the peer's own HELLO said where it is
                self.counters.add("reports_ignored")
        elif not self._departed or now - self._departed.get(uuid, -1e18) >= self.config.expired:
            held = self._unhold(uuid) if self._held_hellos else None
            if held is not None:
                if held[1].endpoint == endpoint:  # its HELLO, proven now: it enters
                    peer = self._require_peer(uuid, endpoint, now, hello=True)
                    if peer is not None:
                        self._accept_hello(peer, held[1], now, announce=True)
                    return
            self._add_peer(uuid, endpoint, now, hello=False)
        # else: it said it was leaving; a stale report (PEX, mDNS cache) must not revive it

    def peer_alive(self, uuid: UUID, now: float) -> None:
        """A discovery source heard from ``uuid``."""
        peer = self.peers.get(uuid)
        if peer is not None:
            peer.refresh(now)

    def peer_left(self, uuid: UUID, now: float, address: Optional[str] = None) -> None:
        """A discovery source says ``uuid`` is leaving; ``address``: where that came from.

        Heeded only from the peer's own address (when the source knows one), and
        only as the peer's own link confirms it: anyone can send a port-0 beacon
        with a UUID that beacons broadcast. A peer whose connection to our
        mailbox is closed (a node that leaves sends its beacon and closes) is
        removed at once; one whose connection is open is PINGed and removed
        when the connection closes within ``interval``, or when no answer came
        by then; a peer that answered and whose connection is still open then
        was the subject of a forged beacon (``leaves_ignored``).
        """
        peer = self.peers.get(uuid)
        if peer is None:
            return
        if address is not None and address != _host(peer.endpoint):
            log.debug("ignored leave of %s from %s: it lives at %s", peer.name, address,
                      peer.endpoint)
            self.counters.add("leaves_ignored")
            return
        if peer.ready and self._link_open(peer):
            if uuid not in self._leaving:
                self.ping(peer, now)
                self._leaving[uuid] = (now, peer.total)
                self._wake()
            return
        self._depart(peer, now)

    def _depart(self, peer: Peer, now: float) -> None:
        """Remove a peer that left; reports of it are ignored for ``expired``."""
        departed = self._departed
        departed.pop(peer.uuid, None)
        departed[peer.uuid] = now
        if len(departed) > self.max_peers:
            del departed[next(iter(departed))]
        self.remove(peer, "left")

    def _link_open(self, peer: Peer) -> bool:
        """True when the peer's connection to our mailbox is known to be open (a driver
        that cannot tell, as the simulator, has ``linked`` None or answering None: port-0
        beacons count at once there, from the peer's address)."""
        return self.linked is not None and self.linked(peer.identity) is True

    def _link_closed(self, peer: Peer) -> bool:
        """True when a ready peer's connection to our mailbox is known to be closed."""
        return peer.ready and self.linked is not None and self.linked(peer.identity) is False

    def _settle(self, now: float) -> bool:
        """Decide the claims and departures that wait on a peer's link or its answer;
        True while some still wait (``handle_timer`` comes again soon: links close at any
        time)."""
        if self._claims:
            self._settle_claims(now)
        leaving = self._leaving
        for uuid, (since, probe) in list(leaving.items()):
            peer = self.peers.get(uuid)
            if peer is None:
                del leaving[uuid]
            elif self._link_closed(peer):
                del leaving[uuid]
                self._depart(peer, now)
            elif now - since >= self.config.interval:
                del leaving[uuid]
                if peer.confirmed >= probe:  # it answered, its link is open: forged
                    self.counters.add("leaves_ignored")
                    log.debug("%s answered after a port-0 beacon: ignored it", peer.name)
                else:
                    self._depart(peer, now)
        return bool(self._claims or leaving)

    # --- the peer table ----------------------------------------------------

    def _require_peer(self, uuid: UUID, endpoint: str, now: float,
                      hello: bool) -> Optional[Peer]:
        """The peer ``uuid``, made (link opened, HELLO sent) if new and within the bounds.

        ``hello``: it said HELLO (a live connection), so it may shed the oldest
        peer still waiting for one; a peer found by discovery may not.
        """
        peer = self.peers.get(uuid)
        return peer if peer is not None else self._add_peer(uuid, endpoint, now, hello)

    def _add_peer(self, uuid: UUID, endpoint: str, now: float, hello: bool) -> Optional[Peer]:
        """``_require_peer`` for a ``uuid`` not in the table."""
        if not endpoint.startswith("tcp://") or endpoint == self.endpoint:
            log.debug("ignored peer %s with endpoint %r", uuid, endpoint)
            return None
        cfg = self.config
        if not hello and len(self.pending) >= cfg.max_pending:
            oldest = next(iter(self.pending.values()))
            if now - oldest.since < cfg.interval:
                self.counters.add("pending_refused")
                self._at_cap("max_pending", "peers found by discovery wait for their HELLO; "
                             "others are ignored until their next beacon")
                return None
            self.counters.add("pending_shed")  # it had its chance: a live node answers at once
            self.remove(oldest, "shed for a newer peer")
        address = self._address(endpoint)
        per_address = self.per_address
        if (address and per_address.get(address, 0) >= cfg.max_peers_per_address
                and not (hello and self._shed_pending_at(address))):
            self.counters.add("address_refused")
            return None
        if len(self.peers) >= self.max_peers and not (hello and self._shed_for_newcomer()):
            self.counters.add("peers_refused")
            self._at_cap("max_peers", "peers in its table; new peers are refused")
            return None
        holder = self.by_endpoint.get(endpoint)
        if holder is not None:
            if now - holder.last_seen < self.config.evasive and not self._link_closed(holder):
                log.debug("ignored peer %s: %s already lives at %s", uuid, holder.name, endpoint)
                return None
            self.remove(holder, "replaced by another node at its endpoint")
        link = self._dial(uuid, endpoint)
        peer = Peer(uuid, endpoint, link, now)
        self.peers[uuid] = peer
        if address:  # (not ``+= 1``: a Counter's __missing__ is a Python call)
            per_address[address] = per_address.get(address, 0) + 1
        self.pending[uuid] = peer
        self.by_identity[peer.identity] = peer
        self.by_endpoint[endpoint] = peer
        peer.next_sequence()  # HELLO is always number 1
        link.offer(self._hello_frames())
        return peer

    def _hello_frames(self) -> list[bytes]:
        """Our HELLO, encoded once until our groups change."""
        if self._hello is None:
            assert self.endpoint is not None
            self._hello = zre.encode(zre.Hello(1, self.endpoint, tuple(self.groups),
                                               self.status, self.name, self.headers))
        return self._hello

    def _at_cap(self, setting: str, what: str) -> None:
        """Say once that the node is at ``setting``, and how to raise it."""
        if setting not in self._caps_said:
            self._caps_said.add(setting)
            log.warning("node %s holds %s=%d %s: for a larger mesh raise %s "
                        "(PEERMESH_%s, or %s in the [node] table)", self.name, setting,
                        self.max_peers if setting == "max_peers" else getattr(self.config, setting),
                        what, setting, setting.upper(), setting)

    def _address(self, endpoint: str) -> str:
        """The address ``max_peers_per_address`` counts a peer at ``endpoint`` under; ""
        for our own (nodes of this host)."""
        address = _host(endpoint)
        return "" if self._own_host is None or address == self._own_host else address

    def _shed_pending_at(self, address: str) -> bool:
        """Shed the oldest peer at ``address`` still waiting for its HELLO, if any."""
        for peer in self.pending.values():
            if _host(peer.endpoint) == address:
                self.counters.add("pending_shed")
                self.remove(peer, "shed for a peer that said HELLO")
                return True
        return False

    def _shed_for_newcomer(self) -> bool:
        """Make room for a node that said HELLO: shed the oldest peer still waiting for
        its HELLO, else one that was EVASIVE at the last tick and still is."""
        if self.pending:
            self.counters.add("pending_shed")
            self.remove(next(iter(self.pending.values())), "shed for a peer that said HELLO")
            return True
        evasive = self._evasive
        while evasive:
            peer = evasive.pop()
            if self.peers.get(peer.uuid) is peer and peer.evasive:
                self.counters.add("evasive_shed")
                self.remove(peer, f"evasive, shed for a new peer (max_peers="
                                  f"{self.max_peers})")
                return True
        return False

    def remove(self, peer: Peer, reason: str) -> None:
        """Forget ``peer`` and close its link; EXIT if it had said HELLO."""
        if self.peers.get(peer.uuid) is not peer:
            return
        del self.peers[peer.uuid]
        del self.by_identity[peer.identity]
        self.sent_departed += peer.total
        address = self._address(peer.endpoint)
        if address:
            take_one(self.per_address, address)
        self.pending.pop(peer.uuid, None)
        self.unproven.pop(peer.uuid, None)
        if self.by_endpoint.get(peer.endpoint) is peer:
            del self.by_endpoint[peer.endpoint]
        for group in peer.groups:
            members = self.members.get(group)
            if members is not None:
                members.pop(peer.uuid, None)
                if not members:  # groups of departed peers must not pile up
                    del self.members[group]
        peer.link.close()
        if peer.pong is not None:
            peer.pong.set()  # wake flush(): the peer is gone
        if peer.ready:
            peer.ready = False  # for whoever still holds it (the node's last whisper target)
            log.info("peer %s (%s) at %s left: %s", peer.name, peer.uuid.hex, peer.endpoint,
                     reason, extra={"peer": peer.uuid.hex, "peer_name": peer.name})
            self._emit(Event(EXIT, peer.uuid, peer.name, address=peer.endpoint, reason=reason))
            for group in peer.groups:
                self._member_gone(peer, group)

    def _peer_join(self, peer: Peer, group: str) -> None:
        groups = peer.groups
        if group in groups:
            return
        if len(groups) >= self.config.max_groups:
            self.counters.add("groups_refused")
            self.remove(peer, f"joined more than max_groups ({self.config.max_groups}) groups")
            return
        if type(groups) is not set:  # an idle peer holds the shared empty frozenset
            groups = peer.groups = set(groups)
        groups.add(group)  # type: ignore[attr-defined]
        self.members.setdefault(group, {})[peer.uuid] = peer
        self._emit(Event(JOIN, peer.uuid, peer.name, group))
        if group in self.contested and group in self.groups:
            self.elect(group)  # Zyre: a new member starts an election

    def _peer_leave(self, peer: Peer, group: str) -> None:
        if group not in peer.groups:
            return  # (so ``groups`` is a set: it joined)
        peer.groups.discard(group)  # type: ignore[attr-defined]
        members = self.members.get(group)
        if members is not None:
            members.pop(peer.uuid, None)
            if not members:
                del self.members[group]
        self._emit(Event(LEAVE, peer.uuid, peer.name, group))
        self._member_gone(peer, group)

    # --- the mailbox -------------------------------------------------------

    def awaits(self, identity: bytes) -> bool:
        """Whether a HELLO from ``identity`` waits here to be decided on (a claim on a live
        peer's endpoint, or held for the proof of its endpoint): not a peer yet, but may
        become one with that HELLO."""
        if identity in self._claimants:
            return True
        return bool(self._held_hellos) and len(identity) == 17 and \
            zre.uuid_of(identity[1:]) in self._held_hellos

    def on_oversized(self, identity: bytes) -> None:
        """A message over ``max_message`` from ``identity`` was dropped."""
        self.counters.add("messages_refused")
        log.debug("dropped message over max_message=%d from %r", self.config.max_message,
                  identity)
        peer = self.by_identity.get(identity)
        if peer is not None:
            self.remove(peer, f"sent a message over max_message ({self.config.max_message})")

    def receive(self, link: Hashable, frames: list[bytes], now: float) -> list[Output]:
        """One message from the mailbox, sent by the DEALER with routing identity ``link``;
        the outputs it leaves (after those left before by calls outside ``receive``)."""
        event = self.delivery(link, frames, now)  # (None while outputs wait)
        if event is not None:
            return [Deliver(event)]
        self._take_in(link, frames, now)  # type: ignore[arg-type]
        return self.take()

    def _take_in(self, identity: bytes, frames: list[bytes], now: float) -> None:
        """One mailbox message, decoded, its outputs left for ``take``."""
        self._on_command(identity, frames, frames[0] if frames else b"",
                         self.by_identity.get(identity), now)

    def delivery(self, link: Hashable, frames: list[bytes], now: float) -> Optional[Event]:
        """``receive``'s fast path, for a driver that hands events on itself: the event of
        the next WHISPER, or SHOUT into one of our groups, from a ready peer (most of the
        traffic), taken in, when no output waits to be taken (``receive`` would return
        just ``[Deliver(event)]``); else None, nothing changed: ``receive`` the message."""
        taken: list[Event] = []
        return taken[0] if self._delivery_loop(((link, frames),), 0, now, taken.append) \
            else None

    def delivery_each(self, batch: Sequence[tuple[Hashable, Optional[list[bytes]]]],
                      start: int, now: float, sink: Callable[[Event], None]) -> int:
        """``delivery`` of the messages of a mailbox batch (``(link, frames)`` each; frames
        None for a message over the limits) from index ``start`` on, each event handed to
        ``sink`` at once, for as long as they are on the fast path: the index of the first
        that is not (``len(batch)``: none), left as it was for ``receive``. One call per
        batch, not per message; ``sink`` must not raise (the messages before it are
        taken).

        With ``compiled_take`` and ``batch_sink`` (the same destination as ``sink``, for
        a batch at once) the run is taken in by one C call and its events go to
        ``batch_sink(events, octets)`` in one call, ``sink`` unused: no Python per
        message (the same checks, the same events)."""
        put_each, take = self.batch_sink, self.compiled_take
        if put_each is None or take is None:
            return self._delivery_loop(batch, start, now, sink)
        if self._outputs:
            return start
        events: list[Event] = []
        octets: list[int] = []
        try:
            end, whispers, shouts = take(batch, start, self.by_identity, self._group_fields,
                                         now, events, octets, _TAKEN_SHAPE)
        finally:   # (what was taken in is handed on, even if the call failed after it)
            if events:
                put_each(events, octets)
        if whispers:
            self.received_whispers += whispers
        if shouts:
            self.received_shouts += shouts
        return end   # type: ignore[no-any-return]

    def _delivery_loop(self, batch: Sequence[tuple[Hashable, Optional[list[bytes]]]],
                       start: int, now: float, sink: Callable[[Event], None]) -> int:
        """``delivery_each`` in Python, each event to ``sink``."""
        by_identity, group_fields = self.by_identity, self._group_fields
        at, end = start, len(batch)
        whispers = shouts = 0
        try:
            while at < end and not self._outputs:
                link, frames = batch[at]
                peer = by_identity.get(link)  # type: ignore[call-overload]
                if peer is None or not peer.ready or not frames:
                    break
                head = frames[0]
                want = peer.want
                if head == _whisper_header(want):  # (one compare: no slicing, no shifting)
                    group = None
                    whispers += 1
                elif (head[:4] == _SHOUT_PREFIX and len(head) > 6
                      and head[4] << 8 | head[5] == want
                      and (group := group_fields.get(head[6:])) is not None):
                    shouts += 1  # (a SHOUT into another group is decoded)
                else:
                    break
                peer.want = (want + 1) & 0xFFFF
                peer.last_seen = now
                if peer.next_ping:
                    peer.refresh(now)
                at += 1
                sink(Event(WHISPER if group is None else SHOUT, peer.uuid, peer.name, group,
                           (frames[1],) if len(frames) == 2 else tuple(frames[1:])))
        finally:
            if whispers:
                self.received_whispers += whispers
            if shouts:
                self.received_shouts += shouts
        return at

    def _on_command(self, identity: bytes, frames: list[bytes], head: bytes,
                    peer: Optional[Peer], now: float) -> None:
        self._now = now  # (a wave this command starts is timed from it)
        if len(head) < 6:
            self.dropped["short"] += 1
            log.debug("dropped short message from %r", identity)
            return
        signature, command, version, sequence = _PEEK_HEADER(head)
        if signature != _SIGNATURE or version != zre.VERSION:
            self.dropped["bad_signature"] += 1
            log.debug("dropped message with bad signature/version from %r", identity)
            return
        if command == _HELLO:
            self._on_hello(identity, frames, peer, now)
            return
        if peer is None or not peer.ready:
            claim = self._claimants.get(identity)
            if claim is not None:  # its HELLO waits on a claim: keep what follows it
                if not claim.hold(frames, self.config.max_message):
                    self.counters.add("held_dropped")
                return
            self.dropped["before_hello"] += 1
            log.debug("ignored command %d before HELLO from %r", command, identity)
            return
        if sequence != peer.want:
            self.dropped["sequence_gap"] += 1
            log.debug("sequence gap from %s: expected %d, got %d", peer.name, peer.want, sequence)
            self._resync(peer, f"sequence gap (expected {peer.want}, got {sequence})", now)
            return
        peer.want = (sequence + 1) & 0xFFFF
        peer.last_seen = now
        if peer.evasive or peer.next_ping:
            peer.refresh(now)
        try:
            message = zre.decode(frames)
        except ProtocolError as exc:
            self.dropped["malformed"] += 1
            log.debug("dropped malformed command from %s: %s", peer.name, exc.reason)
            return
        if isinstance(message, zre.Whisper):
            self._deliver(Event(WHISPER, peer.uuid, peer.name, None, message.content))
        elif isinstance(message, zre.Shout):
            self.received_shouts += 1
            if message.group in self.groups:
                self._deliver(Event(SHOUT, peer.uuid, peer.name, message.group,
                                   message.content))
        elif isinstance(message, zre.Join):
            self._peer_status(peer, message.status)
            self._peer_join(peer, message.group)
        elif isinstance(message, zre.Leave):
            self._peer_status(peer, message.status)
            self._peer_leave(peer, message.group)
        elif isinstance(message, zre.Ping):
            if self.hold_confirms:
                self._emit(Event(EventType.CONFIRM, peer.uuid, peer.name))
            else:
                self.send_control(peer, zre.PingOk(peer.next_sequence()))
        elif isinstance(message, zre.PeerExchange):
            self._on_peer_exchange(peer, message, now)
        elif isinstance(message, zre.PingOk):
            if self.unproven:
                self.unproven.pop(peer.uuid, None)
            if peer.pings:
                peer.confirmed, sent = peer.pings.popleft()
                if sent is not None:
                    if peer.rtt is None:
                        peer.rtt = RoundTrip()
                    peer.rtt.add(now - sent)
            if peer.pong is not None:
                peer.pong.set()
        elif isinstance(message, (zre.Elect, zre.Leader)):
            self._on_wave(peer, message, now)
        # Unknown commands (and Zyre's GOODBYE: its beacon or link says it) only advance
        # the sequence
        if isinstance(message, zre.Whisper):
            self.received_whispers += 1
        elif not isinstance(message, zre.Shout):
            self.received_control += 1

    def _resync(self, peer: Peer, reason: str, now: float) -> None:
        """Out of step with a peer: EXIT it and say HELLO again at once, so that it
        starts over too (a second HELLO is a restart to it, Zyre's as ours) and says
        HELLO back, instead of sending into a session that ignores it."""
        self.counters.add("sequence_resyncs")
        self.remove(peer, reason)
        if self.running:
            self._require_peer(peer.uuid, peer.endpoint, now, hello=True)

    def _peer_status(self, peer: Peer, status: int) -> None:
        expected = (peer.status + 1) & 0xFF
        if status != expected:
            log.debug("group status of %s is %d, expected %d", peer.name, status, expected)
        peer.status = status

    def _on_hello(self, identity: bytes, frames: list[bytes], peer: Optional[Peer],
                  now: float) -> None:
        size = sum(map(len, frames))
        if size > self.config.max_hello:
            self._refuse_hello(peer, f"{size} octets, over max_hello ({self.config.max_hello})")
            return
        try:
            if len(frames) == 1 and len(frames[0]) <= _HELLO_CACHED:
                hello = _decode_hello(frames[0])
            else:
                hello = zre.decode(frames)
        except ProtocolError as exc:
            log.debug("dropped malformed HELLO from %r: %s", identity, exc.reason)
            return
        assert isinstance(hello, zre.Hello)
        if len(identity) != 17 or identity[0] != 1 or identity == self._identity:
            log.debug("dropped HELLO with identity %r", identity)
            return
        if len(hello.groups) > self.config.max_groups:
            self._refuse_hello(peer, f"{len(hello.groups)} groups, over max_groups "
                               f"({self.config.max_groups})")
            return
        if hello.sequence != 1:
            log.debug("dropped HELLO with sequence %d", hello.sequence)
            return
        if not self.running:
            return  # leaving: take no new peers
        if peer is not None and peer.ready:
            said = self._restarts.pop(peer.uuid, None)
            if said is not None and now - said < self.config.evasive and _same(peer, hello):
                # The first HELLO, the same again, since ours went on a fresh link (a
                # restart or a start-over) answers ours, or crossed it: ours is on its
                # way, so it is taken in without answering again (or two nodes would
                # start over each other for ever) and is no restart, however late
                # it comes (within ``evasive``).
                self._accept_hello(peer, hello, now, announce=False)
                return
            self._restarts[peer.uuid] = now
            if self._reconnected(peer, hello, now):
                return
            self.remove(peer, "restarted (new HELLO)")
            peer = None
        elif peer is not None and hello.endpoint != peer.endpoint:
            # Found at another address (a stale or forged report): the peer's own
            # word wins, or it would never hear from us.
            self.remove(peer, "connected to the wrong endpoint")
            peer = None
        if peer is None:
            uuid = zre.uuid_of(identity[1:])
            holder = self.by_endpoint.get(hello.endpoint)
            if holder is not None and self._link_closed(holder):
                # gone (only one process listens at an endpoint): the new node is in
                self.remove(holder, "replaced by another node at its endpoint")
            elif holder is not None and now - holder.last_seen < self.config.evasive:
                self._claim(holder, uuid, identity, hello, now)
                return
            proven = self._from_its_host(identity, hello.endpoint)
            if not proven and not self._room_for_unproven(now):
                self._hold_hello(uuid, hello, size, now)
                return
            peer = self._require_peer(uuid, hello.endpoint, now, hello=True)
            if peer is None:
                return
            if self._held_hellos:
                self._unhold(uuid)
            if not proven:
                self.unproven[uuid] = peer
            self._accept_hello(peer, hello, now, announce=True)
            return
        self._accept_hello(peer, hello, now, announce=True)

    def _from_its_host(self, identity: bytes, endpoint: str) -> bool:
        """Whether the HELLO being handled came from the address its ``endpoint`` names,
        another host's (``source``): what a real node sends, and proof enough. A host can
        name endpoints on its own addresses only, and ``max_peers_per_address`` bounds the
        peers one address makes, as it bounds those its beacons would report. At this
        node's own address and on loopback (any process of this host can connect from
        any 127.x.y.z) it proves nothing: the PING or report proof stays. An address at
        its cap is not asked about (a real mailbox scans its connections to answer)."""
        source = self.source
        if source is None:
            return False
        address = self._address(endpoint)
        if (not address or address.startswith("127.")
                or self.per_address.get(address, 0) >= self.config.max_peers_per_address):
            return False
        return source(identity) == address

    def _room_for_unproven(self, now: float) -> bool:
        """Whether a node that says HELLO before any report of it may enter: at most
        ``max_unproven`` such peers wait for their proof (a PING-OK, or a report at their
        endpoint). When they are full, the oldest is shed if a PING went to it
        ``hello_timeout`` ago or more (``unproven_shed``: a live node answers at once, and
        each shed costs a link closed and one opened: they turn over at most so often);
        else
        those not PINGed yet are, and the newcomer waits (``_hold_hello``)."""
        unproven = self.unproven
        if len(unproven) < self.config.max_unproven:
            return True
        oldest = next(iter(unproven.values()))
        asked = _asked(oldest)
        if asked is None or now - asked < self.config.hello_timeout:
            if asked is None:  # (once per oldest: the next ones are asked with it)
                for peer in unproven.values():
                    if _asked(peer) is None:
                        self.ping(peer, now)
            return False
        self.counters.add("unproven_shed")
        self.remove(oldest, "shed for a newer peer: no PING-OK or beacon within hello_timeout")
        return True

    def _hold_hello(self, uuid: UUID, hello: zre.Hello, size: int, now: float) -> None:
        """Keep a HELLO that found ``unproven`` full (no link, no peer: a report of its
        sender at the endpoint it names lets it in) for ``hello_timeout``, at most
        ``max_pending`` of them and ``HELD_HELLO_OCTETS``; one dropped unproven is refused
        (``unproven_refused``: its sender gets in when it says HELLO again, as a live node
        does after ``hello_timeout``)."""
        held = self._held_hellos
        self._unhold(uuid)
        held[uuid] = (now, hello, size)
        self._held_octets += size
        self._drop_held_hellos(now - self.config.hello_timeout)

    def _unhold(self, uuid: UUID) -> Optional[tuple[float, zre.Hello, int]]:
        """Take ``uuid``'s held HELLO out, if any."""
        held = self._held_hellos.pop(uuid, None)
        if held is not None:
            self._held_octets -= held[2]
        return held

    def _drop_held_hellos(self, before: float) -> None:
        """Drop the held HELLOs past their bounds or held since before ``before``."""
        held = self._held_hellos
        while held:
            uuid, (when, _, size) = next(iter(held.items()))
            if (when >= before and len(held) <= self.config.max_pending
                    and self._held_octets <= HELD_HELLO_OCTETS):
                break
            del held[uuid]
            self._held_octets -= size
            self.counters.add("unproven_refused")
            self._at_cap("max_unproven", "peers that said HELLO wait for a PING-OK or a "
                         "beacon; HELLOs past them wait for a beacon, else are refused")

    def _reconnected(self, peer: Peer, hello: zre.Hello, now: float) -> bool:
        """A ready peer's second HELLO, from its endpoint with its name and headers, while
        nothing we sent it waits to be confirmed: the same node started its session with
        us over (it gave up on us: our HELLO never reached it, as when its allowlist
        refused our key then, or it lost count). Take its HELLO and start ours over on a
        fresh link, without EXIT and ENTER. False: a restart to report."""
        if not _same(peer, hello) or peer.unconfirmed or peer.pong is not None:
            return False
        peer.link.close()
        link = self._dial(peer.uuid, peer.endpoint)
        log.debug("peer %s (%s) said HELLO again: saying ours again", peer.name, peer.uuid.hex)
        self.counters.add("sessions_restarted")
        peer.link = link
        peer.sent = 0
        peer.pings = None  # (PINGs on the old link are never answered)
        peer.next_sequence()  # HELLO is always number 1
        link.offer(self._hello_frames())
        self._accept_hello(peer, hello, now, announce=False)
        return True

    def _refuse_hello(self, peer: Optional[Peer], why: str) -> None:
        """A HELLO over a limit: dropped undecoded or unused, and its sender with it."""
        self.counters.add("hellos_refused")
        log.debug("refused HELLO: %s", why)
        if peer is not None:
            self.remove(peer, f"HELLO refused: {why}")

    def _claim(self, holder: Peer, uuid: UUID, identity: bytes, hello: zre.Hello,
               now: float) -> None:
        """A new node says HELLO from ``holder``'s endpoint, whose link is open: ask the
        holder if it lives; hold what the new node sends meanwhile."""
        old = self._claims.get(holder.uuid)
        if old is None:
            log.debug("%s claims %s of %s: PINGing it", uuid, holder.endpoint, holder.name)
            self.ping(holder, now)
        else:
            self._claimants.pop(old.identity, None)
        claim = self._claims[holder.uuid] = self._claimants[identity] = \
            _Claim(uuid, identity, hello, now)
        if old is not None:
            claim.since = old.since  # a second HELLO does not restart the wait
        self._wake()

    def _settle_claims(self, now: float) -> None:
        for holder_uuid, claim in list(self._claims.items()):
            holder = self.peers.get(holder_uuid)
            if holder is None:  # gone meanwhile: the claimant may have its endpoint
                self._drop_claim(holder_uuid)
                self._take_claim(claim, now)
            elif holder.last_seen > claim.since:
                self._drop_claim(holder_uuid)
                log.debug("ignored HELLO of %s: %s still lives at %s", claim.uuid, holder.name,
                          holder.endpoint)
            elif self._link_closed(holder) or now - claim.since >= self.config.interval:
                self._drop_claim(holder_uuid)
                self.remove(holder, "replaced by another node at its endpoint")
                self._take_claim(claim, now)

    def _drop_claim(self, holder_uuid: UUID) -> None:
        claim = self._claims.pop(holder_uuid)
        if self._claimants.get(claim.identity) is claim:
            del self._claimants[claim.identity]

    def _take_claim(self, claim: _Claim, now: float) -> None:
        peer = self.peers.get(claim.uuid) or self._require_peer(
            claim.uuid, claim.hello.endpoint, now, hello=True)
        # A report may have made it a peer meanwhile; its one HELLO is the claim's.
        if peer is not None and not peer.ready and peer.endpoint == claim.hello.endpoint:
            self._accept_hello(peer, claim.hello, now, announce=True)
            for frames in claim.held:  # in order, numbered after the HELLO
                self._take_in(claim.identity, frames, now)

    def _accept_hello(self, peer: Peer, hello: zre.Hello, now: float, announce: bool) -> None:
        self.pending.pop(peer.uuid, None)
        peer.ready = True
        peer.want = 2
        peer.name = hello.name
        peer.headers = dict(hello.headers)
        peer.status = hello.status
        peer.refresh(now)
        if announce:
            if log.isEnabledFor(logging.INFO):  # (its arguments cost more than the check)
                log.info("peer %s (%s) entered from %s", peer.name, peer.uuid.hex,
                         peer.endpoint, extra={"peer": peer.uuid.hex, "peer_name": peer.name})
            self._emit(Event(ENTER, peer.uuid, peer.name, headers=dict(peer.headers),
                            address=peer.endpoint))
            if peer.headers.get(PEX_HEADER) == "1":
                self._send_peer_exchange(peer)
        if peer.groups:
            for group in peer.groups - set(hello.groups):
                self._peer_leave(peer, group)
        for group in hello.groups:
            self._peer_join(peer, group)

    # --- peer exchange (a peermesh extension, only with peers that ask) -------

    def _send_peer_exchange(self, peer: Peer) -> None:
        """Tell a peer that asked for it (X-PM-PEX) every other peer we know."""
        entries = [f"{p.uuid.hex} {p.endpoint}" for p in self.peers.values()
                   if p.ready and p is not peer]
        for start in range(0, len(entries), _PEX_CHUNK):
            chunk = tuple(entries[start:start + _PEX_CHUNK])
            self.send_control(peer, zre.PeerExchange(peer.next_sequence(), chunk))

    def _on_peer_exchange(self, peer: Peer, message: zre.PeerExchange, now: float) -> None:
        if self.headers.get(PEX_HEADER) != "1":
            log.debug("ignored PEX from %s: this node did not ask for it", peer.name)
            return
        for entry in message.peers[:_PEX_CHUNK]:
            match = _PEX_ENTRY.fullmatch(entry)
            if match is None:
                log.debug("ignored malformed PEX entry %r from %s", entry[:80], peer.name)
                continue
            self.peer_appeared(UUID(hex=match[1]), match[2], now)

    # --- timers ------------------------------------------------------------

    def _tick(self, now: float) -> float:
        """Judge every peer's silence at ``now``; the time of the next tick.

        PINGs a peer silent for ``evasive`` (EVASIVE once per silence), reports
        SILENT, removes peers silent for ``expired`` and those whose backlog made
        no progress for ``expired``, and settles endpoint claims.
        """
        cfg = self.config
        for uuid, when in list(self._restarts.items()):
            if now - when >= cfg.evasive:
                del self._restarts[uuid]
        departed = self._departed
        while departed:  # oldest first
            uuid, when = next(iter(departed.items()))
            if now - when < cfg.expired:
                break
            del departed[uuid]
        if self._held_hellos:
            self._drop_held_hellos(now - cfg.hello_timeout)
        pending = self.pending
        while pending:  # oldest first
            peer = next(iter(pending.values()))
            if now - peer.since < cfg.hello_timeout:
                break
            self.counters.add("pending_timed_out")
            log.debug("peer %s at %s said no HELLO within hello_timeout", peer.uuid,
                      peer.endpoint)
            self.remove(peer, "no HELLO")
        self.counters.report(now)
        self._settle(now)
        self._now = now
        if self.election.waves:
            for group in self.election.stale(now, cfg.interval):
                log.debug("election in %s not over after interval: %s", group,
                          "starting again" if group in self.contested else "forgotten")
                if group in self.contested and group in self.groups:
                    self.elect(group)
        evasive: list[Peer] = []
        probe = cfg.rtt_probe
        for peer in list(self.peers.values()):
            stalled = peer.link.stalled_since
            if stalled is not None and now - stalled >= cfg.expired:
                self.remove(peer, "not responding: send queue stalled")
                continue
            idle = now - peer.last_seen
            if idle >= cfg.expired and stalled is None:
                self.remove(peer, "expired")
                continue
            if idle >= cfg.evasive and now >= peer.next_ping:
                peer.next_ping = now + cfg.evasive
                self.ping(peer, now)
                if not peer.evasive and peer.ready:
                    peer.evasive = True
                    log.info("peer %s (%s) is evasive: silent for %.1fs", peer.name,
                             peer.uuid.hex, idle,
                             extra={"peer": peer.uuid.hex, "peer_name": peer.name})
                    self._emit(Event(EventType.EVASIVE, peer.uuid, peer.name))
            elif probe and peer.ready and now >= peer.next_probe and not peer.pings:
                peer.next_probe = now + probe
                self.ping(peer, now)
            if peer.evasive:
                evasive.append(peer)
            if idle >= cfg.silent and not peer.silent and peer.ready:
                peer.silent = True
                log.info("peer %s (%s) is silent for %.1fs", peer.name, peer.uuid.hex, idle,
                         extra={"peer": peer.uuid.hex, "peer_name": peer.name})
                self._emit(Event(EventType.SILENT, peer.uuid, peer.name))
        self._evasive = evasive
        period = min(cfg.interval, cfg.evasive / 2)
        waits = [c.since for c in self._claims.values()]
        waits.extend(since for since, _ in self._leaving.values())
        if waits:
            return min(now + period, min(waits) + cfg.interval)
        return now + period
