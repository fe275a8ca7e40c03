"""Frames of the MTL gateways' replication: whispers between gateways only.

How it works
------------
A standby gateway offers the serving one what it holds and asks for a copy;
the serving gateway copies its store and each commit to it (the protocol is
described in ``peermesh.mtl.gateway``). Each message is one ZRE WHISPER whose
first frame names it::

    standby -> serving, to join it:
    MTL-HANDOFF     | group | id (8) | cid (16) | field table | body
    MTL-HANDOFF-END | id (8) | count (8)        ; end of a batch of count contents
    MTL-HANDOFF-OK  | id (8)                    ; all of it stored and committed
    MTL-SYNC        | copy (8)                  ; send me everything
    serving -> standby:
    MTL-REPL        [| group | cid (16) | field table | body]...
    MTL-FORGET      | cid (16) ...              ; one frame: content ids, concatenated
    MTL-MARK        | number (8) | copy (8) or empty
    MTL-MARK-OK     | number (8)                ; (standby -> serving)
    MTL-RESYNC                                  ; you fell behind: join again

    id, count, copy, number = 8 octets, unsigned, network order
    cid         = origin (8) | content id (8): the content's id in every store
    group       = UTF-8, a valid MTL short string's text (``peermesh.wire.mtl``)
    field table = shortint length | msgpack map (``peermesh.wire.mtl.encode_table``)

``decode`` turns a whisper's frames into one of the message classes and
raises ``RemoteProtocolError`` (and nothing else) for frames that are not a
well-formed replication message (the gateway ignores those: only other
gateways send these). The builders return a message's frames.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional, Sequence, Union

from ..errors import ProtocolError, RemoteProtocolError
from .frames import as_frames
from .mtl import EMPTY_TABLE, decode_table, valid_string

__all__ = [
    "HANDOFF", "HANDOFF_END", "HANDOFF_OK", "SYNC", "REPL", "FORGET", "MARK", "MARK_OK",
    "RESYNC", "KINDS", "CID_BYTES", "NUMBER_BYTES", "Handoff", "HandoffEnd",
    "HandoffOk", "Sync", "Repl", "Forget", "Mark", "MarkOk", "Resync", "ReplicationMessage",
    "decode", "encode_number", "decode_number", "content_group", "split_cids", "handoff",
    "handoff_end", "handoff_ok", "sync", "repl_batches", "forget_batches", "mark", "mark_ok",
    "resync",
]

HANDOFF, HANDOFF_END, HANDOFF_OK = b"MTL-HANDOFF", b"MTL-HANDOFF-END", b"MTL-HANDOFF-OK"
SYNC = b"MTL-SYNC"
REPL, FORGET, MARK, MARK_OK, RESYNC = (b"MTL-REPL", b"MTL-FORGET", b"MTL-MARK",
                                       b"MTL-MARK-OK", b"MTL-RESYNC")
#: the first frames of every replication message
KINDS = frozenset((HANDOFF, HANDOFF_END, HANDOFF_OK, SYNC, REPL, FORGET, MARK, MARK_OK, RESYNC))
#: octets of a content id: origin (8) and id (8)
CID_BYTES = 16
NUMBER_BYTES = 8

_NUMBER = struct.Struct(">Q")
#: frames of each message of a fixed count (REPL and RESYNC: any)
_FRAMES = {HANDOFF: 6, HANDOFF_END: 3, HANDOFF_OK: 2, SYNC: 2, FORGET: 2, MARK: 3, MARK_OK: 2}
_SHORT = struct.Struct(">H")
#: a number's 8 octets (``struct.error`` unless 0 <= number < 2**64)
encode_number = _NUMBER.pack


def decode_number(frame: bytes) -> int:
    """The number in an 8-octet frame; ``RemoteProtocolError`` for another size."""
    if len(frame) != NUMBER_BYTES:
        raise RemoteProtocolError(f"a number is {NUMBER_BYTES} octets, not {len(frame)}")
    return _NUMBER.unpack(frame)[0]


def content_group(group: bytes, table: bytes) -> Optional[str]:
    """The group of content copied or offered by another gateway (its group name and
    its length-prefixed field table, as they travel), or None if they are ill-formed."""
    if len(table) < 2 or _SHORT.unpack_from(table)[0] != len(table) - 2:
        return None
    try:
        name = group.decode("utf-8")
        decode_table(table[2:])
    except (UnicodeDecodeError, ProtocolError):
        return None
    return name if name and valid_string(name) else None


def split_cids(blob: bytes) -> Optional[list[bytes]]:
    """The content ids in an ``MTL-FORGET``'s frame; None unless a whole number of them."""
    if len(blob) % CID_BYTES:
        return None
    return [blob[k:k + CID_BYTES] for k in range(0, len(blob), CID_BYTES)]


# --- messages ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Handoff:
    """One content a standby offers: ``group`` and ``table`` as they travel (check them
    with ``content_group``)."""

    group: bytes
    number: int
    cid: bytes
    table: bytes
    body: bytes


@dataclass(frozen=True, slots=True)
class HandoffEnd:
    """The end of a batch of ``count`` offered contents, the last numbered ``last``."""

    last: int
    count: int


@dataclass(frozen=True, slots=True)
class HandoffOk:
    """The offered batch up to ``number`` is stored and committed."""

    number: int


@dataclass(frozen=True, slots=True)
class Sync:
    """Copy everything: the copy's number, as it travels (echoed in the last mark)."""

    copy: bytes


@dataclass(frozen=True, slots=True)
class Repl:
    """Contents to copy: the frames after the first, four per content (group, cid, field
    table, body; checked by the receiver, which counts an ill-formed content lost)."""

    frames: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Forget:
    """Content ids to delete (confirmed or dropped on the serving gateway), concatenated
    (``split_cids``)."""

    blob: bytes


@dataclass(frozen=True, slots=True)
class Mark:
    """Commit and acknowledge ``number`` (as it travels); ``copy``: the number of the copy
    it ends, or empty."""

    number: bytes
    copy: bytes


@dataclass(frozen=True, slots=True)
class MarkOk:
    """Everything up to mark ``number`` is committed."""

    number: int


@dataclass(frozen=True, slots=True)
class Resync:
    """The receiver fell behind: it joins (or is copied to) again."""


ReplicationMessage = Union[Handoff, HandoffEnd, HandoffOk, Sync, Repl, Forget, Mark, MarkOk,
                           Resync]


def decode(frames: Sequence[bytes]) -> ReplicationMessage:
    """The replication message in a whisper's ``frames``; ``RemoteProtocolError`` unless it is
    a well-formed one."""
    if type(frames) is not list or any(type(frame) is not bytes for frame in frames):
        frames = as_frames(frames, "an MTL replication message")
    if not frames:
        raise RemoteProtocolError("an empty message")
    kind, count = frames[0], len(frames)
    if kind == REPL:
        return Repl(tuple(frames[1:]))
    if kind == RESYNC:
        return Resync()
    need = _FRAMES.get(kind)
    if need is None:
        raise RemoteProtocolError(f"not a replication message: {kind[:20]!r}")
    if count != need:
        raise RemoteProtocolError(f"{kind.decode()} has {count} frames, not {need}")
    if kind == HANDOFF:
        if len(frames[3]) != CID_BYTES:
            raise RemoteProtocolError(f"a content id is {CID_BYTES} octets, not {len(frames[3])}")
        return Handoff(frames[1], decode_number(frames[2]), frames[3], frames[4], frames[5])
    if kind == MARK:
        decode_number(frames[1])
        return Mark(frames[1], frames[2])
    if kind == FORGET:
        return Forget(frames[1])
    if kind == HANDOFF_END:
        return HandoffEnd(decode_number(frames[1]), decode_number(frames[2]))
    if kind == MARK_OK:
        return MarkOk(decode_number(frames[1]))
    if kind == HANDOFF_OK:
        return HandoffOk(decode_number(frames[1]))
    decode_number(frames[1])
    return Sync(frames[1])


# --- builders ---------------------------------------------------------------------

def handoff(group: str, number: int, cid: bytes, table: bytes, body: bytes) -> list[bytes]:
    """An ``MTL-HANDOFF`` (``table`` empty: the empty table)."""
    return [HANDOFF, group.encode("utf-8"), _NUMBER.pack(number), cid, table or EMPTY_TABLE,
            body]


def handoff_end(last: int, count: int) -> list[bytes]:
    """An ``MTL-HANDOFF-END``."""
    return [HANDOFF_END, _NUMBER.pack(last), _NUMBER.pack(count)]


def handoff_ok(number: int) -> list[bytes]:
    """An ``MTL-HANDOFF-OK``."""
    return [HANDOFF_OK, _NUMBER.pack(number)]


def sync(copy: bytes) -> list[bytes]:
    """An ``MTL-SYNC`` asking for copy ``copy`` (``encode_number``)."""
    return [SYNC, copy]


def repl_batches(rows: Iterable[tuple[int, bytes, str, bytes, bytes]], batch: int,
                 size: int) -> Iterator[list[bytes]]:
    """``MTL-REPL`` messages holding ``rows`` (id, cid, group, table, body) in order, at
    most ``batch`` contents and about ``size`` octets each (one content may pass it)."""
    frames: list[bytes] = [REPL]
    octets = 0
    for _, cid, group, table, body in rows:
        frames += (group.encode("utf-8"), cid, table or EMPTY_TABLE, body)
        octets += len(body) + len(table) + 64
        if len(frames) > 4 * batch or octets > size:
            yield frames
            frames, octets = [REPL], 0
    if len(frames) > 1:
        yield frames


def forget_batches(cids: Sequence[bytes], batch: int) -> Iterator[list[bytes]]:
    """``MTL-FORGET`` messages naming ``cids``, at most ``batch`` each."""
    for start in range(0, len(cids), batch):
        yield [FORGET, b"".join(cids[start:start + batch])]


def mark(number: int, copy: bytes = b"") -> list[bytes]:
    """An ``MTL-MARK`` (``copy``: the number of the copy it ends, or empty)."""
    return [MARK, _NUMBER.pack(number), copy]


def mark_ok(number: bytes) -> list[bytes]:
    """An ``MTL-MARK-OK`` for the mark numbered ``number`` (as it came)."""
    return [MARK_OK, number]


def resync() -> list[bytes]:
    """An ``MTL-RESYNC``."""
    return [RESYNC]
