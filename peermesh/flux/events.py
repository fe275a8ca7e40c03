"""Flux events: numbered by rank 0, fanned out down the tree, gaps filled from rank 0.

How it works
------------
Rank 0 numbers events from 1 (``event.publish`` requests, flux-core's
body: ``{"topic", "flags", "payload"}`` with the payload in base64, answered
``{"seq"}``), keeps the last ``recent_events`` and sends them to its children,
which forward them down. A node that sees a sequence gap holds later
events, fetches the missed ones from rank 0 (``peermesh.replay``) and
forwards them in order, so its subtree sees no gap; events older than the
buffer are reported lost (``Notice("events-lost")``). A node that joins
(rather than re-attaches) takes the sequence of its new parent as it is: rank 0
may be another node, or a restarted one, with numbering of its own.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Optional, Protocol

from ..errors import ProtocolError, RemoteProtocolError
from ..wire.flux import Errno, EventMessage, Request, Response, encode, read_json
from .bodies import b64, int_field, str_field, unb64
from .clients import ClientTable
from .matchtags import Handle
from .outputs import Deliver, Emit, Notice, Output, Send
from .settings import FluxSettings

__all__ = ["EventLog", "EventHost"]

_PRIVATE = 0x20


class EventHost(Protocol):
    """What the event log needs of its node (``FluxCore``): who it is, whom it serves and
    how it answers and asks."""

    root: bool
    rank: Optional[int]
    settings: FluxSettings
    handles: dict[int, Handle]
    children: dict[bytes, Any]
    clients: ClientTable
    stats: dict[str, int]
    events: dict[str, int]

    def error(self, request: Request, errnum: int, text: str, now: float) -> list[Output]: ...

    def answer(self, request: Request, obj: dict, now: float) -> list[Output]: ...

    def internal_rpc(self, topic: str, obj: dict, nodeid: int, now: float,
                     callback: Optional[Callable[[Response, float], list[Output]]],
                     streaming: bool = False) -> list[Output]: ...


class EventLog:
    """Event numbering, fan-out and replay of one node (see the module's docstring): the
    sequence followed, the events kept (rank 0) and those held while a gap is fetched are
    its own; the node's handles, children and clients it reads through ``node``."""

    def __init__(self, node: EventHost, recent_events: int, synced: bool) -> None:
        self.node = node
        self.seq = 0
        #: whether ``seq`` follows rank 0 (set by the first hello answer; the root's own)
        self.synced = synced
        self.recent: deque[EventMessage] = deque(maxlen=recent_events)
        self.held: list[EventMessage] = []
        self.replay_to = 0  # last seq of the gap being fetched (0: none)

    def restart(self) -> None:
        """Follow a new rank 0 (another node, or restarted, with numbering of its own): the
        next hello answer gives the sequence to follow from."""
        self.synced, self.held, self.replay_to = False, [], 0

    def attached(self, seq: int, now: float) -> list[Output]:
        """The parent answered a hello with its ``seq``: follow it, or fetch the gap."""
        if not self.synced:
            self.synced = True
            self.seq = max(self.seq, seq)  # events before joining are not missed
        elif not self.replay_to:
            upto = max(seq, self.held[0].seq - 1 if self.held else 0)
            if upto > self.seq:
                return self._fetch(self.seq + 1, upto, now)
            out: list[Output] = []
            held, self.held = self.held, []
            for event in held:
                out += self.event(event, encode(event), now)
            return out
        return []

    def publish_request(self, request: Request, now: float) -> list[Output]:
        """``event.publish`` as flux-core serves it: ``{"topic", "flags", "payload"?}``
        (flags 0 or PRIVATE, payload base64), answered ``{"seq"}``; EPROTO on any
        other rank, as flux-core answers."""
        if not self.node.root:
            return self.node.error(request, Errno.EPROTO,
                               "this service is only available on rank 0", now)
        body = read_json(request.payload)
        topic = str_field(body, "topic")
        flags = int_field(body, "flags", 0, 0xFFFFFFFF)
        if not topic:
            raise RemoteProtocolError("'topic' is empty")
        if flags & ~_PRIVATE:
            raise RemoteProtocolError("'flags' other than PRIVATE")
        seq, out = self.publish_here(topic, unb64(body.get("payload")), now, flags)
        return out + self.node.answer(request, {"seq": seq}, now)

    def publish_here(self, topic: str, payload: Optional[bytes], now: float,
                      flags: int = 0) -> tuple[int, list[Output]]:
        self.seq += 1
        self.node.events["sequenced"] += 1
        event = EventMessage(topic, payload, self.seq, flags)
        self.recent.append(event)
        return self.seq, self.pass_down(event, encode(event))

    def replay_request(self, request: Request, now: float) -> list[Output]:
        if not self.node.root:
            return self.node.error(request, Errno.EHOSTUNREACH, "only rank 0 replays", now)
        body = read_json(request.payload)
        first = int_field(body, "from", 1, 0xFFFFFFFF)
        last = min(int_field(body, "to", 1, 0xFFFFFFFF), first + self.node.settings.replay_batch - 1)
        events = [[e.seq, e.topic, b64(e.payload)] for e in self.recent
                  if first <= e.seq <= last]
        return self.node.answer(request, {"events": events, "to": last}, now)

    def event(self, event: EventMessage, frames: list[bytes], now: float) -> list[Output]:
        seq = event.seq
        if seq <= self.seq:
            return []  # a duplicate
        if self.replay_to:
            if len(self.held) >= self.node.settings.recent_events:
                return [Emit(Notice("events-lost", self.node.rank or 0, (seq, seq)))]
            self.held.append(event)
            return []
        if seq == self.seq + 1 or not self.synced:
            return self.pass_down(event, frames if event.routes is None else
                                   encode(EventMessage(event.topic, event.payload, event.seq,
                                                event.flags)))
        self.held.append(event)
        return self._fetch(self.seq + 1, seq - 1, now)

    def pass_down(self, event: EventMessage, frames: list[bytes]) -> list[Output]:
        """Take ``event`` as the next one: hand it to subscribers, children and the
        clients that subscribed to it."""
        self.seq = event.seq
        out: list[Output] = []
        topic = event.topic
        for number, handle in self.node.handles.items():
            for prefix in handle.prefixes:
                if topic.startswith(prefix):
                    out.append(Deliver((number, event)))
                    break
        delivered = len(out)
        for identity, child in self.node.children.items():
            out.append(Send(identity, [identity, *frames]))
        if self.node.clients.subscribed:
            for client in self.node.clients.subscribers(topic):
                out.append(Send(client.identity, [client.identity, *frames]))
        events = self.node.events
        events["delivered"] += delivered
        events["forwarded"] += len(out) - delivered
        return out

    def _fetch(self, first: int, last: int, now: float) -> list[Output]:
        self.replay_to = last
        return self.node.internal_rpc("peermesh.replay", {"from": first, "to": last}, 0, now,
                                  self._replayed)

    def _replayed(self, response: Response, now: float) -> list[Output]:
        out: list[Output] = []
        wanted_to = self.replay_to
        if response.errnum == Errno.EHOSTUNREACH:  # the parent went: ask again once attached
            self.replay_to = 0
            return out
        events: list = []
        if response.errnum == 0:
            try:
                body = read_json(response.payload)
                events = body.get("events") or []
                answered_to = int_field(body, "to", 1, 0xFFFFFFFF)
            except ProtocolError:
                answered_to = wanted_to
        else:
            answered_to = wanted_to
        for item in events if isinstance(events, list) else []:
            try:
                seq, topic, payload = item
                event = EventMessage(str(topic), unb64(payload), int(seq))
            except (ValueError, TypeError, ProtocolError):
                continue
            if event.seq <= self.seq:
                continue
            if event.seq > self.seq + 1:
                out.append(Emit(Notice("events-lost", self.node.rank or 0, (self.seq + 1, event.seq - 1))))
            self.node.stats["replayed"] += 1
            out += self.pass_down(event, encode(event))
        if answered_to < wanted_to and response.errnum == 0:
            return out + self._fetch(answered_to + 1, wanted_to, now)
        if self.seq < wanted_to:
            out.append(Emit(Notice("events-lost", self.node.rank or 0, (self.seq + 1, wanted_to))))
            self.seq = wanted_to
        self.replay_to = 0
        held, self.held = self.held, []
        for event in held:
            out += self.event(event, encode(event), now)
        return out
