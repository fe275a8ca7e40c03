"""The public face of a Flux node: handles, RPC futures, served requests, subscriptions.

A ``FluxHandle`` is one client of a node (a module, in flux-core's words):
it sends RPCs (``rpc`` returns an ``RpcFuture``), serves ``service.method``
topics (``register``), publishes and subscribes to events. Matchtags are
per handle. Everything runs on the node's gevent hub: call these from its
greenlets; from another thread, through ``ThreadedNode.call``, with
``RpcFuture.on_response`` to hand the answers back. Handlers run on the
hub as requests arrive and must not block: a slow handler spawns a greenlet
and answers later through its ``FluxRequest``.

Payloads: ``bytes`` go as they are; a ``str`` is a string payload and a
``dict`` a JSON payload, both with RFC 3's terminating NUL.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Protocol, Union

import gevent
import gevent.event
from gevent.hub import Waiter, get_hub
from greenlet import getcurrent

from ..errors import ProtocolError
from ..wire.flux import (
    NODEID_ANY, Errno, EventMessage, MsgFlag, Request, Response, error_message, json_payload,
    read_json, service_of, string_payload,
)
from .errors import FluxError, FluxStateError
from .outputs import Output
from .settings import FluxSettings

if TYPE_CHECKING:
    from .core import FluxCore

__all__ = ["FluxHandle", "RpcFuture", "FluxRequest", "Subscription", "Payload", "to_payload",
           "HandleHost"]

log = logging.getLogger(__name__)

Payload = Union[bytes, str, dict, None]
Handler = Callable[["FluxRequest"], Any]
_NORESPONSE, _STREAMING = int(MsgFlag.NORESPONSE), int(MsgFlag.STREAMING)
#: events a subscription holds unread before it drops the oldest
SUBSCRIPTION_QUEUE = 10000


def to_payload(value: Payload) -> Optional[bytes]:
    """``value`` as a payload frame (see the module's docstring)."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return string_payload(value)
    if isinstance(value, dict):
        return json_payload(value)
    raise FluxStateError(f"a payload is bytes, str, a dict or None, not {type(value).__name__}")


def _json(payload: Optional[bytes]) -> dict[str, Any]:
    try:
        return read_json(payload)
    except ProtocolError as exc:
        raise FluxError(Errno.EPROTO, exc.reason) from None


class Owner(Protocol):
    """What futures and subscriptions call back: a ``FluxHandle`` or a ``FluxClient``."""

    def _abandon(self, future: "RpcFuture") -> None: ...

    def _cancel(self, future: "RpcFuture") -> None: ...

    def _unsubscribe(self, subscription: "Subscription") -> None: ...


class RpcFuture:
    """The response(s) to one RPC: ``get()`` for one, iterate for a stream.

    A waiting caller parks on a ``Waiter`` that the response switches to
    straight from the hub (no event object, no callback round per response).
    """

    __slots__ = ("handle", "matchtag", "topic", "streaming", "done", "_responses", "_waiter",
                 "_callback")

    def __init__(self, handle: "Owner", matchtag: int, topic: str, streaming: bool) -> None:
        self.handle = handle
        self.matchtag = matchtag
        self.topic = topic
        self.streaming = streaming
        #: responses not taken yet (made by the first: none is needed with a callback)
        self._responses: Optional[deque[Response]] = None
        self._waiter: Optional[Waiter] = None
        self._callback: Optional[Callable[[Response], None]] = None
        self.done = matchtag == 0  # NORESPONSE: nothing comes

    def _put(self, response: Response) -> None:
        if not self.streaming or response.errnum:
            self.done = True
        if self._callback is not None:
            self._callback(response)
            return
        responses = self._responses
        if responses is None:
            responses = self._responses = deque()
        responses.append(response)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            _wake(waiter)

    def on_response(self, callback: Callable[[Response], None]) -> None:
        """Hand every response (those already here first) to ``callback`` on the hub
        instead of queueing it: e.g. to complete a ``concurrent.futures.Future`` that a
        thread waits on (the thread calls ``rpc`` through ``ThreadedNode.call``)."""
        self._callback = callback
        responses = self._responses
        while responses:
            callback(responses.popleft())

    def _next(self, timeout: Optional[float]) -> Response:
        while not self._responses:
            if self.done:
                raise FluxError(Errno.ENODATA, "no more responses", self.topic)
            if not _park(self, timeout):
                self.handle._abandon(self)
                raise FluxError(Errno.ETIMEDOUT, f"no response in {timeout:g} s", self.topic)
        return self._responses.popleft()

    def response(self, timeout: Optional[float] = None) -> Response:
        """The next response message (errors included, not raised)."""
        return self._next(timeout)

    def get(self, timeout: Optional[float] = None) -> Optional[bytes]:
        """The (next) response's payload; ``FluxError`` for an error response or a timeout."""
        response = self._next(timeout)
        if response.errnum:
            raise FluxError(response.errnum, error_message(response.payload), self.topic)
        return response.payload

    def get_json(self, timeout: Optional[float] = None) -> dict[str, Any]:
        """The (next) response's JSON object."""
        return _json(self.get(timeout))

    def stream(self, timeout: Optional[float] = None) -> Iterator[Optional[bytes]]:
        """Each payload of a streaming RPC until ENODATA (``timeout`` per response)."""
        while True:
            response = self._next(timeout)
            if response.errnum == Errno.ENODATA:
                return
            if response.errnum:
                raise FluxError(response.errnum, error_message(response.payload), self.topic)
            yield response.payload

    def __iter__(self) -> Iterator[Optional[bytes]]:
        return self.stream()

    def cancel(self) -> None:
        """Ask the server to end this stream (``<service>.cancel``); it ends with ENODATA."""
        if self.streaming and not self.done:
            self.handle._cancel(self)


def _wake(waiter: Waiter) -> None:
    """Resume a parked caller: at once from the hub, else from the hub's next round."""
    hub = waiter.hub
    if getcurrent() is hub:
        waiter.switch(True)
    else:
        hub.loop.run_callback(waiter.switch, True)


def _park(future: RpcFuture, timeout: Optional[float]) -> bool:
    """Wait for ``future``'s next response; False after ``timeout`` seconds."""
    hub = get_hub()
    waiter = future._waiter = Waiter(hub)
    if timeout is None:
        try:
            return bool(waiter.get())
        finally:
            future._waiter = None
    timer = hub.loop.timer(max(timeout, 0.0))
    timer.start(waiter.switch, False, update=True)
    try:
        return bool(waiter.get())
    finally:
        future._waiter = None
        timer.close()


class FluxRequest:
    """A request delivered to a handler; answer it with ``respond``, ``error`` or ``end``."""

    def __init__(self, handle: "FluxHandle", message: Request) -> None:
        self.handle = handle
        self.message = message
        self.topic = message.topic
        self.payload = message.payload
        self.streaming = bool(message.flags & _STREAMING)
        self.noresponse = bool(message.flags & _NORESPONSE)
        self.cancelled = False
        self.finished = False
        #: called (no arguments) when the client cancels this stream or goes away
        self.on_cancel: Optional[Callable[[], None]] = None

    def json(self) -> dict[str, Any]:
        """The request's JSON payload; ``FluxError`` EPROTO if it is none."""
        return _json(self.payload)

    def respond(self, payload: Payload = None) -> None:
        """Answer (one of a stream's answers, or the one answer)."""
        if self.finished:
            raise FluxStateError(f"{self.topic}: the request was answered already")
        if not self.streaming:
            self.finished = True
        self.handle._respond(self, to_payload(payload), 0)

    def error(self, errnum: int, message: str = "") -> None:
        """End with an error (ENODATA ends a stream normally)."""
        if self.finished:
            return
        self.finished = True
        self.handle._respond(self, string_payload(message) if message else None, errnum)

    def end(self) -> None:
        """End a stream normally (ENODATA)."""
        self.error(Errno.ENODATA)


class Subscription:
    """Events whose topic starts with ``prefix``: iterate, or ``get(timeout)``."""

    def __init__(self, handle: "Owner", prefix: str,
                 callback: Optional[Callable[[EventMessage], None]]) -> None:
        self.handle = handle
        self.prefix = prefix
        self.callback = callback
        self._events: deque[EventMessage] = deque()
        self._ready = gevent.event.Event()
        self.dropped = 0

    def _put(self, event: EventMessage) -> None:
        if self.callback is not None:
            try:
                self.callback(event)
            except Exception:
                log.exception("event callback for %r failed", self.prefix)
            return
        if len(self._events) >= SUBSCRIPTION_QUEUE:
            self._events.popleft()
            self.dropped += 1
        self._events.append(event)
        self._ready.set()

    def get(self, timeout: Optional[float] = None) -> Optional[EventMessage]:
        """The next event; None after ``timeout`` seconds."""
        while not self._events:
            self._ready.clear()
            if not self._ready.wait(timeout):
                return None
        return self._events.popleft()

    def __iter__(self) -> Iterator[EventMessage]:
        while True:
            event = self.get()
            if event is not None:
                yield event

    def close(self) -> None:
        """Stop receiving."""
        self.handle._unsubscribe(self)


class HandleHost(Protocol):
    """What a handle needs of the overlay that opened it (``FluxOverlay``)."""

    core: "FluxCore"
    settings: FluxSettings

    def now(self) -> float:
        """The overlay's clock."""

    def carry_out(self, outputs: list[Output]) -> None:
        """Carry out the core's ``outputs``."""

    def forget_handle(self, number: int) -> None:
        """Handle ``number`` was closed."""


class FluxHandle:
    """One client of a Flux node (see the module's docstring)."""

    def __init__(self, overlay: HandleHost) -> None:
        self.overlay = overlay
        self.number = overlay.core.open_handle()
        self._futures: dict[int, RpcFuture] = {}
        self._handlers: dict[str, Handler] = {}
        self._streams: dict[tuple[tuple[bytes, ...], int], FluxRequest] = {}
        self._subscriptions: list[Subscription] = []

    # --- client ----------------------------------------------------------------

    def rpc(self, topic: str, payload: Payload = None, nodeid: int = NODEID_ANY,
            flags: int = 0, *, streaming: bool = False) -> RpcFuture:
        """Send a request for ``topic`` to ``nodeid`` (a rank, ``NODEID_ANY`` or
        ``NODEID_UPSTREAM``); ``flags`` may add ``MsgFlag.NORESPONSE`` or ``STREAMING``."""
        if not isinstance(topic, str) or not topic:
            raise FluxStateError(f"an RPC topic is a non-empty string, not {topic!r}")
        if not isinstance(nodeid, int) or isinstance(nodeid, bool) or not 0 <= nodeid <= 0xFFFFFFFF:
            raise FluxStateError(f"nodeid {nodeid!r} is not a rank, NODEID_ANY or NODEID_UPSTREAM")
        if not isinstance(flags, int) or not 0 <= flags <= 0xFF:
            raise FluxStateError(f"flags {flags!r} are not MsgFlag bits")
        message_flags = int(flags) | (_STREAMING if streaming else 0)
        if message_flags & _NORESPONSE and message_flags & _STREAMING:
            raise FluxStateError("an RPC cannot be both NORESPONSE and STREAMING")
        core = self.overlay.core
        tag, outputs = core.rpc(self.number, topic, to_payload(payload), nodeid, message_flags,
                                self.overlay.now())
        future = RpcFuture(self, tag, topic, bool(message_flags & _STREAMING))
        if tag:
            self._futures[tag] = future
        self.overlay.carry_out(outputs)
        return future

    def publish(self, topic: str, payload: Payload = None) -> RpcFuture:
        """Publish an event (numbered by rank 0); the future answers ``{"seq": n}``."""
        if not isinstance(topic, str) or not topic:
            raise FluxStateError(f"an event topic is a non-empty string, not {topic!r}")
        tag, outputs = self.overlay.core.publish(self.number, topic, to_payload(payload),
                                                 self.overlay.now())
        future = RpcFuture(self, tag, "event.publish", False)
        self._futures[tag] = future
        self.overlay.carry_out(outputs)
        return future

    def subscribe(self, prefix: str,
                  callback: Optional[Callable[[EventMessage], None]] = None) -> Subscription:
        """Receive events whose topic starts with ``prefix`` (``""``: all), queued or
        handed to ``callback(event)`` on the hub."""
        if not isinstance(prefix, str):
            raise FluxStateError("a subscription prefix is a string")
        subscription = Subscription(self, prefix, callback)
        self._subscriptions.append(subscription)
        self.overlay.core.subscribe(self.number, prefix)
        return subscription

    def _unsubscribe(self, subscription: Subscription) -> None:
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)
        if not any(s.prefix == subscription.prefix for s in self._subscriptions):
            self.overlay.core.unsubscribe(self.number, subscription.prefix)

    def _abandon(self, future: RpcFuture) -> None:
        self.overlay.core.abandon(self.number, future.matchtag)
        future.done = True

    def _cancel(self, future: RpcFuture) -> None:
        self.overlay.carry_out(self.overlay.core.cancel(self.number, future.matchtag,
                                                        self.overlay.now()))

    # --- server ----------------------------------------------------------------

    def register(self, topic: str, handler: Handler) -> None:
        """Serve ``topic`` (``service.method``) with ``handler(request)``: its return
        value (if not None) is the answer; a ``FluxError`` it raises is an error answer."""
        self.overlay.core.register(self.number, topic)
        self._handlers[topic] = handler

    def unregister(self, topic: str) -> None:
        self.overlay.core.unregister(self.number, topic)
        self._handlers.pop(topic, None)

    def _serve(self, message: Request) -> None:
        request = FluxRequest(self, message)
        handler = self._handlers.get(message.topic)
        if handler is None:  # <service>.cancel / .disconnect not registered: end the streams
            if message.topic.endswith(".disconnect"):
                self._drop_sender(request)
            else:
                self._cancel_stream(request)
            return
        if request.streaming:
            if len(self._streams) >= self.overlay.settings.max_inflight:
                request.error(Errno.EAGAIN, "too many streams")
                return
            self._streams[(message.routes or (), message.matchtag)] = request
        try:
            result = handler(request)
        except FluxError as exc:
            request.error(exc.errnum, exc.message)
        except Exception as exc:
            log.exception("handler of %s failed", message.topic)
            request.error(Errno.EIO, f"{type(exc).__name__}: {exc}"[:200])
        else:
            if result is not None and not request.finished:
                request.respond(result)

    def _cancel_stream(self, request: FluxRequest) -> None:
        try:
            tag = request.json().get("matchtag")
        except FluxError:
            return
        stream = self._streams.get((request.message.routes or (), tag)) \
            if isinstance(tag, int) else None
        if stream is not None and service_of(stream.topic) == service_of(request.topic):
            self._end_cancelled(stream)

    def _drop_sender(self, request: FluxRequest) -> None:
        """``<service>.disconnect``: its sender is gone; end the streams of that service
        that came from it or through it (their route stacks start with its stack)."""
        routes, service = request.message.routes or (), service_of(request.topic)
        size = len(routes)
        if not size:  # (every routed request has a sender)
            return
        for (stream_routes, _), stream in list(self._streams.items()):
            if stream_routes[:size] == routes and service_of(stream.topic) == service:
                self._end_cancelled(stream)

    def _end_cancelled(self, stream: FluxRequest) -> None:
        stream.cancelled = True
        if stream.on_cancel is not None:
            try:
                stream.on_cancel()
            except Exception:
                log.exception("cancel callback of %s failed", stream.topic)
        stream.end()

    def _respond(self, request: FluxRequest, payload: Optional[bytes], errnum: int) -> None:
        message = request.message
        if request.streaming and (errnum or request.finished):
            self._streams.pop((message.routes or (), message.matchtag), None)
        self.overlay.carry_out(self.overlay.core.respond(self.number, message, payload,
                                                         errnum, self.overlay.now()))

    # --- from the driver ----------------------------------------------------------

    def _deliver(self, message: Any) -> None:
        kind = type(message)
        if kind is Response:
            future = self._futures.get(message.matchtag)
            if future is None:
                return
            if not future.streaming or message.errnum:
                del self._futures[message.matchtag]
            future._put(message)
        elif kind is Request:
            self._serve(message)
        elif kind is EventMessage:
            for subscription in list(self._subscriptions):
                if message.topic.startswith(subscription.prefix):
                    subscription._put(message)

    def _fail_all(self, why: str) -> None:
        """Answer every pending future with EHOSTUNREACH (the node stopped)."""
        futures, self._futures = self._futures, {}
        for tag, future in futures.items():
            future._put(Response(future.topic, string_payload(why), Errno.EHOSTUNREACH, tag))

    def close(self) -> None:
        """Stop serving and subscribing; pending RPCs fail."""
        self._fail_all("the handle was closed")
        self.overlay.core.close_handle(self.number)
        self.overlay.forget_handle(self.number)
