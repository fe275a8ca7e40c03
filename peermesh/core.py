"""The core contract: one shape for every protocol's sans-io logic.

A protocol core (the state machine of one role: an NFP broker, a ZRE
session, a Flux broker, ...) does no I/O and reads no clock. Its driver
(``peermesh.io.driver.Driver``) owns the sockets and the clock and feeds it
three calls, the surface aioquic's ``QuicConnection`` has:

* ``receive(link, frames, now)`` - one message arrived on ``link`` (the
  driver's name for where it came from: a peer's routing identity on a
  mailbox, the key of a link the core dialled);
* ``handle_timer(now)`` - the time ``next_deadline()`` named has come;
* ``next_deadline()`` - when the core next needs ``handle_timer`` (None:
  only when something arrives).

``receive`` and ``handle_timer`` *return* what the core wants done, a list
of outputs from a small closed set; nothing is called back:

* ``Send(link, frames)`` - one message out on ``link``;
* ``Deliver(item)`` - something for the core's user (a job to run, a
  request's answer, a whisper);
* ``Emit(event)`` - an event for listeners (a peer entered, a job finished);
* ``Dial(link, endpoint, identity, server_key)`` - open an outgoing link under the name
  ``link``; ``Hangup(link)`` - close it.

Storage is an injected port (an object the core is given, such as NFP's
``JobStore`` whose answers leave only ``after_commit``), never a file the
core opens. A core may also have plain methods for its user's requests (an
NFP ``post``), which return outputs the same way.

How each protocol maps onto the contract
----------------------------------------

============================  ==========================================================
core                          receive / handle_timer / next_deadline, outputs
============================  ==========================================================
NFP ``Dispatcher``            ``receive(worker, frames, now)`` takes a worker's RESPONSE
                              or EVENT; ``handle_timer`` is the old ``tick``; sends to
                              workers added with ``send=None`` are returned as ``Send``.
NFP ``BrokerCore`` /          the broker's and the worker's conversations (OPEN, READY,
``WorkerSession``             KEEPALIVE, DISCONNECT, liveness) on the same surface;
                              requests for a worker come out as ``Deliver``.
ZRE ``Session``               ``receive(identity, frames, now)`` is the mailbox message;
                              ``handle_timer`` runs the liveness timers and settles
                              claims and departures when due. A new peer is a ``Dial(uuid,
                              endpoint, identity)`` the node answers with ``attach(uuid,
                              PeerLink)``; events are ``Emit``, WHISPER/SHOUT ``Deliver``.
                              Commands to a peer stay on its ``Outbox`` (``offer``, the
                              flow-controlled path), not ``Send``; discovery reports and
                              group calls leave outputs for ``take()``.
SADA ``RequestRouter``        ``receive(link, frames, now)`` takes a server's reply;
                              answers come out as ``Deliver``, requests as ``Send``, a
                              catalog change as ``Emit`` (the old ``send``/``answer``
                              callbacks still work when given).
SADA ``ServerCore``           ``receive(alias, frames, now)`` takes a channel's REQ, PING
                              or RINTR: REPs, PONGs and INTRs come out as ``Send``, a
                              request for a handler as ``Deliver`` (its outcome goes back
                              to ``reply``), channels as ``Dial``/``Hangup``;
                              ``handle_timer`` forgets channels that left the mesh.
``FluxCore``                  ``receive(link, frames, now)`` (``PARENT`` or a ROUTER
                              peer's identity); local handles get ``Deliver((handle,
                              message))``, notices come as ``Emit(Notice)``, the parent
                              link is ``Dial(PARENT, ...)``/``Hangup(PARENT)``; a
                              ``Send`` to a ROUTER peer carries its address as the first
                              frame (the driver's ``addressed`` option).
MTL ``DataFlow``              ``receive`` takes a data command and returns its sends
                              (``Send``) and mesh actions (``Deliver``); ``handle_timer``
                              is ``tick`` (heartbeats, dead links, expiry) and a commit;
                              the durable queues are a port (``Queues``).
MTL ``ControlFlow``           ``receive((identity, address), frames, now)`` takes a REQ
                              envelope, the reply is one ``Send``; ``handle_timer``
                              forgets idle sessions.
MTL ``GatewayCore``           the gateway's data side: ``DataFlow`` and the copies between
                              gateways (MTL-HANDOFF, MTL-REPL, MTL-MARK ...: whispers
                              as ``Deliver``); it answers once per batch
                              (``end_batch``, the driver's ``on_batch_end``), holding
                              ``confirm: full`` answers for a replica's mark.
============================  ==========================================================

``Outputs`` is the small helper a core may inherit to collect what it
returns: methods append with ``_out``; ``take()`` hands the list over.
Outputs are plain slotted records, made on every message: treat them as
values (they are not frozen because frozen ones cost twice as much to make).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Optional, Protocol, Sequence, Union, runtime_checkable

__all__ = ["Send", "Deliver", "Emit", "Dial", "Hangup", "Output", "Core", "Outputs"]


@dataclass(slots=True)
class Send:
    """Send ``frames`` as one message on ``link``."""

    link: Hashable
    frames: Sequence[bytes]


@dataclass(slots=True)
class Deliver:
    """Hand ``item`` to the core's user."""

    item: Any


@dataclass(slots=True)
class Emit:
    """Tell listeners about ``event``."""

    event: Any


@dataclass(slots=True)
class Dial:
    """Open an outgoing link to ``endpoint`` (routing identity ``identity``; a CURVE client
    of ``server_key`` where keys are used), named ``link``; what comes back on it arrives as
    ``receive(link, ...)``."""

    link: Hashable
    endpoint: str
    identity: bytes = b""
    server_key: Optional[bytes] = None


@dataclass(slots=True)
class Hangup:
    """Close the outgoing link ``link`` (nothing if it is not open)."""

    link: Hashable


#: everything a core may return
Output = Union[Send, Deliver, Emit, Dial, Hangup]


@runtime_checkable
class Core(Protocol):
    """A sans-io protocol core (see the module docstring)."""

    def receive(self, link: Hashable, frames: list[bytes], now: float) -> list[Output]:
        """One message ``frames`` arrived on ``link`` at ``now``; what to do about it."""
        ...

    def handle_timer(self, now: float) -> list[Output]:
        """The deadline has come; what to do about it."""
        ...

    def next_deadline(self) -> Optional[float]:
        """When ``handle_timer`` is next needed (None: not until something arrives)."""
        ...


class Outputs:
    """Collects a core's outputs between two ``take`` calls."""

    __slots__ = ("_outputs",)

    def __init__(self) -> None:
        self._outputs: list[Output] = []

    def _out(self, output: Output) -> None:
        self._outputs.append(output)

    def take(self) -> list[Output]:
        """The outputs collected since the last call (the list is the caller's now)."""
        out = self._outputs
        if out:
            self._outputs = []
        return out if out else []
