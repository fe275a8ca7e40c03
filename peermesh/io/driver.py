"""The one driver: serves a sans-io core (``peermesh.core``) over a ``Transport``.

How it works
------------
::

     mailbox / links (Transport)           Driver                     core
    ───────────────────────────── ───────────────────────── ───────────────────────
     batch of messages   ───────▶ receive(link, frames, now) ─▶ state machine
                                  outputs held for the batch ◀─ [Send, Deliver, ...]
     try_send (corked) ◀───────── apply after the batch
     transport.sleep ──────────▶ handle_timer(now)          ─▶ next_deadline()

* **Reading.** ``listen(mailbox)`` and every link the core dials are served
  in batches (``serve`` with ``after_batch``: on ZeroMQ one ``recv_batch`` of
  ``peermesh.io.zmqbatch``); each message becomes ``core.receive(link,
  frames, transport.now())``. A mailbox names a message's link by the
  sender's routing identity; a dialled link by the name the core gave it.
* **Outputs.** What the core returns while a batch is handled is held and
  applied once the batch is done (corked: the sends of one batch go out back
  to back). ``Send`` goes down the dialled link of that name, else back
  through the mailbox to that identity; ``Dial``/``Hangup`` open and close
  links through the transport; ``Deliver`` and ``Emit`` go to the owner's
  ``on_deliver`` and ``on_event``.
* **Time.** One timer greenlet sleeps on the transport's clock
  (``transport.sleep``) until ``core.next_deadline()`` and then calls
  ``handle_timer``; a core that names an earlier deadline re-arms it.
  Deadlines that crowd are served together, at most ``SLACK`` late (a core
  with a deadline per request costs a wake-up per ``SLACK``, not per request). On
  ``peermesh.sim`` this is virtual time, so a core's 30-second timeout costs
  nothing.
* **Full queues.** A send refused because a link's queue is full waits, with
  every later message of that link, in a per-link backlog that one greenlet
  sends once there is room; what has not left within ``send_timeout`` is
  dropped and logged (the core's own timeouts answer for it).

Two options serve a core that wants to know of its failures: ``on_send_failed(link,
frames, error)`` is told of a send with no way out (the link gone, a mailbox peer
unreachable) instead of only dropping it, and ``on_oversized(first)`` of a message over
the limits read and dropped (its first frame: on a mailbox, the sender's identity).

Two more serve a core fed from elsewhere too: ``on_batch_end(now)`` is called after
each batch read (its outputs applied after the batch's: a core that commits once per
batch, as the MTL gateway's), and ``feed(messages)`` hands the core messages that
did not come through the transport (a node's events) as one batch.

Options for a core that addresses its mailbox peers itself (Flux): ``addressed``
(a ``Send`` to a mailbox peer carries that peer's identity as its first frame, the
ROUTER's address, and goes out as it is; with ``look_once``, a batch whose outputs are all
such sends, or all sends down one link that has ``try_send_each``, goes out in one
``try_send_each`` call), ``accept(identity)`` (a mailbox message
whose sender it refuses goes to ``on_oversized``, never to the core), ``look_once``
(real sockets only: the sends of a batch do not each look at their socket for a
message waiting; each socket sent on is looked at once when the batch is done),
``sndhwm`` (the queue of a dialled link) and ``batch_clock`` (the messages of a batch,
on the mailbox and on every link, are stamped with one clock reading and counted once).

Options for a core whose owner handles most of its traffic itself (a ZRE node):
``delivery(link, frames, now)``, a per-message fast path tried first, returns an item
that goes straight to ``on_deliver`` (or None: ``receive`` the message) and leaves the
core's ``next_deadline`` as it was (with ``carry_out``, a batch that only ``delivery``
took does not re-arm the timer);
``carry_out(outputs)`` takes the core's outputs instead of the driver, as soon as each
message or timer returns them (a core that needs an answer before it is fed again:
ZRE's ``Dial``, answered by ``attach``); ``on_timer(now)`` runs just before each
``handle_timer(now)`` (the owner's own checks); ``clock`` replaces the transport's
clock (sleeps stay the transport's); ``delivery_each(batch, start, now, sink)`` is
``delivery`` over a batch read, from index ``start`` on, each item to ``sink``, returning
the index of the first message it did not take (one call per batch, not per message;
used on a mailbox whose ``serve`` takes batches, ``takes_batches``, without ``metadata``
or ``accept``). ``pass_each(link, batch, start, now, looking, flush)`` (with
``batch_clock``, ``delivery`` or ``carry_out``) is a core's own fast path over a batch
read on the mailbox (``link`` None; each item ``(sender identity, frames)``; it checks
``accept`` itself) or on a dialled link (its name; each item ``(first frame, other
frames)``), that routes messages itself from index ``start`` on, each sending exactly one
message on the mailbox or a link and returning no outputs, notes in the list ``looking``
each socket it sent on (once), and returns the index of the first one it did not take
(that one goes to ``receive``); it is tried only while no backlog waits, and each socket
noted is looked at once after the batch. ``flush`` is None, or (outputs of the batch's
earlier messages held) what it calls before its first send: they are carried out then
(order is kept), and it returns False when sending must wait (a backlog, or closed).
With ``delivery`` or ``carry_out`` a mailbox's messages are stamped with one clock
reading per batch. ``listen`` takes ``admit`` (with ``metadata``: a CURVE key gate
checked inline) and ``replies=False`` (nothing is
ever sent back through the mailbox).

The owner may also call ``apply(outputs)`` with what a core method called from
outside returned (an NFP ``post``, say; with ``look_now=False`` each socket sent on is
looked at once at the end of the hub's turn), ``apply_all(outputs)`` with outputs it
gathered from several such calls (sent as a batch's are: one look at each socket),
``cork(outputs)`` to have them gathered for it (carried out together at the end of
the hub's turn, or once ``cork_limit`` sends to one link wait), ``replace_core(core)``
to serve another core on the same sockets, and ``close()`` ends it all.

Kept whole: one driver (``Driver``): its reading, its sending and its timer act on the
same state (one batch's held outputs and clock reading, the links and their backlogs, the
sockets to look at once, the armed deadline); split, each would reach into the others'.
"""

from __future__ import annotations

import logging
from collections import deque
from operator import length_hint
from typing import Any, Callable, Hashable, Iterable, Optional, Sequence

import gevent
import gevent.event
import zmq

from ..core import Core, Deliver, Dial, Emit, Hangup, Output, Send
from .transport import Link, Mailbox, Transport

__all__ = ["Driver"]

log = logging.getLogger(__name__)

#: messages a link's queue holds before a send waits (its ZeroMQ SNDHWM: libzmq's default)
SNDHWM = 1_000
#: seconds the timer waits at least between two runs when deadlines crowd (a core with a
#: deadline per request is served a batch of them at a time, not one wake-up each)
SLACK = 0.01


class Driver:
    """Serves ``core`` over ``transport``: reads, timer, outputs (see the module docstring)."""

    def __init__(self, core: Core, transport: Transport, *,
                 on_deliver: Optional[Callable[[Any], None]] = None,
                 on_event: Optional[Callable[[Any], None]] = None,
                 send_timeout: float = 5.0, max_message: Optional[int] = None,
                 name: str = "driver",
                 on_send_failed: Optional[Callable[[Hashable, Sequence[bytes],
                                                    BaseException], None]] = None,
                 on_oversized: Optional[Callable[[bytes], None]] = None,
                 on_batch_end: Optional[Callable[[float], Sequence[Output]]] = None,
                 addressed: bool = False, accept: Optional[Callable[[bytes], bool]] = None,
                 look_once: bool = False, sndhwm: int = SNDHWM,
                 delivery: Optional[Callable[[Hashable, list[bytes], float], Any]] = None,
                 carry_out: Optional[Callable[[Sequence[Output]], None]] = None,
                 on_timer: Optional[Callable[[float], None]] = None,
                 clock: Optional[Callable[[], float]] = None,
                 cork_limit: Optional[int] = None, batch_clock: bool = False,
                 delivery_each: Optional[Callable[[Sequence[tuple[Hashable, Any]], int, float,
                                                   Callable[[Any], None]], int]] = None,
                 pass_each: Optional[Callable[[Optional[Hashable], list, int, float,
                                               list[Any], Optional[Callable[[], bool]]],
                                              int]] = None
                 ) -> None:
        self.core = core
        #: one clock reading and one count per batch read, on the mailbox and every link
        #: (the per-message path of ``delivery``/``carry_out`` without them)
        self.batch_clock = batch_clock
        #: the per-message fast path of the mailbox (the module docstring)
        self.delivery = delivery
        #: ``delivery`` over a whole batch read (the module docstring)
        self.delivery_each = delivery_each
        #: a core's own fast path over a batch read, sends included (the module docstring)
        self.pass_each = pass_each
        self.carry_out = carry_out
        self.on_timer = on_timer
        self.on_batch_end = on_batch_end
        self.addressed = addressed
        self.accept = accept
        self.look_once = look_once
        self.sndhwm = sndhwm
        self._looking: Optional[list[Any]] = None   # sockets sent on in this batch
        self._later: Optional[list[Any]] = None     # ... in this turn, to be looked at after it
        #: sends to one link ``cork`` holds at most (the one that makes them this many
        #: carries out all it holds: that far end gets work sooner, at the cost of more
        #: sends and wake-ups, and one of several far ends still gets its whole share of
        #: the turn at once); None: all of the turn's
        self.cork_limit = cork_limit
        #: outputs ``cork`` holds for the end of the hub's turn
        self.corked: list[Output] = []
        self._corked_sends: dict[Hashable, int] = {}   # held sends per link (cork_limit)
        self.transport = transport
        #: the clock (looked up once: read per message): the transport's unless ``clock``
        self._now = clock if clock is not None else transport.now
        self.on_deliver = on_deliver
        self.on_event = on_event
        self.on_send_failed = on_send_failed
        self.on_oversized = on_oversized
        self.send_timeout = send_timeout
        #: the largest message a dialled link takes back (None: the transport's default)
        self.max_message = max_message
        self.name = name
        self.mailbox: Optional[Mailbox] = None
        self._reply: Optional[Callable[..., bool]] = None  # mailbox.try_send
        self._send_each: Optional[Callable[..., int]] = None  # mailbox.try_send_each
        self.links: dict[Hashable, Link] = {}
        self.closed = False
        self._held: Optional[list[Output]] = None      # outputs of the batch being read
        self._backlogs: dict[Hashable, deque[Sequence[bytes]]] = {}
        self._greenlets: set[gevent.Greenlet] = set()
        self._armed: Optional[float] = None             # the deadline the timer sleeps to
        self._timer: Optional[gevent.Greenlet] = None
        self.stats = {"received": 0, "sent": 0, "dropped": 0, "timers": 0}

    # --- reading --------------------------------------------------------

    def listen(self, mailbox: Mailbox, metadata: Optional[str] = None,
               backpressure: Any = None, *,
               admit: Optional[Callable[[bytes, list[bytes], Any], bool]] = None,
               admitted: Optional[Callable[[bytes], Any]] = None,
               replies: bool = True) -> None:
        """Serve ``mailbox``: its messages go to the core, named by sender identity; with
        ``metadata`` (a ZeroMQ message property, such as a CURVE peer's ``User-Id``) named
        ``(identity, property)`` instead (``Send`` still names the identity). With
        ``backpressure`` (see ``HubSocket.serve``), reading pauses while it is full.

        With ``metadata`` and ``admit``, a message is named by identity alone and goes to
        the core only if ``admitted(identity)`` is its property (the one its sender was let
        in with: one lookup) or ``admit(identity, frames, property)`` says yes; else it is
        dropped (``admit`` saw it). ``replies=False``: nothing is sent back through the
        mailbox (a simulated one then keeps no link per sender)."""
        self.mailbox = mailbox
        self._reply = mailbox.try_send     # (looked up once: a guarded mailbox forwards it)
        self._send_each = getattr(mailbox, "try_send_each", None)
        if replies and hasattr(mailbox, "replies"):
            mailbox.replies = True    # (a simulated mailbox keeps its links only to answer)
        take: Optional[Callable[[list, int], int]] = None
        if self.delivery is not None or self.carry_out is not None or self.batch_clock:
            on_message, after_batch, take = self._direct()
        else:
            on_message, after_batch = self._on_message, self._after_batch
        handler: Callable[..., None] = on_message
        accept = self.accept
        batches: dict[str, Any] = {}   # (a fast path over whole batches, where it serves)
        if (take is not None and metadata is None
                and (accept is None or self.delivery_each is None)   # (pass_each: accept)
                and getattr(mailbox, "takes_batches", False)):
            batches["take"] = take
        if metadata is None and accept is not None:
            on_refused = self._on_oversized

            def on_accepted(identity: bytes, frames: list[bytes]) -> None:
                if accept(identity):
                    on_message(identity, frames)
                else:
                    on_refused(identity)
            handler = on_accepted
        elif metadata is not None and admit is None:
            def on_named(identity: bytes, frames: list[bytes], prop: Any) -> None:
                on_message((identity, prop), frames)
            handler = on_named
        elif metadata is not None and admit is not None:
            known = admitted if admitted is not None else (lambda identity: None)
            gate = admit

            def on_keyed(identity: bytes, frames: list[bytes], prop: Any) -> None:
                if (prop is not None and known(identity) == prop) or gate(identity, frames, prop):
                    on_message(identity, frames)
            handler = on_keyed
        if metadata is None:
            self._spawn(mailbox.serve, handler, self._on_oversized, backpressure,
                        after_batch=after_batch, **batches)
        else:
            self._spawn(mailbox.serve, handler, self._on_oversized, backpressure,
                        metadata=metadata, after_batch=after_batch)
        self._rearm()

    def _direct(self, name: Optional[Hashable] = None
                ) -> tuple[Callable[[Hashable, list[bytes]], None], Callable[[], None],
                           Optional[Callable[[list, int], int]]]:
        """The message handler, end of batch and batch fast path (``take`` of
        ``HubSocket.serve``; None without ``delivery_each`` or ``pass_each``) of a mailbox
        (``name`` None) with ``delivery`` or ``carry_out``, or of any socket with
        ``batch_clock`` (a link: ``name``): the per-message path kept to a few calls (one
        clock reading and one count per batch)."""
        delivery, now_, carry_out = self.delivery, self._now, self.carry_out
        delivery_each = self.delivery_each
        pass_each = self.pass_each
        stamp: Optional[float] = None   # the batch's clock reading, taken at its first message
        count = 0
        received = False   # a message of the batch went to ``receive`` (the timer may move)
        looking: list[Any] = []   # the sockets ``pass_each`` sent on in this batch

        def on_message(link: Hashable, frames: list[bytes]) -> None:
            nonlocal stamp, count, received
            if stamp is None:
                stamp = now_()
            count += 1
            if delivery is not None:
                item = delivery(link, frames, stamp)
                if item is not None:
                    if carry_out is None and self._held is not None:
                        self._held.append(Deliver(item))   # (after what waits for the batch)
                    elif self.on_deliver is not None:
                        self.on_deliver(item)
                    return
            if self.closed:
                return
            received = True
            out = self.core.receive(link, frames, stamp)
            if out:
                if carry_out is not None:
                    carry_out(out)
                elif self._held is None:
                    self._held = out
                else:
                    self._held += out

        def take(batch: list, start: int) -> int:
            nonlocal stamp, count
            if carry_out is None and self._held is not None or self.on_deliver is None:
                return start   # (after what waits for the batch: one message at a time)
            if stamp is None:
                stamp = now_()
            end = delivery_each(batch, start, stamp, self.on_deliver)  # type: ignore[misc]
            count += end - start
            return end

        def take_passing(batch: list, start: int) -> int:
            nonlocal stamp, count
            if self._backlogs or self.closed:
                return start   # (after what waits to be sent: one message at a time)
            if stamp is None:
                stamp = now_()
            flush = self._flush_held if self._held else None
            end = pass_each(name, batch, start, stamp, looking, flush)  # type: ignore[misc]
            if end > start:
                count += end - start
                stats["sent"] += end - start
            return end

        stats, rearm, finish = self.stats, self._rearm, self._after_batch
        held_never = carry_out is not None and self.on_batch_end is None

        def after_batch() -> None:
            nonlocal stamp, count, received
            stats["received"] += count
            stamp, count = None, 0
            if looking:   # (``pass_each``'s sends may have taken in the edge of a message)
                for sock in looking:
                    if not sock.closed:
                        sock.readable()
                looking.clear()
            if not held_never:
                finish()
            elif received:   # (all ``_after_batch`` would do; ``delivery`` moves no deadline)
                received = False
                rearm()
        if delivery_each is not None:
            return on_message, after_batch, take
        return on_message, after_batch, take_passing if pass_each is not None else None

    def _flush_held(self) -> bool:
        """Carry out the outputs held for the batch being read, now (``pass_each`` is
        about to send); False when sending must wait (a backlog, or closed)."""
        held, self._held = self._held, None
        if held:
            self._carry_out_all(held)
        return not self._backlogs and not self.closed

    def _serve_link(self, name: Hashable, link: Link) -> None:
        take: Optional[Callable[[list, int], int]] = None
        if self.batch_clock:
            handle, after_batch, take = self._direct(name)
        else:
            handle, after_batch = self._on_message, self._after_batch
        batches: dict[str, Any] = {}
        if take is not None and self.pass_each is not None and self.delivery_each is None \
                and getattr(link, "takes_batches", False):
            batches["take"] = take   # (``pass_each`` over the link's batches)

        def on_message(first: bytes, rest: list[bytes]) -> None:
            rest.insert(0, first)
            handle(name, rest)

        def serve() -> None:
            if not link.closed:   # (not hung up before this greenlet ran)
                link.serve(on_message, self._on_oversized, None, after_batch=after_batch,
                           **batches)
        self._spawn(serve)

    def _on_message(self, link: Hashable, frames: list[bytes]) -> None:
        if self.closed:
            return
        self.stats["received"] += 1
        out = self.core.receive(link, frames, self._now())
        if out:
            if self.carry_out is not None:
                self.carry_out(out)
            elif self._held is None:
                self._held = out
            else:
                self._held += out

    def _on_oversized(self, first: bytes) -> None:
        self.stats["dropped"] += 1
        log.debug("%s: an oversized message dropped", self.name)
        if self.on_oversized is not None:
            self.on_oversized(first)

    def _after_batch(self) -> None:
        held, self._held = self._held, None
        if self.on_batch_end is not None and not self.closed:
            more = self.on_batch_end(self._now())
            if more:
                if held:
                    held += more
                else:
                    held = more if type(more) is list else list(more)
        if held:
            self._carry_out_all(held)
        self._rearm()

    def feed(self, messages: Iterable[tuple[Hashable, list[bytes]]]) -> None:
        """Hand the core ``messages`` (link, frames) that came another way, as one batch
        (``receive`` each, then as after a batch read)."""
        for link, frames in messages:
            self._on_message(link, frames)
        self._after_batch()

    # --- outputs --------------------------------------------------------

    def apply(self, outputs: Sequence[Output], *, look_now: bool = True) -> None:
        """Carry out ``outputs`` (in order), then re-arm the timer. With ``look_once`` and
        ``look_now=False`` the sends still go at once, but each socket sent on is looked at
        once at the end of the hub's turn, not after each send (what several calls of one
        turn send, such as a burst of requests, costs one look per socket)."""
        if look_now or not self.look_once or self._looking is not None:
            self._carry_out(outputs)
        else:
            later = self._later
            if later is None:
                later = self._later = []
                gevent.get_hub().loop.run_callback(self._look_later)
            self._looking = later
            try:
                self._carry_out_quietly(outputs, later)
            finally:
                self._looking = None
        self._rearm()

    def _look_later(self) -> None:
        """Look once at each socket ``apply(look_now=False)`` sent on in this turn."""
        later, self._later = self._later, None
        for sock in later or ():
            if not sock.closed:
                sock.readable()

    def apply_all(self, outputs: Sequence[Output]) -> None:
        """Carry out ``outputs`` (in order) as those of a batch read: with ``look_once``
        the sends go back to back and each socket sent on is looked at once after them
        all (outputs gathered from several calls, such as the requests of one hub turn),
        then re-arm the timer. Each send is counted, waits in its link's backlog when
        the queue is full and goes to ``on_send_failed`` when it has no way out, as
        ``apply``'s do."""
        self._carry_out_all(outputs)
        self._rearm()

    def _carry_out_all(self, outputs: Sequence[Output]) -> None:
        """Carry out ``outputs`` back to back; with ``look_once`` each socket sent on is
        looked at once after them all."""
        if self.look_once and self._looking is None:
            self._carry_out_looking(outputs)
        else:   # (within a batch's outputs already: those are looked at after it)
            self._carry_out(outputs)

    def cork(self, outputs: Sequence[Output]) -> None:
        """Hold ``outputs`` to be carried out by ``apply_all`` at the end of the hub's
        turn (what several callers make in one turn goes out together, the far end woken
        once), or as soon as ``cork_limit`` sends to one link wait. ``uncork`` carries
        them out at once."""
        corked = self.corked
        if not corked:
            gevent.get_hub().loop.run_callback(self.uncork)
        corked += outputs
        limit = self.cork_limit
        if limit is not None:
            counts = self._corked_sends
            for output in outputs:
                if type(output) is Send:
                    held = counts[output.link] = counts.get(output.link, 0) + 1
                    if held >= limit:
                        self.uncork()
                        return

    def uncork(self) -> None:
        """Carry out what ``cork`` holds, in order, now (nothing once closed)."""
        corked = self.corked
        if corked:
            self.drop_corked()
            if not self.closed:
                self.apply_all(corked)

    def drop_corked(self) -> None:
        """Forget what ``cork`` holds, unsent (its owner tells whoever waits for it)."""
        self.corked = []
        self._corked_sends.clear()

    def _carry_out_looking(self, outputs: Sequence[Output]) -> None:
        """``_carry_out`` noting each socket sent on, each looked at once after all."""
        looking: list[Any] = []
        self._looking = looking
        try:
            self._carry_out_quietly(outputs, looking)
        finally:
            self._looking = None
            for sock in looking:   # (a send may have taken in the edge of a message)
                if not sock.closed:
                    sock.readable()

    def _carry_out(self, outputs: Sequence[Output]) -> None:
        if self.carry_out is not None:
            self.carry_out(outputs)
            return
        for output in outputs:
            cls = type(output)
            if cls is Send:
                self._send(output.link, output.frames)   # type: ignore[union-attr]
            elif cls is Deliver:
                if self.on_deliver is not None:
                    self.on_deliver(output.item)         # type: ignore[union-attr]
            elif cls is Emit:
                if self.on_event is not None:
                    self.on_event(output.event)          # type: ignore[union-attr]
            elif cls is Dial:
                self.dial(output.link, output.endpoint, output.identity,  # type: ignore
                          output.server_key)                       # type: ignore
            elif cls is Hangup:
                self.hangup(output.link)                 # type: ignore[union-attr]
            else:
                raise TypeError(f"not a core output: {output!r}")

    def _carry_out_quietly(self, outputs: Sequence[Output], looking: list[Any]) -> None:
        """``_carry_out`` of a batch's outputs with ``look_once``: each ``Send`` goes
        straight to its socket, not looked at (noted in ``looking``); what is not a plain
        send (a link with a backlog, no way out, another output) takes the usual path."""
        links = self.links
        stats = self.stats
        mailbox = self.mailbox if self._reply is not None and self.addressed else None
        if self.addressed and not self._backlogs and outputs:
            each = self._each_of(outputs, mailbox)
            if each is not None:   # (the usual: one call sends them all)
                run = [o.frames for o in outputs]   # type: ignore[union-attr]
                self._send_run(outputs, run, each)
                return
        for output in outputs:
            if type(output) is not Send or self._backlogs:
                self._carry_out((output,))
                continue
            name = output.link
            frames = output.frames
            sock: Any = links.get(name)
            if sock is None:
                if mailbox is None or type(name) is not bytes:
                    self._send(name, frames)
                    continue
                sock = mailbox
            if sock not in looking:
                looking.append(sock)
            try:
                sent = sock.try_send(frames, False)
            except (OSError, zmq.ZMQError) as exc:   # a peer gone from the mailbox
                self._send_failed(name, frames, exc)
                continue
            if sent:
                stats["sent"] += 1
            else:
                self._hold_back(name, frames)

    def _each_of(self, outputs: Sequence[Output],
                 mailbox: Any) -> Optional[Callable[[Iterable[Sequence[bytes]]], int]]:
        """The ``try_send_each`` that takes all of ``outputs`` (addressed) in one call:
        the mailbox's when all are sends to its peers (no link dialled), a link's when all
        are sends down that one link (one that has it); else None."""
        first = outputs[0]
        if type(first) is not Send:
            return None
        name = first.link
        link = self.links.get(name)
        if link is None:
            if mailbox is None or self.links or self._send_each is None:
                return None
            if all(type(o) is Send and type(o.link) is bytes for o in outputs):
                return self._send_each
            return None
        each = getattr(link, "try_send_each", None)
        if each is not None and all(type(o) is Send and o.link == name for o in outputs):
            return each   # type: ignore[no-any-return]
        return None

    def _send_run(self, outputs: Sequence[Output], run: list[Sequence[bytes]],
                  send_each: Callable[[Iterable[Sequence[bytes]]], int]) -> None:
        """Send ``run``, the frames of ``outputs`` (addressed ``Send``s all to mailbox
        peers, or all down one link), in one call (``send_each``, a ``try_send_each``: the
        socket looked at once after them); what cannot go takes the usual path from there
        on (a full queue: the backlog; a peer gone: ``on_send_failed``), as sent one by
        one."""
        stats = self.stats
        start, total = 0, len(run)
        while start < total:
            rest = iter(run) if not start else iter(run[start:])
            try:
                done = send_each(rest)
            except (OSError, zmq.ZMQError) as exc:   # a peer gone from the mailbox
                failed = total - length_hint(rest) - 1   # (the message it stopped at)
                stats["sent"] += failed - start
                output = outputs[failed]
                self._send_failed(output.link, output.frames, exc)  # type: ignore[union-attr]
                start = failed + 1
                continue
            stats["sent"] += done
            if start + done < total:   # a full queue: that message and the rest wait
                self._carry_out(outputs[start + done:])
            return

    def dial(self, name: Hashable, endpoint: str, identity: bytes = b"",
             server_key: Optional[bytes] = None) -> None:
        """Open link ``name`` to ``endpoint`` (replacing one of that name) and serve it."""
        if self.closed:
            return
        self.hangup(name)
        link = self.transport.connect(identity, endpoint, self.sndhwm, server_key=server_key,
                                      handover=True, max_message=self.max_message)
        self.links[name] = link
        self._serve_link(name, link)

    def hangup(self, name: Hashable, linger: float = 0.0) -> None:
        """Close link ``name`` (what waits in its backlog is dropped; ZeroMQ may go on
        sending what it holds for ``linger`` seconds)."""
        link = self.links.pop(name, None)
        self._backlogs.pop(name, None)
        if link is not None:
            link.close(linger)

    def _send(self, name: Hashable, frames: Sequence[bytes]) -> None:
        if self._backlogs:
            backlog = self._backlogs.get(name)
            if backlog is not None:
                backlog.append(frames)
                return
        if self._try_send(name, frames) is False:
            self._hold_back(name, frames)

    def _hold_back(self, name: Hashable, frames: Sequence[bytes]) -> None:
        """A full queue: ``frames`` start the link's backlog, which one greenlet sends."""
        self._backlogs[name] = deque((frames,))
        self._spawn(self._send_backlog, name)

    def _try_send(self, name: Hashable, frames: Sequence[bytes]) -> Optional[bool]:
        """True if sent, False if the queue is full, None if there is no way (dropped)."""
        link = self.links.get(name)
        looking = self._looking
        try:
            if looking is not None and (link is not None or self._reply is not None
                                        and type(name) is bytes):
                # a batch with ``look_once``: the socket is noted, not looked at
                sock: Any = link
                out = frames
                if sock is None:   # back through the mailbox
                    sock = self.mailbox
                    if not self.addressed:
                        out = [name, *frames]   # type: ignore[list-item]
                if sock not in looking:
                    looking.append(sock)
                sent = sock.try_send(out, False)
            elif link is not None:
                sent = link.try_send(frames)
            elif self._reply is not None and type(name) is bytes:
                sent = self._reply(frames if self.addressed else [name, *frames])
            else:
                log.debug("%s: no link %r; a message dropped", self.name, name)
                self.stats["dropped"] += 1
                return None
        except (OSError, zmq.ZMQError) as exc:   # a peer gone from the mailbox
            self._send_failed(name, frames, exc)
            return None
        if sent:
            self.stats["sent"] += 1
        return sent

    def _send_failed(self, name: Hashable, frames: Sequence[bytes], exc: BaseException) -> None:
        log.debug("%s: cannot send to %r: %s", self.name, name, exc)
        self.stats["dropped"] += 1
        if self.on_send_failed is not None:
            self.on_send_failed(name, frames, exc)

    def _send_backlog(self, name: Hashable) -> None:
        backlog = self._backlogs.get(name)
        now = self.transport.now
        give_up = now() + self.send_timeout
        while backlog and not self.closed:
            link = self.links.get(name)
            if link is not None:
                link.wait_writable(max(0.0, give_up - now()))
            while backlog and self._try_send(name, backlog[0]) is not False:
                backlog.popleft()
            if not backlog:
                break
            if now() >= give_up:
                log.warning("%s: send queue to %r full for %.1fs; %d message(s) dropped",
                            self.name, name, self.send_timeout, len(backlog))
                self.stats["dropped"] += len(backlog)
                break
            if link is None:   # a full mailbox has nothing to wait on: the clock, a little
                self.transport.sleep(0.01)
        if self._backlogs.get(name) is backlog:
            del self._backlogs[name]

    # --- time -----------------------------------------------------------

    def _rearm(self) -> None:
        """Make the timer sleep to the core's next deadline if that is earlier than now armed."""
        if self.closed:
            return
        deadline = self.core.next_deadline()
        if deadline is None or (self._timer is not None and self._armed is not None
                                and deadline >= self._armed - SLACK):
            return
        timer, self._timer = self._timer, None
        if timer is not None and timer is not gevent.getcurrent():
            self._greenlets.discard(timer)
            timer.kill(block=False)
        self._armed = deadline
        self._timer = self._spawn(self._run_timer, deadline)

    def _run_timer(self, deadline: float) -> None:
        transport, clock = self.transport, self._now
        while not self.closed:
            core = self.core   # (``replace_core`` may give it another)
            delay = deadline - clock()
            if delay > 0:
                transport.sleep(delay)
                continue
            self.stats["timers"] += 1
            now = clock()
            if self.on_timer is not None:
                self.on_timer(now)
            out = core.handle_timer(now)
            if out:
                self._carry_out(out)
                if self._timer is not gevent.getcurrent():
                    return   # (re-armed by what it carried out: the new timer goes on)
            following = core.next_deadline()
            if following is None:
                break
            deadline = self._armed = max(following, clock() + SLACK)
        self._armed = None
        if self._timer is gevent.getcurrent():
            self._timer = None

    # --- life -----------------------------------------------------------

    def _spawn(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> gevent.Greenlet:
        greenlet = gevent.spawn(fn, *args, **kwargs)
        self._greenlets.add(greenlet)
        greenlet.link(self._greenlets.discard)
        return greenlet

    @property
    def greenlets(self) -> list[gevent.Greenlet]:
        """What serves the core now: the readers, the timer, the backlogs' senders."""
        return list(self._greenlets)

    def replace_core(self, core: Core) -> None:
        """Serve ``core`` from now on, on the same mailbox and links (the timer follows
        its deadline)."""
        self.core = core
        timer, self._timer = self._timer, None
        if timer is not None and timer is not gevent.getcurrent():
            self._greenlets.discard(timer)
            timer.kill(block=False)
        self._armed = None
        self._rearm()

    def close(self, linger: float = 0.0) -> None:
        """Stop reading and the timer; close every link and the mailbox (ZeroMQ may go on
        sending what they hold for ``linger`` seconds)."""
        if self.closed:
            return
        self.closed = True
        self.drop_corked()
        for name in list(self.links):
            self.hangup(name, linger)
        if self.mailbox is not None:
            self.mailbox.close(linger)
        current = gevent.getcurrent()
        gevent.killall([g for g in self._greenlets if g is not current], block=False)
        self._greenlets.clear()
