"""Plain pyzmq sockets driven on the gevent hub: where every peermesh socket is made and run.

How it works
------------
``zmq.green`` makes every send and receive cooperative and costs 4-6x the
CPU per message. Here sockets stay plain: messages are sent and received
without waiting, and only when a socket has nothing to give (or no room) does
anyone wait, on its ``zmq.FD`` through the hub.

That descriptor is edge-triggered and only says "the socket's command queue
changed": any call on the socket (a send, or asking ``EVENTS``) may take in
the command that announced a message, and then the descriptor never wakes
the hub for it (pyzmq issue 319). So every read ends only when the socket is
found empty (which re-arms the edge), ``EVENTS`` is checked before every
wait, a send on a socket someone reads checks ``EVENTS`` afterwards and wakes
the reader when a message waits (or its caller does, once after several sends:
``try_send(frames, look=False)``, then ``readable()``), and every wait is
bounded by one guard timer (``GUARD``) against an edge missed all the same.

Reading has two shapes. ``serve`` drains on the hub itself, from the
descriptor's watcher callback, without a greenlet switch per wake-up: for
handlers that never wait (a node's mailbox, Safir-Darbaan, the Spark log
server). ``recv_batch`` and ``wait_readable`` serve a reader greenlet whose
handlers may wait (NFP). Either way messages come in batches: one call of the
C extension (``zmqbatch.native``) reads every waiting message, or pyzmq does
the same frame by frame; and a message is sent whole in one call. The choice
between the two is made in ``zmqbatch``, once, when a socket is wrapped.

Kept whole: one class (``HubSocket``) whose reads, sends and waits share the edge-
triggered ``zmq.FD`` bookkeeping described above; splitting it would split that
invariant.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from functools import partial
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol, Sequence, Union

import gevent
import gevent.event
import zmq
from greenlet import getcurrent

from ..counters import REPORT_PERIOD, Counters
from . import zmqbatch
from .context import shared_context

__all__ = ["HubSocket", "make_socket", "is_closed", "GUARD", "BATCH", "KEY_AND_FD"]

log = logging.getLogger(__name__)

#: messages whose handler raised, in this process (a bug, maybe one a remote sender can
#: trigger at will): the first traceback each ``REPORT_PERIOD`` seconds is logged, the
#: rest only counted here (one line per period)
HANDLER_FAILURES = Counters(log, "message handlers failed")
_traceback_due = [0.0]   # when the next traceback may be logged (monotonic)


def _handler_failed(first: bytes, exc: Exception) -> None:
    """Log a message handler's exception (the traceback at most once a period)."""
    now = time.monotonic()
    if now >= _traceback_due[0]:
        _traceback_due[0] = now + REPORT_PERIOD
        log.error("handling a message from %r failed", first[:32], exc_info=exc)
    HANDLER_FAILURES.over("handler_failures", f"from {first[:32]!r}: "
                          f"{type(exc).__name__}: {exc}"[:200], now)

#: seconds a wait trusts the edge-triggered descriptor alone before it looks anyway
GUARD = 5.0
#: messages handled before a reader lets other greenlets run
BATCH = 256

# plain ints: zmq's flag enums make every ``&`` a Python-level call
_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)
_EVENTS = int(zmq.EVENTS)
_Backend: Any = zmq.backend.Socket  # the Cython socket under pyzmq's Python layer
_backend_send: Callable[..., Any] = _Backend.send
_backend_get: Callable[[zmq.Socket, int], int] = _Backend.get
#: whether a socket was closed (by its owner or ``Context.destroy``): pyzmq's flag, read
#: past ``zmq.Socket.__getattr__`` (``Socket.closed`` also asks libzmq: far dearer)
is_closed: Callable[[zmq.Socket], bool] = _Backend.__dict__["_closed"].__get__

#: on_message(first frame, the other frames) or, with ``metadata``, (first, rest, value)
MessageHandler = Callable[..., None]


class SocketSecurity(Protocol):
    """What ``make_socket`` needs of ``peermesh.io.curve.Curve`` (which needs ``HubSocket``
    for its ZAP responder: a protocol, not an import, keeps the two apart)."""

    def options(self, context: zmq.Context,
                server_key: Optional[bytes] = None) -> dict[int, Union[int, bytes]]:
        """The socket options of a CURVE client of ``server_key``, or of a server."""


def make_socket(kind: int, options: Mapping[int, Union[int, bytes]] = {},
                context: Optional[zmq.Context] = None, *, curve: Optional[SocketSecurity] = None,
                server_key: Optional[bytes] = None) -> zmq.Socket:
    """A plain ZeroMQ socket of ``kind`` from ``context`` (default: ``shared_context()``).

    Every peermesh socket is made here: ``LINGER`` 0 unless ``options``
    (``{zmq.OPTION: value}``, applied in order) say otherwise. With ``curve``
    (``peermesh.io.curve.Curve``) the socket speaks CURVE: as the client of
    the peer whose public key is ``server_key``, or without it as a server
    admitting the keys of ``curve``'s allowlist (see ``peermesh.io.zap``).
    """
    context = context or shared_context()
    secure = curve.options(context, server_key) if curve is not None else {}
    sock = context.socket(kind)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        for option, value in {**secure, **options}.items():
            sock.setsockopt(option, value)
    except BaseException:
        sock.close(linger=0)
        raise
    return sock


def _pyzmq_send(sock: zmq.Socket, frames: Sequence[bytes]) -> bool:
    """Send one message through pyzmq a frame at a time; False when it cannot take it now."""
    send = _backend_send
    last = len(frames) - 1
    try:
        send(sock, frames[0], _MORE if last else _NOBLOCK)
    except zmq.Again:
        return False
    # Once the first frame is taken, ZeroMQ takes the whole message.
    for i in range(1, last):
        send(sock, frames[i], _MORE)
    if last:
        send(sock, frames[last], _NOBLOCK)
    return True


def _pyzmq_send_each(sock: zmq.Socket, messages: Iterable[Sequence[bytes]]) -> int:
    """``_pyzmq_send`` each of ``messages`` in order until one cannot go; how many went."""
    done = 0
    for frames in messages:
        if not _pyzmq_send(sock, frames):
            break
        done += 1
    return done


class HubSocket:
    """A plain pyzmq socket read, written and waited on cooperatively on one gevent hub.

    ``limit`` (bytes) and ``max_frames`` bound the frames after the first of
    a message read: a message over either is read to its end and reported to
    ``on_oversized`` (``serve``) or as ``None`` frames (``recv_batch``).
    The hub is the one of the thread that first waits or serves.
    """

    __slots__ = ("socket", "endpoint", "limit", "max_frames", "closed", "_target", "_send",
                 "_send_each", "_events", "_batch", "_recv", "_readable", "_hub", "_io", "_guard",
                 "_parked", "_reading", "_touched", "_serving", "_paused", "_scheduled",
                 "_draining", "_drain", "_drainer", "_done", "_unread", "_box")

    def __init__(self, sock: zmq.Socket, *, endpoint: str = "", limit: Optional[int] = None,
                 max_frames: Optional[int] = None) -> None:
        self.socket = sock
        #: where the socket was bound (``LAST_ENDPOINT``), if it was
        self.endpoint = endpoint
        self.limit = sys.maxsize if limit is None else limit
        self.max_frames = -1 if max_frames is None else max_frames
        self.closed = False
        native = zmqbatch.native
        if native is not None:
            self._target: Any = sock.underlying  # 0 once closed: the extension raises ENOTSOCK
            self._send: Callable[[Any, Sequence[bytes]], bool] = native.send
            self._send_each: Callable[[Any, Iterable[Sequence[bytes]]], int] = native.send_each
            self._events: Callable[[Any], int] = native.events
            self._batch: Callable[..., list] = partial(native.recv_batch, self._target)
        else:
            self._target = sock
            self._send = _pyzmq_send
            self._send_each = _pyzmq_send_each
            self._events = _pyzmq_events
            self._batch = self._pyzmq_batch
        self._recv = _Backend.recv.__get__(sock)
        # zmq_poll with no wait: like reading EVENTS it takes the socket's commands in
        # (re-arming the edge), and costs less from Python
        self._readable = partial(zmq.zmq_poll, [(sock, _POLLIN)], 0)
        self._hub: Any = None
        self._io: Any = None
        self._guard: Any = None
        # greenlets waiting in wait_readable / wait_writable (a deque: going from one to
        # none and back, as a reader does per wake-up, allocates nothing)
        self._parked: deque[Any] = deque()
        self._reading = 0  # how many of them wait to read (the others wait for room)
        self._touched = False  # the socket was used since ``read`` found it empty
        self._serving: Optional[MessageHandler] = None
        self._paused = False  # serving, but reading paused by backpressure
        self._scheduled = False
        self._draining = False
        self._drain: Optional[Callable[[], bool]] = None  # one batch of ``serve``
        self._drainer: Optional[Callable[[], None]] = None  # ``serve``'s watcher callback
        self._done: Optional[gevent.event.Event] = None
        self._unread = False  # a ``numbered_sender`` was handed out: never to be read
        #: the handle as a ``numbered_sender`` reads it per call (0 once closed)
        self._box: Optional[list[int]] = None

    @property
    def port(self) -> int:
        """The TCP port of ``endpoint`` (0 when not bound to one)."""
        _, _, port = self.endpoint.rpartition(":")
        return int(port) if port.isdigit() else 0

    # --- sending ------------------------------------------------------------

    def try_send(self, frames: Sequence[bytes], look: bool = True) -> bool:
        """Send ``frames`` as one message now; False (nothing sent) when it cannot take it.

        Other errors (a ROUTER_MANDATORY peer unknown, the socket closed:
        ENOTSOCK) raise ``zmq.ZMQError``; nothing is ever half-sent. A send
        may take in the edge of a message waiting, so the socket is looked at
        afterwards; with ``look`` False the caller calls ``readable()`` itself
        (once after several sends, say).
        """
        self._touched = True
        target = self._target
        if not self._send(target, frames):
            return False
        if look and (self._serving is not None or self._reading):
            # the send may have taken in the command that announced a message: look now
            try:
                ready = self._events(target) & _POLLIN
            except zmq.ZMQError:
                return True
            if ready:
                self._wake_readers()
        return True

    def try_send_each(self, messages: Iterable[Sequence[bytes]]) -> int:
        """``try_send`` each of ``messages`` in order until one cannot go; how many went.
        One call of the C extension sends them all (a backlog flushed costs no Python
        per message)."""
        self._touched = True
        done = self._send_each(self._target, messages)
        if done and (self._serving is not None or self._reading):
            self._after_send()
        return done

    def numbered_sender(self) -> Optional[Callable[[bytes, int, Sequence[bytes]], bool]]:
        """``send(head, sequence, frames)``: ``try_send((head', *frames))`` in one C call,
        ``head'`` being ``head`` with ``sequence`` written into its octets 4 and 5 (a ZRE
        command's header, built in the call); None without the C extension.

        For a socket that is only sent on: such a send does not look for the edge of a
        message it may take in, so once one is handed out the socket cannot be read
        (``serve``, ``read`` and ``wait_readable`` raise RuntimeError). A closed socket
        raises ``zmq.ZMQError`` (ENOTSOCK), as ``try_send`` does."""
        native = zmqbatch.native
        if native is None:
            return None
        if self._serving is not None or self._reading:
            raise RuntimeError("the socket is read: its sends must look (try_send)")
        self._unread = True
        if self._box is None:
            self._box = [0 if self.closed else self._target]
        return partial(native.send_numbered, self._box)

    def _check_readable(self) -> None:
        if self._unread:
            raise RuntimeError("the socket is sent on through numbered_sender: it is never read")

    def _after_send(self) -> None:
        # the send may have taken in the command that announced a message: look now
        try:
            ready = self._events(self._target) & _POLLIN
        except zmq.ZMQError:
            return
        if ready:
            self._wake_readers()

    # --- looking and waiting --------------------------------------------------

    def events(self) -> int:
        """The socket's ``EVENTS`` (POLLIN | POLLOUT); ENOTSOCK once it is closed."""
        if self.closed or is_closed(self.socket):  # also behind our back: never a freed handle
            raise zmq.ZMQError(zmq.ENOTSOCK)
        self._touched = True
        return self._events(self._target)

    def readable(self) -> bool:
        """True when a message waits unread; then its reader is told (asking may have
        taken in the edge it waits for)."""
        try:
            ready = self.events() & _POLLIN
        except zmq.ZMQError:
            return False
        if ready:
            self._wake_readers()
        return bool(ready)

    def _wake_readers(self) -> None:
        loop = self._loop()
        if self._serving is not None and not self._scheduled and not self._draining:
            self._scheduled = True
            loop.run_callback(self._run_drain)
        if self._parked:
            loop.run_callback(self._resume_all)

    def wait_readable(self, timeout: Optional[float] = None) -> bool:
        """Wait until a message waits; False after ``timeout`` seconds or once closed."""
        self._check_readable()
        return self._wait(_POLLIN, timeout)

    def wait_writable(self, timeout: Optional[float] = None) -> bool:
        """Wait until a message may be sent; False after ``timeout`` seconds or once closed."""
        return self._wait(_POLLOUT, timeout)

    def _wait(self, flag: int, timeout: Optional[float]) -> bool:
        loop = self._loop()
        deadline = None
        if timeout is not None:
            loop.update_now()  # (the hub's clock is as old as its last round)
            deadline = loop.now() + timeout
        me = getcurrent()
        while not self.closed:
            try:
                if self.events() & flag:
                    return True
            except zmq.ZMQError:
                return False
            seconds = None
            if deadline is not None:
                seconds = deadline - loop.now()
                if seconds <= 0:
                    return False
            self._park(me, seconds, flag == _POLLIN)
        return False

    def _park(self, me: Any, seconds: Optional[float], reading: bool) -> None:
        """Wait on the hub for the descriptor's edge, the guard timer, a wake-up or
        ``seconds`` (``reading``: for a message, else for room)."""
        parked = self._parked
        parked.append(me)
        self._reading += reading
        io = self._io
        if not io.active:
            io.start(self._on_edge)
            self._guard.again(self._on_guard, update=True)
        timer = None
        if seconds is not None and seconds < GUARD:
            timer = self._hub.loop.timer(seconds)
            timer.start(self._resume, me, update=True)
        try:
            self._hub.switch()
        finally:
            self._reading -= reading
            if me in parked:  # still there after a timeout or a kill
                parked.remove(me)
            if not parked and self._drainer is None and self._io is not None:
                io.stop()  # a reader busy in a handler must not leave it signalling: no spin
                self._guard.stop()
            else:
                self._watch()
            if timer is not None:
                timer.close()

    def _resume_all(self) -> None:
        # on the hub (a watcher, the guard or a callback): let every waiter look again
        parked = self._parked
        if len(parked) == 1:
            parked.pop().switch()
            return
        waiting = list(parked)
        parked.clear()
        for greenlet in waiting:
            greenlet.switch()

    def _resume(self, greenlet: Any) -> None:
        if greenlet in self._parked:
            self._parked.remove(greenlet)
            greenlet.switch()

    def _watch(self) -> None:
        """Watch the descriptor (and run the guard) while anyone serves or waits."""
        io = self._io
        if io is None:
            return
        if self._parked or (self._serving is not None and not self._paused):
            if not io.active:
                io.start(self._on_edge)
                self._guard.again(self._on_guard, update=True)
        elif io.active:
            io.stop()
            self._guard.stop()

    def _on_edge(self) -> None:
        # on the hub: the descriptor signalled
        if self._drainer is not None and not self._paused:
            self._drainer()
        parked = self._parked
        if parked:
            if len(parked) == 1:
                parked.pop().switch()  # the usual case: one reader
            else:
                self._resume_all()

    def _on_guard(self) -> None:
        # on the hub, every GUARD seconds while watched: look, in case an edge was missed
        if self._parked:
            self._resume_all()
        if self._drainer is not None and not self._paused:
            self.readable()  # schedules the drain when a message waits

    def _loop(self) -> Any:
        if self._hub is None:
            hub = self._hub = gevent.get_hub()
            self._io = hub.loop.io(self.socket.getsockopt(zmq.FD), 1)
            self._guard = hub.loop.timer(GUARD, GUARD)
        return self._hub.loop

    # --- reading --------------------------------------------------------------

    def recv_batch(self, count: int = BATCH, metadata: Optional[str] = None) -> list:
        """Up to ``count`` waiting messages, without waiting: ``(first, rest)`` each,
        ``rest`` None for a message over the limits; with ``metadata`` (a message
        property such as ``"Peer-Address"``) ``(first, rest, value)``. Fewer than
        ``count`` means the socket was found empty (its edge re-armed)."""
        if self.closed or is_closed(self.socket):
            raise zmq.ZMQError(zmq.ENOTSOCK)
        return self._batch(count, self.limit, self.max_frames, metadata)

    def _pyzmq_batch(self, count: int, limit: int, max_frames: int,
                     name: Optional[str], routes: Optional[dict[int, bytes]] = None) -> list:
        """``recv_batch`` through pyzmq: the C extension's reader, frame by frame (with
        ``routes``, each message's first frame is stored there under the descriptor of
        the connection it came by)."""
        recv = self._recv
        readable = self._readable
        if max_frames < 0:
            max_frames = sys.maxsize
        batch: list = []
        append = batch.append
        for i in range(count):
            # The first read goes ahead unasked: a wake-up nearly always means a message
            # (an empty socket costs a zmq.Again then, and is re-armed too).
            if i and not readable():
                break  # empty, and the edge is re-armed
            try:
                frame = recv(_NOBLOCK, False)
            except zmq.Again:
                break
            first = frame.bytes
            rest: Optional[list[bytes]] = []
            room = limit
            while frame.more:  # Frame.more: far cheaper than getsockopt(RCVMORE)
                frame = recv(_NOBLOCK, False)
                if rest is not None:
                    data = frame.bytes
                    room -= len(data)
                    if room < 0 or len(rest) >= max_frames:
                        rest = None  # read to its end, dropped
                    else:
                        rest.append(data)
            if routes is not None:
                try:
                    fd = int(frame.get(_SRCFD))
                except zmq.ZMQError:
                    fd = -1
                if fd >= 0 and routes.get(fd) != first:
                    routes[fd] = first
            if name is None:
                append((first, rest))
            else:
                append((first, rest, _property(frame, name)))
        return batch

    def wrap_reader(self, wrap: Callable[[Callable[..., list]], Callable[..., list]]) -> None:
        """Read every batch through ``wrap(reader)``, a function of the same arguments as
        ``recv_batch``'s reader (``count, limit, max_frames, metadata``) that must still
        return fewer than ``count`` messages only once the socket is found empty. Before
        anyone serves or reads (a ``GuardedListener`` drops what revoked keys sent)."""
        if self._serving is not None or self._reading:
            raise RuntimeError("the socket is already read")
        self._batch = wrap(self._batch)

    def read(self, on_batch: Callable[[list], None], metadata: Optional[str] = None) -> None:
        """Hand every batch of messages (as ``recv_batch`` gives them, with ``metadata``
        too) to ``on_batch``, in the calling greenlet, until the socket is closed;
        ``on_batch`` may wait.

        Between batches the reader waits on the hub. It waits at once after a
        batch that found the socket empty (which re-armed the edge), unless
        the socket was used since (a send, or ``EVENTS`` asked, may have taken
        the edge in): then it looks again first.
        """
        self._check_readable()
        sock = self.socket
        batch_of = self._batch
        limit, max_frames = self.limit, self.max_frames
        park = self._park
        me = getcurrent()
        self._loop()
        if self.closed or is_closed(sock):
            return
        while True:
            self._touched = False
            try:
                batch = batch_of(BATCH, limit, max_frames, metadata)
            except zmq.ZMQError as exc:
                if self.closed or exc.errno == zmq.ENOTSOCK:
                    return
                raise
            if batch:
                on_batch(batch)
                if self.closed:
                    return
                if len(batch) == BATCH:
                    gevent.idle()  # more may wait: what else is ready (I/O too) runs first
                    continue
            if not self._touched:
                park(me, None, True)
                if self.closed or is_closed(sock):  # (also behind our back)
                    return

    #: ``serve`` takes ``take`` (``Driver`` asks before handing it one)
    takes_batches = True

    def serve(self, on_message: MessageHandler,
              on_oversized: Optional[Callable[[bytes], None]] = None,
              backpressure: Any = None, *, metadata: Optional[str] = None,
              after_batch: Optional[Callable[[], None]] = None,
              take: Optional[Callable[[list, int], int]] = None) -> None:
        """Call ``on_message(first, rest)`` on the hub for every message until closed.

        Messages are drained from the descriptor's watcher callback, so
        handlers must not wait. A message over the limits goes to
        ``on_oversized(first)``; with ``metadata``, ``on_message`` gets that
        property as a third argument. ``backpressure`` (a queue with
        ``full()``, ``wait_room()``, ``hold()``, ``release()``): ``full()`` is
        asked before and after each batch; while it is true, reading pauses
        until ``wait_room()`` returns (then it is asked again), and each batch is
        bracketed by ``hold()``/``release()`` (its reader wakes once per
        batch). ``after_batch()`` is called once the handlers of a batch have
        run. A handler's exception is logged, never fatal. Returns once the
        socket is closed (or the calling greenlet is killed).

        ``take(batch, start)`` (without ``metadata``): a fast path handed the whole
        batch, from index ``start`` on, that handles messages for as long as it can and
        returns the index of the first one it did not (``len(batch)``: all); that one
        goes to ``on_message`` (or ``on_oversized``) and ``take`` goes on after it. An
        exception from ``take`` is logged as the failure of the message at ``start``,
        and the batch goes on after that message.
        """
        if self._serving is not None or self.closed:
            raise RuntimeError("the socket is already served or closed")
        self._check_readable()
        loop = self._loop()
        sock = self.socket
        batch_of = self._batch
        limit, max_frames = self.limit, self.max_frames
        full: Optional[Callable[[], bool]] = None
        hold: Callable[[], None] = _nothing
        release: Callable[[], None] = _nothing
        if backpressure is not None:
            full, hold, release = backpressure.full, backpressure.hold, backpressure.release
        resuming: list[gevent.Greenlet] = []
        done = self._done = gevent.event.Event()

        def drain_batch() -> bool:
            """Read and hand on one batch; True when it was full (more may wait)."""
            if self._serving is not on_message or is_closed(sock):
                return False
            self._draining = True
            try:
                batch = batch_of(BATCH, limit, max_frames, metadata)
            except zmq.ZMQError as exc:  # closed under us
                log.debug("reading stopped: %s", exc)
                return False
            finally:
                self._draining = False
            try:
                if take is not None and metadata is None:
                    at, end = 0, len(batch)
                    while at < end:
                        if self.closed:
                            return False
                        try:
                            at = take(batch, at)
                        except Exception as exc:  # a bug must not stop the reader
                            _handler_failed(batch[at][0], exc)
                            at += 1
                            continue
                        if at >= end:
                            break
                        first, rest = batch[at]
                        at += 1
                        try:
                            if rest is not None:
                                on_message(first, rest)
                            elif on_oversized is not None:
                                on_oversized(first)
                        except Exception as exc:
                            _handler_failed(first, exc)
                elif metadata is None:
                    for first, rest in batch:
                        if self.closed:  # a handler closed the socket
                            return False
                        try:
                            if rest is not None:
                                on_message(first, rest)
                            elif on_oversized is not None:
                                on_oversized(first)
                        except Exception as exc:  # a bug must not stop the reader
                            _handler_failed(first, exc)
                else:
                    for first, rest, value in batch:
                        if self.closed:
                            return False
                        try:
                            if rest is not None:
                                on_message(first, rest, value)
                            elif on_oversized is not None:
                                on_oversized(first)
                        except Exception as exc:
                            _handler_failed(first, exc)
                return len(batch) == BATCH
            finally:
                if after_batch is not None and batch:
                    try:
                        after_batch()
                    except Exception:
                        log.exception("finishing a batch failed")

        def drain() -> None:
            self._scheduled = False
            if self._serving is not on_message or self._draining or self._paused:
                return
            if full is not None:
                if full():
                    pause()
                    return
                hold()
                try:
                    more = drain_batch()
                finally:
                    release()  # wake the reader once per batch
                if full():  # (also with nothing more to read: what waits must get in)
                    pause()
                    return
            else:
                more = drain_batch()
            if more and not self._scheduled:
                self._scheduled = True
                loop.run_callback(drain)  # more may wait: let others run first

        def pause() -> None:
            self._paused = True
            self._watch()
            resuming.append(gevent.spawn(resume))

        def resume() -> None:
            backpressure.wait_room()
            resuming.clear()
            self._paused = False
            if self._serving is on_message:
                self._watch()
                drain()

        self._serving = on_message
        self._drain = drain_batch
        self._drainer = drain
        self._watch()
        self._scheduled = True
        loop.run_callback(drain)  # messages may already wait
        try:
            done.wait()
        finally:
            if self._serving is on_message:
                self._serving = None
            self._drain = self._drainer = None
            self._paused = False
            self._watch()
            gevent.killall(resuming)

    def _run_drain(self) -> None:
        self._scheduled = False
        drainer = self._drainer
        if drainer is not None:
            drainer()

    def drain(self, batches: int = 16) -> None:
        """Handle what ``serve`` would read now (up to ``batches`` batches), here and at
        once: for decisions that must not overlook a message already received. Does
        nothing from inside a handler."""
        drain_batch = self._drain
        for _ in range(batches):
            if drain_batch is None or self._draining or not drain_batch():
                return

    # --- closing --------------------------------------------------------------

    def close(self, linger: float = 0.0) -> None:
        """Stop serving, wake every waiter (they return False) and close the socket;
        ZeroMQ may go on sending what it holds for ``linger`` seconds."""
        if self.closed:
            return
        self.closed = True
        self._serving = None
        self._drain = self._drainer = None
        if self._done is not None:
            self._done.set()
        if self._hub is not None:
            if self._parked:
                self._hub.loop.run_callback(self._resume_all)
            self._io.stop()
            self._io.close()
            self._guard.stop()
            self._guard.close()
            self._io = self._guard = None
        if self._target is not self.socket:
            self._target = 0
        if self._box is not None:
            self._box[0] = 0
        self.socket.close(linger=int(linger * 1000))

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<HubSocket {self.endpoint or self.socket.type!r}{state}>"


def _nothing() -> None:
    pass


def _pyzmq_events(sock: zmq.Socket) -> int:
    return _backend_get(sock, _EVENTS)


#: the pseudo-property read as (the message's "User-Id", the descriptor of the connection
#: it came by, its "Peer-Address"): what a ``GuardedListener`` needs to close a revoked
#: key's connections
KEY_AND_FD = "User-Id+fd"
_SRCFD = 2  # ZMQ_SRCFD: the descriptor a message was read from


def _property(frame: zmq.Frame, name: str) -> Any:
    if name == KEY_AND_FD:
        try:
            fd = int(frame.get(_SRCFD))
        except zmq.ZMQError:
            fd = -1
        return _property(frame, "User-Id"), fd, _property(frame, "Peer-Address")
    try:
        value = frame.get(name)
    except (zmq.ZMQError, UnicodeDecodeError):
        return None
    return value if isinstance(value, str) else None
