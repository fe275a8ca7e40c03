"""An MTL client's leases: ``Reader`` and ``Writer``, each on a DEALER of its own.

A lease talks to the data port its control session's 202 named: ``Lease``,
then ``Summon`` and ``Dismiss`` (each waits for its ``Response``),
``Content``, ``Confirm``, ``Reject``, ``Ping`` / ``Pong``; heartbeats,
reconnection and failover are described in ``peermesh.mtl.client``. The
lease gets its sockets and new leases from its ``Session`` (the ``Client``).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional, Protocol, TypeVar, Union

import zmq

from ...errors import ProtocolError
from ...wire.mtl import (Confirm, Content, DataCommand, Direction, Dismiss, Lease, Ping, Pong,
                         Reject, Response, Summon, decode_data, encode_data, encode_string,
                         EMPTY_TABLE, pack_command_head)
from ..errors import ClientError, GatewayUnavailable, RequestRefused

__all__ = ["Reader", "Writer", "Received", "Session", "MAX_CONTENT"]

log = logging.getLogger("peermesh.mtl.client")

#: largest data command taken from a gateway (bytes, all frames); libzmq drops the
#: connection of a gateway that sends more (the lease then reconnects)
MAX_CONTENT = 64 * 1024 * 1024
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


class Session(Protocol):
    """What a lease needs of its client's control session (``Client`` is one)."""

    timeout: float
    heartbeat: float
    liveness: int
    window: int

    def _socket(self, kind: int, options: Mapping[int, Union[int, bytes]],
                gateway: Optional[str] = None) -> "zmq.Socket[Any]":
        """A socket to the gateway now in use (``gateway``: that one), CURVE if keys."""

    def _lease(self, direction: Direction, resources: tuple[str, ...],
               confirm: str) -> tuple[str, str, int]:
        """A new lease: (data endpoint, lease token, session generation)."""

    def _failover(self, generation: int) -> None:
        """A new control session, unless one newer than ``generation`` exists already."""

    def _release(self, lease: "_Leased") -> None:
        """Forget a closed lease."""


@dataclass(frozen=True, slots=True)
class Received:
    """Content from a resource; give it to ``Reader.confirm`` or ``Reader.reject``."""

    sequence: int
    resource: str
    body: bytes
    properties: Mapping[str, Any]
    link: int = field(default=0, repr=False, compare=False)   # the connection it came on


class _Leased:
    """One lease and its data connection (a DEALER); Reader and Writer build on it."""

    direction = Direction.READ

    def __init__(self, client: "Session", resources: tuple[str, ...], confirm: str) -> None:
        self.client = client
        self.resources = resources
        #: "none" or "full"
        self.confirm_model = confirm.lower()
        #: which data connection this is (goes up with each reconnection)
        self.link = 0
        self._dealer: Optional[zmq.Socket[Any]] = None
        self._monitor: Optional[zmq.Socket[Any]] = None   # the dealer's disconnections
        self._poller = zmq.Poller()
        self._endpoint = ""
        self._token = ""
        self._generation = -1
        self._sequence = 0                   # command sequence
        self._heard = self._said = self._pinged = self._probed = 0.0
        self._probe: Optional[int] = None    # sequence of a Lease sent to check the binding
        self._answer: Optional[int] = None   # the gateway's code for it, not yet acted on
        self._pings = self._pongs = 0        # on this connection (the k-th Pong answers ...)
        self._closed = False
        try:
            self._bind(renew=True)
        except BaseException:
            self._close_dealer()
            raise

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
        dealer = self.client._socket(zmq.DEALER, {zmq.SNDTIMEO: int(self.client.timeout * 1000),
                                                  zmq.MAXMSGSIZE: MAX_CONTENT})
        self._dealer = dealer
        try:
            self._monitor = dealer.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        except BaseException:
            self._close_dealer()
            raise
        self._poller = zmq.Poller()
        self._poller.register(dealer, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        dealer.connect(self._endpoint)
        self._new_link()
        code = self._exchange(lambda seq: Lease(seq, self._token), self._patience())
        if code == 403 and not renew:
            self._bind(renew=True)
            return
        if code != 200:
            raise RequestRefused("Lease", code)
        self._bound()

    def _new_link(self) -> None:
        """A new binding: nothing heard before it counts for its liveness."""
        self.link += 1
        self._heard = self._said = self._pinged = self._probed = time.monotonic()
        self._probe = self._answer = None
        self._pings = self._pongs = 0

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
        self._drain()
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

    def _drain(self) -> None:
        """Take what the gateway sent before the link was lost (content, confirms) off the
        old connection; its Pings are not answered (nobody would hear the Pong)."""
        if self._dealer is None:
            return
        for command in self._read(0):
            if not isinstance(command, Ping):
                self._incoming(command)

    def _dropped(self) -> bool:
        """True if the data connection was lost (the gateway went or closed it): the gateway
        no longer serves the link, whatever is still queued on it."""
        monitor = self._monitor
        if monitor is None or not monitor.poll(0, zmq.POLLIN):
            return False
        try:
            while True:
                monitor.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            pass
        return True

    def _awake(self) -> None:
        """Before a call waits on the link: reconnect if the connection was lost; present
        the lease again if nobody called this lease for ``heartbeat * liveness`` seconds
        (the gateway may have unbound the link meanwhile, while its Pings queued up)."""
        if self._dropped():
            self._recover()
        elif time.monotonic() - self._said >= self.client.heartbeat * self.client.liveness:
            try:
                code = self._exchange(lambda seq: Lease(seq, self._token), self._patience())
            except GatewayUnavailable:
                self._recover()
                return
            self._presented(code)

    def _presented(self, code: int) -> None:
        """The gateway's answer to the lease presented again on a bound connection: 400
        (still bound), 200 (it had unbound the link and bound it again: what the lease had
        is restored), 403 (revoked: a new lease)."""
        if code == 200:
            log.info("MTL %s lease on %s: bound again", self.direction.name.lower(),
                     self._endpoint)
            self._new_link()     # (content an unbound link brought is the gateway's again)
            self._bound()
        elif code == 403:
            self._bind(renew=True)

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
        self._awake()
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
        ready = dict(self._poller.poll(max(0, int(timeout * 1000))))
        if dealer not in ready:
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
            self._probe, self._answer = None, command.code

    def _pump(self, timeout: float) -> None:
        """Read and handle what arrives within ``timeout``; keep the connection alive."""
        self._awake()
        for command in self._read(timeout):
            self._incoming(command)
        now = time.monotonic()
        heartbeat, liveness = self.client.heartbeat, self.client.liveness
        if self._answer is not None:  # the periodic check: still bound?
            code, self._answer = self._answer, None
            self._presented(code)
        elif self._dropped():
            self._recover()
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
            if self._monitor is not None:
                self._dealer.disable_monitor()
                self._monitor.close(0)
                self._monitor = None
            self._dealer.close(int(linger * 1000))
            self._dealer = None

    def close(self) -> None:
        """Close the data connection (the gateway forgets the lease after a while); what
        is still queued to send gets up to ``timeout`` seconds to leave. The client
        forgets the lease."""
        if not self._closed:
            self._closed = True
            self._close_dealer(self.client.timeout)
            self.client._release(self)

    def __enter__(self: "_L") -> "_L":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_L = TypeVar("_L", bound=_Leased)


class Reader(_Leased):
    """A read lease: ``summon`` resources, ``receive`` content, ``confirm`` / ``reject`` it."""

    direction = Direction.READ

    def __init__(self, client: "Session", resources: tuple[str, ...], confirm: str) -> None:
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

    def __init__(self, client: "Session", resources: tuple[str, ...], confirm: str) -> None:
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
            self._recover()      # (idle: as ``_awake``, inline: this is the hot path)
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
                tail = encode_string(resource) + EMPTY_TABLE
                if len(self._tails) >= _MAX_TAILS:
                    self._tails.clear()
                self._tails[resource] = tail
            header = pack_command_head(5, sequence) + tail
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

