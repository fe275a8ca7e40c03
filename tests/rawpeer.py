"""A hand-driven ZRE v2 peer for tests: every byte it sends is under the test's control.

``RawPeer`` is built on plain (blocking) pyzmq and the sans-io codec
``peermesh.wire.zre`` - not on ``peermesh.Node`` - so a test can send exactly
the datagrams and frames it wants, well-formed or not. It has:

* a UUID (``uuid``; ``identity`` is ``0x01 + uuid``, what ZRE DEALERs use);
* its own ROUTER mailbox bound on 127.0.0.1 (or another loopback ``address``,
  as a second host would be) at a port in 49152-65535
  (``endpoint``, ``port``), where the node under test connects back and sends
  its HELLO, PING, WHISPER... which ``recv``/``recv_from``/``expect`` decode;
* a UDP socket with ``SO_BROADCAST`` bound on that address that sends beacons
  (``beacon``) or arbitrary datagrams (``datagram``) to 127.255.255.255;
* one DEALER at a time (``connect``) to a node's mailbox, with a socket
  monitor so a test can see the node cut the connection (``wait_dealer_event``);
* command helpers (``hello``, ``whisper``, ``shout``, ``join``, ``leave``,
  ``ping``, ``ping_ok``, ``command``) that number their messages
  automatically: ``hello`` starts again at 1, every other command uses the
  next number mod 65536; ``sequence=N`` forces a number (numbering continues
  from it). ``send`` puts raw frames on the wire.

Waiting is plain blocking pyzmq with poll timeouts, so the node under test
must run on another thread's hub: use ``peermesh.ThreadedNode``. Every wait is
bounded. Close with ``close()`` or use it as a context manager. Sockets only
ever bind or send to loopback addresses (127.0.0.1 by default) and 127.255.255.255.
"""

from __future__ import annotations

import random
import socket
import time
import uuid as uuid_module
from typing import Mapping, Optional, Sequence, Type, TypeVar, Union
from uuid import UUID

import zmq
from zmq.utils.monitor import recv_monitor_message

from peermesh.wire import zre

__all__ = ["RawPeer", "LOOPBACK", "LOOPBACK_BROADCAST"]

LOOPBACK = "127.0.0.1"
LOOPBACK_BROADCAST = "127.255.255.255"

M = TypeVar("M")
Bytes = Union[bytes, bytearray, memoryview]

_SEND_TIMEOUT_MS = 10_000  # a blocked send fails (zmq.Again) instead of hanging a test


def _bind_mailbox(router: zmq.Socket, address: str = LOOPBACK) -> int:
    """Bind ``router`` on ``address`` at a random free port in 49152-65535."""
    for _ in range(1000):
        port = random.randint(0xC000, 0xFFFF)
        try:
            router.bind(f"tcp://{address}:{port}")
            return port
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE:
                raise
    raise RuntimeError(f"no free mailbox port in 49152-65535 on {address}")


class RawPeer:
    """A ZRE peer driven by hand. See the module docstring."""

    def __init__(self, uuid: Optional[UUID] = None, *, name: str = "raw",
                 headers: Optional[Mapping[str, str]] = None, address: str = LOOPBACK) -> None:
        if not address.startswith("127."):
            raise ValueError(f"a raw peer lives on loopback (127.x.y.z), not at {address}")
        #: the loopback address its mailbox, beacons and connections come from
        self.address = address
        self.uuid = uuid if uuid is not None else uuid_module.uuid4()
        self.uuid_bytes = self.uuid.bytes
        self.identity = b"\x01" + self.uuid_bytes
        self.name = name
        self.headers = dict(headers or {})
        self.groups: list[str] = []
        #: last sequence number sent (the next helper command uses sequence + 1)
        self.sequence = 0
        #: own group status, as sent in HELLO/JOIN/LEAVE
        self.status = 0
        self.context = zmq.Context()
        self.dealer: Optional[zmq.Socket] = None
        self._monitor: Optional[zmq.Socket] = None
        self._udp: Optional[socket.socket] = None
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        # Like a node's mailbox: a peer that reconnects (a new DEALER with the
        # same identity) takes over at once instead of being refused.
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        try:
            self.port = _bind_mailbox(self.router, address)
        except BaseException:
            self.close()
            raise
        self.endpoint = f"tcp://{address}:{self.port}"

    # --- life cycle -----------------------------------------------------

    def close(self) -> None:
        """Close every socket and the private ZeroMQ context (idempotent)."""
        self.disconnect()
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        if not self.context.closed:
            self.context.destroy(linger=0)

    def __enter__(self) -> "RawPeer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RawPeer {self.uuid.hex[:8]} {self.endpoint} seq={self.sequence}>"

    # --- UDP ------------------------------------------------------------

    def _udp_socket(self) -> socket.socket:
        if self._udp is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            sock.bind((self.address, 0))
            self._udp = sock
        return self._udp

    def datagram(self, beacon_port: int, data: Bytes) -> None:
        """Send ``data`` as one UDP datagram to 127.255.255.255:``beacon_port``."""
        self._udp_socket().sendto(bytes(data), (LOOPBACK_BROADCAST, beacon_port))

    def beacon_bytes(self, port: Optional[int] = None, *, uuid: Optional[UUID] = None) -> bytes:
        """The 22-octet beacon for ``uuid`` (default: own) and mailbox ``port`` (default: own)."""
        return zre.encode_beacon(zre.Beacon((uuid or self.uuid).bytes,
                                            self.port if port is None else port))

    def beacon(self, beacon_port: int, port: Optional[int] = None, *,
               uuid: Optional[UUID] = None) -> bytes:
        """Broadcast a beacon to ``beacon_port``; ``port=0`` says "leaving". Returns its bytes."""
        data = self.beacon_bytes(port, uuid=uuid)
        self.datagram(beacon_port, data)
        return data

    # --- the DEALER to a node's mailbox ------------------------------------

    def connect(self, endpoint: str, *, identity: Optional[bytes] = None,
                sndhwm: int = 1000, reconnect: bool = True) -> zmq.Socket:
        """A new DEALER (identity ``0x01 + uuid`` unless given) connected to ``endpoint``;
        ``reconnect=False``: a connection the node closes stays closed.

        Any previous DEALER is closed first. Returns the socket.
        """
        self.disconnect()
        dealer = self.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, self.identity if identity is None else identity)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.SNDTIMEO, _SEND_TIMEOUT_MS)
        dealer.setsockopt(zmq.SNDHWM, sndhwm)
        dealer.setsockopt(zmq.RECONNECT_IVL, 50 if reconnect else -1)
        self._monitor = dealer.get_monitor_socket()
        if self.address != LOOPBACK:  # from our own address: tcp://SOURCE;DESTINATION
            endpoint = endpoint.replace("tcp://", f"tcp://{self.address}:0;", 1)
        dealer.connect(endpoint)
        self.dealer = dealer
        return dealer

    def disconnect(self) -> None:
        """Close the DEALER (and its monitor), if any."""
        if self.dealer is not None:
            try:
                self.dealer.disable_monitor()
            except zmq.ZMQError:
                pass
            self.dealer.close(linger=0)
            self.dealer = None
        if self._monitor is not None:
            self._monitor.close(linger=0)
            self._monitor = None

    def wait_dealer_event(self, event: int, timeout: float = 5.0) -> bool:
        """Wait until the DEALER's monitor reports ``event`` (e.g. ``zmq.EVENT_DISCONNECTED``).

        Events reported before are consumed on the way. False after ``timeout``.
        """
        monitor = self._monitor
        if monitor is None:
            raise RuntimeError("not connected")
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not monitor.poll(max(1, int(remaining * 1000)), zmq.POLLIN):
                return False
            if recv_monitor_message(monitor)["event"] == event:
                return True

    def send(self, frames: Sequence[Bytes]) -> None:
        """Send ``frames`` as one message on the DEALER, exactly as given."""
        if self.dealer is None:
            raise RuntimeError("call connect() first")
        frames = list(frames)
        if not frames:
            raise ValueError("a ZeroMQ message has at least one frame")
        dealer = self.dealer
        for frame in frames[:-1]:
            dealer.send(frame, zmq.SNDMORE)
        dealer.send(frames[-1])

    def send_message(self, message: zre.Message) -> None:
        """Encode ``message`` with the codec and send it (its sequence is taken as is)."""
        self.send(zre.encode(message))

    # --- sequence numbering ----------------------------------------------

    def next_sequence(self, sequence: Optional[int] = None) -> int:
        """The number for the next command: ``sequence`` if given, else last + 1 mod 65536."""
        self.sequence = (self.sequence + 1 if sequence is None else sequence) & 0xFFFF
        return self.sequence

    # --- commands ---------------------------------------------------------

    def hello(self, endpoint: Optional[str] = None, *, groups: Optional[Sequence[str]] = None,
              status: Optional[int] = None, name: Optional[str] = None,
              headers: Optional[Mapping[str, str]] = None, sequence: int = 1) -> zre.Hello:
        """Send HELLO (numbering starts again at ``sequence``, 1 by default)."""
        if groups is not None:
            self.groups = list(groups)
        if status is not None:
            self.status = status & 0xFF
        message = zre.Hello(self.next_sequence(sequence),
                            self.endpoint if endpoint is None else endpoint,
                            tuple(self.groups), self.status,
                            self.name if name is None else name,
                            dict(self.headers if headers is None else headers))
        self.send_message(message)
        return message

    def whisper(self, *frames: Bytes, sequence: Optional[int] = None) -> int:
        """Send WHISPER with ``frames`` as content; returns the sequence used."""
        seq = self.next_sequence(sequence)
        self.send([zre.whisper_header(seq), *frames])
        return seq

    def shout(self, group: str, *frames: Bytes, sequence: Optional[int] = None) -> int:
        """Send SHOUT to ``group``; returns the sequence used."""
        seq = self.next_sequence(sequence)
        self.send_message(zre.Shout(seq, group, tuple(bytes(f) for f in frames)))
        return seq

    def _group_command(self, cls: Type[M], group: str, status: Optional[int],
                       sequence: Optional[int]) -> M:
        if status is None:
            self.status = (self.status + 1) & 0xFF
        else:
            self.status = status & 0xFF
        message = cls(self.next_sequence(sequence), group, self.status)  # type: ignore[call-arg]
        self.send_message(message)  # type: ignore[arg-type]
        return message

    def join(self, group: str, *, status: Optional[int] = None,
             sequence: Optional[int] = None) -> zre.Join:
        """Send JOIN; ``status`` defaults to own status + 1 (and becomes own status)."""
        if group not in self.groups:
            self.groups.append(group)
        return self._group_command(zre.Join, group, status, sequence)

    def leave(self, group: str, *, status: Optional[int] = None,
              sequence: Optional[int] = None) -> zre.Leave:
        """Send LEAVE; ``status`` defaults to own status + 1 (and becomes own status)."""
        if group in self.groups:
            self.groups.remove(group)
        return self._group_command(zre.Leave, group, status, sequence)

    def ping(self, *, sequence: Optional[int] = None) -> int:
        """Send PING; returns the sequence used."""
        seq = self.next_sequence(sequence)
        self.send_message(zre.Ping(seq))
        return seq

    def ping_ok(self, *, sequence: Optional[int] = None) -> int:
        """Send PING-OK; returns the sequence used."""
        seq = self.next_sequence(sequence)
        self.send_message(zre.PingOk(seq))
        return seq

    def command(self, command: int, body: bytes = b"", *content: Bytes,
                sequence: Optional[int] = None) -> int:
        """Send any command id (e.g. Zyre's ELECT, 8) with a raw ``body`` after the header."""
        seq = self.next_sequence(sequence)
        header = zre.encode(zre.Unknown(seq, command))[0]  # the bare 6-octet header
        self.send([header + body, *content])
        return seq

    # --- the ROUTER mailbox ---------------------------------------------

    def poll(self, timeout: float) -> bool:
        """True when a message waits on the mailbox (waits up to ``timeout`` seconds)."""
        return bool(self.router.poll(max(0, int(timeout * 1000)), zmq.POLLIN))

    def recv_raw(self, timeout: float) -> Optional[list[bytes]]:
        """The next mailbox message as raw frames (identity first), or None after ``timeout``."""
        if not self.poll(timeout):
            return None
        return self.router.recv_multipart()

    def recv_from(self, timeout: float) -> Optional[tuple[Optional[UUID], zre.Message]]:
        """The next mailbox message as (sender UUID, decoded message), or None after ``timeout``.

        The sender is None when the identity is not ``0x01 + UUID``. A message
        the codec rejects raises ``ProtocolError``: the node sent bad bytes.
        """
        frames = self.recv_raw(timeout)
        if frames is None:
            return None
        identity = frames[0]
        sender = UUID(bytes=identity[1:]) if len(identity) == 17 and identity[0] == 1 else None
        return sender, zre.decode(frames[1:])

    def recv(self, timeout: float) -> Optional[zre.Message]:
        """The next decoded mailbox message, or None after ``timeout`` seconds."""
        got = self.recv_from(timeout)
        return None if got is None else got[1]

    def expect(self, kind: Type[M], timeout: float = 5.0, *,
               sender: Optional[UUID] = None) -> M:
        """Wait for a message of type ``kind`` (from ``sender`` if given), skipping others.

        Raises AssertionError, listing what came instead, after ``timeout``.
        """
        deadline = time.monotonic() + timeout
        skipped = []
        while True:
            got = self.recv_from(max(0.0, deadline - time.monotonic()))
            if got is None:
                raise AssertionError(f"no {kind.__name__} within {timeout} s; got {skipped}")
            who, message = got
            if isinstance(message, kind) and (sender is None or who == sender):
                return message
            skipped.append((who, message))
