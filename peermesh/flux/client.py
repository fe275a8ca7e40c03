"""A rankless client of a Flux instance: RPCs, events and pings without joining the tree.

``FluxClient`` connects one DEALER to a member's ROUTER (the first of the
endpoints given that accepts it) and says ``peermesh.client``; the member
then routes the client's requests as its own (to any rank, or a given one)
and answers down the client's routing identity, and hands it the events
that match its subscriptions (see ``peermesh.flux.clients`` for what the
member keeps and its bounds). The client takes no rank: the instance's
size and rank 0's directory never count it, however often clients come
and go. It runs on the caller's gevent hub, as ``FluxOverlay`` does::

    client = FluxClient([member.endpoint]).connect(5)
    print(client.rpc("peermesh.info", None, 0).get_json(5)["size"])
    client.close()

When idle it sends a heartbeat every ``heartbeat`` seconds (the member's
own, if shorter: the member answers ``peermesh.client`` with it); a member
silent for ``lost`` seconds, or one that says DISCONNECT, is lost: every
RPC in flight fails with EHOSTUNREACH (streams too: they are not resumed),
and the listeners hear ``Notice("member-lost")``.

Failover: the client then connects to another of its endpoints (the lost
member's last), each tried for ``max(2 * heartbeat, 0.5)`` seconds in turn
for up to ``failover`` seconds, and takes its subscriptions there again.
A client given ``find_members`` (a callable that looks for the instance's
members now, within the seconds it is given, and returns their endpoints in
the order to try them, or ``{endpoint: key}`` on keys) also looks for
members again meanwhile, in a greenlet of its own: at once, and after every
round of endpoints that brought no member. Members it finds are tried
before the rest, so a member that joined after the client connected can take
over; the client knows the endpoints it was given and those of the last
look.
Then it fetches from rank 0 (``peermesh.replay``) the events published since
the last it had and hands those that match to its subscriptions, in order,
before the new member's (which it holds meanwhile); events older than
rank 0's buffer are reported as ``Notice("events-lost", -1, (first, last))``
(some of them may not have matched). Its listeners hear
``Notice("member-changed", rank, endpoint)``, or
``Notice("failover-failed")`` when no member accepted it (then it is no
longer ``connected``). Meanwhile ``reconnecting`` is true and new RPCs fail
at once with EHOSTUNREACH. RPCs are never sent again by the client: it
cannot know whether the lost member had passed one on, nor whether doing
it twice is harmless; the caller, who knows, may send it again.

A flux-core broker is reached through its local connector: an endpoint
``local://PATH`` (what ``FLUX_URI`` names; ``peermesh.flux.local``). The
client then asks the broker's ``rank`` and ``size`` attributes instead of
saying ``peermesh.client``, sends no heartbeats (the broker wants none) and
does not fail over: the broker closing the connection fails what is in
flight.

A member on keys (CURVE) is reached with its public key: ``endpoints`` as
``{endpoint: key}`` (Z85); the client connects as a CURVE client with
``curve``'s keypair, or with a keypair of its own made for the connection
(the member admits it only if its allowlist admits any key).

Kept whole: one client (``FluxClient``): its RPCs, subscriptions and pings share the one
link that failover replaces (failing the RPCs in flight, taking the subscriptions
again).
"""

from __future__ import annotations

import base64
import logging
import os
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import gevent

from ..errors import ProtocolError
from ..io.curve import Curve
from ..io.keys import generate
from ..io.transport import ZmqTransport
from ..io.zap import Allowlist
from ..wire.flux import (
    NODEID_ANY, NODEID_UPSTREAM, Control, ControlType, Errno, EventMessage, Request, Response, decode,
    encode, string_payload,
)
from .errors import FluxError, FluxStateError
from .bodies import ping_body, publish_body, unb64
from .local import LocalLink, is_local
from .handle import SUBSCRIPTION_QUEUE, Payload, RpcFuture, Subscription, to_payload
from .matchtags import Handle, Pending
from .outputs import IDENTITY_SIZE, Notice
from .overlay import MAX_MESSAGE, SNDHWM
from .topology import Topology

__all__ = ["FluxClient"]

log = logging.getLogger(__name__)

_NORESPONSE, _UPSTREAM, _STREAMING = 0x04, 0x10, 0x40
#: what ``find_members`` returns: endpoints, or ``{endpoint: key}`` of members on keys
Members = Union[Sequence[str], Mapping[str, str]]


class FluxClient:
    """A client of one member of a Flux instance (see the module's docstring)."""

    def __init__(self, endpoints: Union[Sequence[str], Mapping[str, str]], *,
                 transport: Any = None, heartbeat: float = 2.0, lost: float = 30.0,
                 max_message: int = MAX_MESSAGE, curve: Optional[Curve] = None,
                 failover: float = 30.0,
                 find_members: Optional[Callable[[float], Members]] = None) -> None:
        if not endpoints:
            raise FluxStateError("a Flux client needs the endpoint of a member")
        if not 0 < heartbeat <= lost:
            raise FluxStateError(f"a Flux client needs 0 < heartbeat <= lost, not "
                                 f"{heartbeat}, {lost}")
        if not failover >= 0:
            raise FluxStateError(f"a Flux client's failover is seconds >= 0, not {failover!r}")
        self.endpoints = list(endpoints)
        #: endpoint -> the member's public key (Z85), for a member on keys
        self.keys: dict[str, str] = dict(endpoints) if isinstance(endpoints, Mapping) else {}
        self._given = (list(self.endpoints), dict(self.keys))
        #: looks on the mesh for the current members when the member is lost (or None)
        self.find_members = find_members
        if (self.keys or curve is not None) and transport is not None:
            raise FluxStateError("give the members' keys or transport=, not both")
        if curve is not None and not self.keys:
            raise FluxStateError("a Flux client with keys needs each member's key: give "
                                 "endpoints as {endpoint: key}")
        if self.keys and curve is None:
            curve = Curve(generate(), Allowlist(None))
        self.transport: Any = transport or ZmqTransport(curve=curve)
        self.heartbeat = heartbeat
        self.lost = lost
        self.max_message = max_message
        #: seconds to look for another member once the member is lost (0: do not)
        self.failover = failover
        self.identity = os.urandom(IDENTITY_SIZE)
        #: the member's answer to ``peermesh.client``: rank, size, topology, seq, heartbeat
        self.member: dict[str, Any] = {}
        self.endpoint = ""  # the member's, once connected
        self._link: Any = None
        self._tags = Handle()
        self._futures: dict[int, RpcFuture] = {}
        self._subscriptions: list[Subscription] = []
        self._listeners: list[Callable[[Notice], None]] = []
        self._greenlets: list[gevent.Greenlet] = []  # of the link: serve, timer
        self._failing_over: Optional[gevent.Greenlet] = None
        self._closed = False
        #: the sequence of the last event the client had (or its member had when it came)
        self.seq = 0
        self._held: Optional[list[EventMessage]] = None  # events of a new member, during catch-up
        self._heard = self._sent = 0.0
        self.dropped = 0

    # --- connecting ------------------------------------------------------------

    def connect(self, timeout: float) -> "FluxClient":
        """Connect to the first member that accepts within ``timeout`` seconds (the
        endpoints in turn, each for an even share); ``FluxError`` naming the last
        refusal (ETIMEDOUT when none answered)."""
        if self._link is not None or self.reconnecting:
            raise FluxStateError("the Flux client is connected already")
        self._closed = False
        self.endpoint = ""  # none until one accepts: a loss meanwhile is no member's
        share = timeout / len(self.endpoints)
        error = FluxError(Errno.ETIMEDOUT, f"no member answered in {timeout:g} s",
                          "peermesh.client")
        for endpoint in self.endpoints:
            try:
                self._attach(endpoint, share)
                seq = self.member.get("seq")
                self.seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else 0
                return self
            except FluxError as exc:
                error = exc if exc.errnum != Errno.ETIMEDOUT else error
        raise error

    def _attach(self, endpoint: str, timeout: float) -> None:
        """Connect to the member at ``endpoint`` and say ``peermesh.client`` (to a flux-core
        broker's local connector: ask its ``rank`` and ``size`` attributes); ``FluxError``
        (and no link) unless it accepts within ``timeout`` seconds."""
        start = self.transport.now()
        self._open(endpoint, timeout)
        try:
            if is_local(endpoint):
                left = max(timeout - (self.transport.now() - start), 0.05)
                rank, size = [self._request("attr.get", {"name": name}, NODEID_ANY, 0)
                              for name in ("rank", "size")]
                self.member = {"rank": _attr_int(rank.get_json(left)),
                               "size": _attr_int(size.get_json(left)), "seq": 0}
            else:
                self.member = self._request("peermesh.client", None, NODEID_ANY,
                                            0).get_json(timeout)
        except FluxError:
            self._drop_link(0)
            raise
        self.endpoint = endpoint
        if is_local(endpoint):
            return  # a broker neither sends heartbeats to its local clients nor wants them
        beat = self.member.get("heartbeat")  # the member forgets a client silent longer
        if isinstance(beat, (int, float)) and 0 < beat < self.heartbeat:
            self.heartbeat = float(beat)
        self._greenlets.append(gevent.spawn(self._run_timer, self._link))

    def _open(self, endpoint: str, timeout: float) -> None:
        if is_local(endpoint):
            link: Any = LocalLink(endpoint, timeout, self.max_message)
        else:
            secure = {"server_key": self.keys[endpoint].encode()} if self.keys else {}
            # an identity per connection: a ROUTER without ROUTER_HANDOVER (flux-core's, a
            # refusing peer's) ignores a new connection under one it has not yet let go
            self.identity = os.urandom(IDENTITY_SIZE)
            link = self.transport.connect(self.identity, endpoint, SNDHWM, handover=True,
                                          **secure)
            link.limit = self.max_message
        self._link = link
        self._heard = self._sent = self.transport.now()
        self._greenlets.append(gevent.spawn(self._serve, link))

    def _drop_link(self, linger: float) -> None:
        """Close the link and stop its greenlets (but the calling one)."""
        link, self._link = self._link, None
        if link is not None:
            link.close(linger=linger)
        current = gevent.getcurrent()
        gevent.killall([g for g in self._greenlets if g is not current], block=False)
        self._greenlets = []

    def close(self) -> None:
        """Say DISCONNECT to the member (which forgets this client) and stop; pending
        RPCs fail."""
        self._closed = True
        failing_over, self._failing_over = self._failing_over, None
        if failing_over is not None and failing_over is not gevent.getcurrent():
            failing_over.kill(block=False)
        if self._link is not None:
            self._send(encode(Control(ControlType.DISCONNECT)))
        self._drop_link(0.1)
        self._fail_all("the client was closed")

    def __enter__(self) -> "FluxClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what the member said -----------------------------------------------------

    @property
    def rank(self) -> Optional[int]:
        """The rank of the member this client is connected to."""
        rank = self.member.get("rank")
        return rank if isinstance(rank, int) else None

    @property
    def size(self) -> int:
        """The instance's size as the member knew it when the client connected."""
        size = self.member.get("size")
        return size if isinstance(size, int) and size > 0 else 1

    @property
    def topology(self) -> Optional[Topology]:
        try:
            return Topology.parse(self.member.get("topology", ""))
        except ValueError:
            return None

    @property
    def connected(self) -> bool:
        """Connected to a member that has not been lost."""
        return self._link is not None and self._failing_over is None

    @property
    def reconnecting(self) -> bool:
        """The member was lost and another is being looked for (see the module's docstring)."""
        return self._failing_over is not None

    def add_listener(self, callback: Callable[[Notice], None]) -> None:
        """Call ``callback(notice)`` on the hub when the member is lost (``member-lost``),
        when another took its place (``member-changed``) or none did (``failover-failed``)."""
        self._listeners.append(callback)

    # --- requests and events ----------------------------------------------------------

    def rpc(self, topic: str, payload: Payload = None, nodeid: int = NODEID_ANY,
            flags: int = 0, *, streaming: bool = False) -> RpcFuture:
        """As ``FluxHandle.rpc``: ``topic`` to ``nodeid`` (a rank, ``NODEID_ANY`` or
        ``NODEID_UPSTREAM``), routed as from the member this client is connected to."""
        if self._failing_over is not None:
            future = RpcFuture(self, 0, topic, streaming)
            future._put(Response(topic, string_payload("the member was lost; the client is "
                                                       "connecting to another"),
                                 Errno.EHOSTUNREACH, 0))
            return future
        if self._link is None:
            raise FluxStateError("connect the Flux client first")
        if not isinstance(topic, str) or not topic:
            raise FluxStateError(f"an RPC topic is a non-empty string, not {topic!r}")
        if not isinstance(nodeid, int) or isinstance(nodeid, bool) or not 0 <= nodeid <= 0xFFFFFFFF:
            raise FluxStateError(f"nodeid {nodeid!r} is not a rank, NODEID_ANY or NODEID_UPSTREAM")
        flags = int(flags) | (_STREAMING if streaming else 0)
        if nodeid == NODEID_UPSTREAM:  # never on the wire: the member's rank, flag UPSTREAM
            if self.rank is None:
                raise FluxStateError("NODEID_UPSTREAM needs the member's rank: connect first")
            nodeid, flags = self.rank, flags | _UPSTREAM
        if flags & _NORESPONSE and flags & _STREAMING:
            raise FluxStateError("an RPC cannot be both NORESPONSE and STREAMING")
        return self._request(topic, payload, nodeid, flags)

    def _request(self, topic: str, payload: Payload, nodeid: int, flags: int) -> RpcFuture:
        """Send a request (checked already) to the member."""
        tag = 0
        if not flags & _NORESPONSE:
            tag = self._tags.allocate()
            self._tags.pending[tag] = Pending(topic, nodeid, bool(flags & _STREAMING))
        future = RpcFuture(self, tag, topic, bool(flags & _STREAMING))
        if tag:
            self._futures[tag] = future
        self._send(encode(Request(topic, to_payload(payload), nodeid, tag, flags, ())))
        return future

    def publish(self, topic: str, payload: Payload = None) -> RpcFuture:
        """Publish an event (numbered by rank 0); the future answers ``{"seq": n}``."""
        if not isinstance(topic, str) or not topic:
            raise FluxStateError(f"an event topic is a non-empty string, not {topic!r}")
        return self.rpc("event.publish", publish_body(topic, to_payload(payload)), 0)

    def subscribe(self, prefix: str, timeout: Optional[float] = None,
                  callback: Optional[Callable[[EventMessage], None]] = None) -> Subscription:
        """Receive events whose topic starts with ``prefix``; returns once the member has
        taken the subscription (``FluxError`` if it refused, e.g. EAGAIN past its bound)."""
        if not isinstance(prefix, str):
            raise FluxStateError("a subscription prefix is a string")
        self.rpc("event.subscribe", {"topic": prefix}).get(timeout)
        subscription = Subscription(self, prefix, callback)
        self._subscriptions.append(subscription)
        return subscription

    def ping(self, rank: int, timeout: Optional[float] = None, seq: int = 0,
             pad: str = "") -> float:
        """Round-trip seconds of ``broker.ping`` to ``rank`` with flux's body
        (``{"seq", "pad"}``), as a flux-core broker and a peermesh rank answer it."""
        start = self.transport.now()
        self.rpc("broker.ping", ping_body(seq, pad), rank).get(timeout)
        return self.transport.now() - start

    def attr_get(self, name: str, timeout: Optional[float] = None) -> str:
        """The value of the broker attribute ``name`` (``attr.get``, as flux-core
        serves it and a peermesh member too: see ``peermesh.flux.core``)."""
        value = self.rpc("attr.get", {"name": name}).get_json(timeout).get("value")
        if not isinstance(value, str):
            raise FluxError(Errno.EPROTO, f"attr.get {name}: no value in the answer", "attr.get")
        return value

    # --- what RpcFuture and Subscription call back --------------------------------------

    def _abandon(self, future: RpcFuture) -> None:
        pending = self._tags.pending.get(future.matchtag)
        if pending is not None:  # released when its final response comes, dropped then
            self._tags.pending[future.matchtag] = Pending("", pending.nodeid, pending.streaming)
        self._futures.pop(future.matchtag, None)
        future.done = True

    def _cancel(self, future: RpcFuture) -> None:
        pending = self._tags.pending.get(future.matchtag)
        if pending is not None and pending.streaming and self._link is not None:
            service = future.topic.partition(".")[0]
            self.rpc(service + ".cancel", {"matchtag": future.matchtag}, pending.nodeid,
                     _NORESPONSE)

    def _unsubscribe(self, subscription: Subscription) -> None:
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)
        if self._link is not None and not any(s.prefix == subscription.prefix
                                              for s in self._subscriptions):
            self.rpc("event.unsubscribe", {"topic": subscription.prefix}, flags=_NORESPONSE)

    # --- the link ----------------------------------------------------------------------

    def _send(self, frames: list[bytes]) -> None:
        link = self._link
        try:
            sent = link is not None and link.try_send(frames)
        except Exception as exc:  # closed under us
            log.debug("flux client: send failed: %s", exc)
            sent = False
        if sent:
            self._sent = self.transport.now()
        else:
            self.dropped += 1

    def _serve(self, link: Any) -> None:  # (a greenlet of the link)
        def on_message(first: bytes, rest: list[bytes]) -> None:
            if link is self._link:
                rest.insert(0, first)
                self._receive(rest)

        link.serve(on_message, self._oversized)
        if link is self._link and getattr(link, "eof", False):  # a local link's end
            self._member_lost("the broker closed the connection")

    def _oversized(self, first: bytes) -> None:
        self.dropped += 1

    def _receive(self, frames: list[bytes]) -> None:
        self._heard = self.transport.now()
        try:
            message = decode(frames)
        except ProtocolError as exc:
            self.dropped += 1
            log.debug("flux client: dropped a malformed message: %s", exc.reason)
            return
        kind = type(message)
        if kind is Response:
            assert isinstance(message, Response)
            self._response(message)
        elif kind is EventMessage:
            assert isinstance(message, EventMessage)
            held = self._held
            if held is None:
                self._hand_out(message)
            elif len(held) < SUBSCRIPTION_QUEUE:
                held.append(message)
            else:
                self.dropped += 1
        elif kind is Control:
            assert isinstance(message, Control)
            if message.ctype == ControlType.DISCONNECT:
                self._member_lost("the member left" if self.endpoint else
                                  "DISCONNECT: the peer refused the client (not a peermesh "
                                  "member, or one that does not take clients)")
        else:
            self.dropped += 1  # a request: clients serve nothing

    def _response(self, response: Response) -> None:
        tag = response.matchtag
        pending = self._tags.pending.get(tag)
        if pending is None:
            self.dropped += 1
            return
        final = not pending.streaming or response.errnum != 0
        if final:
            self._tags.release(tag)
        future = self._futures.get(tag)
        if future is None:
            return  # abandoned
        if final:
            del self._futures[tag]
        future._put(response)

    def _run_timer(self, link: Any) -> None:
        now = self.transport.now
        while self._link is link:
            self.transport.sleep(max(min(self._sent + self.heartbeat,
                                         self._heard + self.lost) - now(), 0.001))
            if now() - self._heard >= self.lost:
                self._member_lost(f"silent for {self.lost:g} s")
                return
            if now() - self._sent >= self.heartbeat:
                self._send(encode(Control(ControlType.HEARTBEAT)))

    def _member_lost(self, why: str) -> None:
        lost = self.endpoint
        self._drop_link(0)
        if self._failing_over is not None:  # the member being tried went: look on
            self._fail_all(f"the member was lost ({why})")
            return
        if not lost:  # refused while connecting: connect() says so (no failover, no notice)
            self._fail_all(why)
            return
        if self.failover > 0 and not self._closed and not is_local(lost):
            self._failing_over = gevent.spawn(self._fail_over, lost)
        # listeners first: failing a future may switch to its waiter
        self._notify(Notice("member-lost", self.rank if self.rank is not None else -1, why))
        self._fail_all(f"the member was lost ({why})")

    def _fail_over(self, lost: str) -> None:
        """Connect to another member and subscribe there again (see the module's docstring)."""
        now = self.transport.now
        deadline = now() + self.failover
        attempt = max(2 * self.heartbeat, 0.5)
        why = f"no member answered in {self.failover:g} s"
        looking = self._look(deadline)
        todo = self._round(lost)
        tried: set[str] = set()
        try:
            while not self._closed and now() < deadline:
                if looking is not None and looking.ready():
                    found = self._learn(looking.value)
                    todo = [e for e in found if e not in tried and e not in todo] + todo
                    looking = None
                if not todo:  # a round without a member: pause, look again, try them all again
                    if looking is None:
                        looking = self._look(deadline)
                    pause = min(self.heartbeat, max(deadline - now(), 0))
                    if looking is not None:
                        looking.join(pause)  # (ends early with what it found)
                    else:
                        self.transport.sleep(pause)
                    todo, tried = self._round(lost), set()
                    continue
                endpoint = todo.pop(0)
                tried.add(endpoint)
                try:
                    self._take_over(endpoint, attempt, deadline)
                except FluxError as exc:
                    why = f"{endpoint}: {exc.message}"
                    self._held = None
                    self._drop_link(0)
                    continue
                self._failing_over = None
                self._notify(Notice("member-changed", self.rank if self.rank is not None else -1,
                                    endpoint))
                return
        finally:
            if looking is not None:
                looking.kill(block=False)
        self._failing_over = None
        self._notify(Notice("failover-failed", -1, why))

    def _take_over(self, endpoint: str, attempt: float, deadline: float) -> None:
        """Attach to ``endpoint``, subscribe there again and catch up on events;
        ``FluxError`` when that member does not take the client."""
        self._attach(endpoint, min(attempt, max(deadline - self.transport.now(), 0.05)))
        self._held = []
        prefixes = dict.fromkeys(s.prefix for s in self._subscriptions)
        for future in [self._request("event.subscribe", {"topic": prefix}, NODEID_ANY, 0)
                       for prefix in prefixes]:
            future.get(attempt)
        info = self._request("peermesh.info", None, NODEID_ANY, 0).get_json(attempt)
        if not self._catch_up(info.get("seq"), attempt):
            raise FluxError(Errno.EHOSTUNREACH, "lost while catching up", "peermesh.replay")

    def _round(self, lost: str) -> list[str]:
        """The endpoints to try in turn, the lost member's last."""
        return [e for e in self.endpoints if e != lost] + [lost]

    def _look(self, deadline: float) -> Optional[gevent.Greenlet]:
        """A greenlet running ``find_members`` until ``deadline`` (None without it)."""
        find = self.find_members
        if find is None:
            return None

        def look() -> Members:
            try:
                return find(max(deadline - self.transport.now(), 0.0))
            except Exception as exc:  # the failover goes on with the endpoints it knows
                log.warning("flux client: looking for members failed: %s", exc)
                return []
        return gevent.spawn(look)

    def _learn(self, found: Members) -> list[str]:
        """Take what ``find_members`` returned as the members besides those given; the
        endpoints found that this client can use (on keys: those with a key), in order."""
        usable = []
        keys = dict(found) if isinstance(found, Mapping) else {}
        given, given_keys = self._given
        for endpoint in found:
            if not isinstance(endpoint, str) or (given_keys and not keys.get(endpoint)):
                continue  # a client on keys cannot reach a member without one
            usable.append(endpoint)
        self.endpoints = list(dict.fromkeys(usable + given))
        self.keys = {**{e: keys[e] for e in usable}, **given_keys} if given_keys else {}
        return usable

    def _catch_up(self, upto: Any, timeout: float) -> bool:
        """Hand out the events from ``self.seq`` to ``upto`` (the new member's sequence once
        subscribed) that rank 0 still has, then the new member's held ones; False if the
        new member went meanwhile."""
        first = self.seq + 1
        restarted = isinstance(upto, int) and upto < self.seq  # a new rank 0 numbers afresh
        if isinstance(upto, int) and self._subscriptions and first <= upto:
            try:
                while first <= upto:
                    body = self._request("peermesh.replay", {"from": first, "to": upto}, 0,
                                         0).get_json(timeout)
                    to, events = body.get("to"), body.get("events")
                    if not isinstance(to, int) or to < first or not isinstance(events, list):
                        raise FluxError(Errno.EPROTO, "a malformed replay", "peermesh.replay")
                    for item in events:
                        try:
                            seq, topic, payload = item
                            event = EventMessage(str(topic), unb64(payload), int(seq))
                        except (ValueError, TypeError, ProtocolError):
                            continue
                        if event.seq >= first:
                            if event.seq > first:
                                self._lost(first, event.seq - 1)
                            self._hand_out(event)
                            first = event.seq + 1
                    if first <= to:
                        self._lost(first, to)
                    first = to + 1
            except FluxError as exc:
                if self._link is None:
                    return False
                log.debug("flux client: no replay from rank 0: %s", exc)
                self._lost(first, upto)
        held, self._held = self._held or [], None
        for event in held:
            if restarted or event.seq > self.seq:
                self._hand_out(event)
        return True

    def _lost(self, first: int, last: int) -> None:
        self._notify(Notice("events-lost", -1, (first, last)))

    def _hand_out(self, event: EventMessage) -> None:
        """``event`` to the subscriptions it matches."""
        self.seq = event.seq
        for subscription in list(self._subscriptions):
            if event.topic.startswith(subscription.prefix):
                subscription._put(event)

    def _notify(self, notice: Notice) -> None:
        for listener in self._listeners:
            try:
                listener(notice)
            except Exception:
                log.exception("flux client listener failed")

    def _fail_all(self, why: str) -> None:
        futures, self._futures = self._futures, {}
        self._tags = Handle()
        for tag, future in futures.items():
            future._put(Response(future.topic, string_payload(why), Errno.EHOSTUNREACH, tag))


def _attr_int(answer: dict[str, Any]) -> int:
    """The whole number an ``attr.get`` answer holds (as a string); EPROTO if none."""
    value = answer.get("value")
    if not isinstance(value, str) or not value.isdigit():
        raise FluxError(Errno.EPROTO, f"attr.get: {value!r} is not a whole number", "attr.get")
    return int(value)
