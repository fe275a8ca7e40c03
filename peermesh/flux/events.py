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
from typing import Optional

from ..errors import ProtocolError, RemoteProtocolError
from ..wire.flux import Errno, EventMessage, Request, Response, encode, read_json
from .bodies import b64, int_field, str_field, unb64
from .clients import ClientTable
from .outputs import Deliver, Emit, Notice, Output, Send
from .routing import Routing

__all__ = ["EventLog"]

_PRIVATE = 0x20


class EventLog(Routing):
    """Event numbering, fan-out and replay of ``FluxCore`` (see the module's docstring)."""

    seq: int
    recent: deque[EventMessage]
    _held: list[EventMessage]
    _replay_to: int
    _synced: bool
    clients: ClientTable
    events: dict[str, int]

    def _publish_request(self, request: Request, now: float) -> list[Output]:
        """``event.publish`` as flux-core serves it: ``{"topic", "flags", "payload"?}``
        (flags 0 or PRIVATE, payload base64), answered ``{"seq"}``; EPROTO on any
        other rank, as flux-core answers."""
        if not self.root:
            return self._error(request, Errno.EPROTO,
                               "this service is only available on rank 0", now)
        body = read_json(request.payload)
        topic = str_field(body, "topic")
        flags = int_field(body, "flags", 0, 0xFFFFFFFF)
        if not topic:
            raise RemoteProtocolError("'topic' is empty")
        if flags & ~_PRIVATE:
            raise RemoteProtocolError("'flags' other than PRIVATE")
        seq, out = self._publish_here(topic, unb64(body.get("payload")), now, flags)
        return out + self._answer(request, {"seq": seq}, now)

    def _publish_here(self, topic: str, payload: Optional[bytes], now: float,
                      flags: int = 0) -> tuple[int, list[Output]]:
        self.seq += 1
        self.events["sequenced"] += 1
        event = EventMessage(topic, payload, self.seq, flags)
        self.recent.append(event)
        return self.seq, self._pass_down(event, encode(event))

    def _replay_request(self, request: Request, now: float) -> list[Output]:
        if not self.root:
            return self._error(request, Errno.EHOSTUNREACH, "only rank 0 replays", now)
        body = read_json(request.payload)
        first = int_field(body, "from", 1, 0xFFFFFFFF)
        last = min(int_field(body, "to", 1, 0xFFFFFFFF), first + self.settings.replay_batch - 1)
        events = [[e.seq, e.topic, b64(e.payload)] for e in self.recent
                  if first <= e.seq <= last]
        return self._answer(request, {"events": events, "to": last}, now)

    def _event(self, event: EventMessage, frames: list[bytes], now: float) -> list[Output]:
        seq = event.seq
        if seq <= self.seq:
            return []  # a duplicate
        if self._replay_to:
            if len(self._held) >= self.settings.recent_events:
                return [Emit(Notice("events-lost", self.rank or 0, (seq, seq)))]
            self._held.append(event)
            return []
        if seq == self.seq + 1 or not self._synced:
            return self._pass_down(event, frames if event.routes is None else
                                   encode(EventMessage(event.topic, event.payload, event.seq,
                                                event.flags)))
        self._held.append(event)
        return self._fetch(self.seq + 1, seq - 1, now)

    def _pass_down(self, event: EventMessage, frames: list[bytes]) -> list[Output]:
        """Take ``event`` as the next one: hand it to subscribers, children and the
        clients that subscribed to it."""
        self.seq = event.seq
        out: list[Output] = []
        topic = event.topic
        for number, handle in self.handles.items():
            for prefix in handle.prefixes:
                if topic.startswith(prefix):
                    out.append(Deliver((number, event)))
                    break
        delivered = len(out)
        for identity, child in self.children.items():
            out.append(Send(identity, [identity, *frames]))
        if self.clients.subscribed:
            for client in self.clients.subscribers(topic):
                out.append(Send(client.identity, [client.identity, *frames]))
        events = self.events
        events["delivered"] += delivered
        events["forwarded"] += len(out) - delivered
        return out

    def _fetch(self, first: int, last: int, now: float) -> list[Output]:
        self._replay_to = last
        return self._internal_rpc("peermesh.replay", {"from": first, "to": last}, 0, now,
                                  self._replayed)

    def _replayed(self, response: Response, now: float) -> list[Output]:
        out: list[Output] = []
        wanted_to = self._replay_to
        if response.errnum == Errno.EHOSTUNREACH:  # the parent went: ask again once attached
            self._replay_to = 0
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
                out.append(Emit(Notice("events-lost", self.rank or 0, (self.seq + 1, event.seq - 1))))
            self.stats["replayed"] += 1
            out += self._pass_down(event, encode(event))
        if answered_to < wanted_to and response.errnum == 0:
            return out + self._fetch(answered_to + 1, wanted_to, now)
        if self.seq < wanted_to:
            out.append(Emit(Notice("events-lost", self.rank or 0, (self.seq + 1, wanted_to))))
            self.seq = wanted_to
        self._replay_to = 0
        held, self._held = self._held, []
        for event in held:
            out += self._event(event, encode(event), now)
        return out
