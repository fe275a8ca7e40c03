"""A durable, ordered log of mesh messages in one SQLite file.

How it works
------------
Every message the driver-side service records gets the next **offset** of
the log: an integer that only grows (0, 1, 2, ...), never reused, also after
the lowest offsets have been trimmed or the process restarted. One log holds
the messages of every group the service is in; a reader that wants some
groups filters by group, so the offsets of one group are increasing but not
contiguous.

Messages are stored in **chunks**, one SQLite row per group per append (the
ingest appends whatever arrived since its last append, often thousands of
messages): a row per message would cost the driver several microseconds
each, where a chunk costs a fraction of that, and the log service can hand
chunks to Spark's workers as they are, leaving the decoding to them. ::

    chunks(id INTEGER PRIMARY KEY, grp, lo, hi, count, seqs, data)
        lo, hi  lowest and highest offset in the chunk
        seqs    the offsets, int64 little-endian, increasing
        data    msgpack [2, peers, peer_index, received, payload_ends, payloads,
                         text_ends, texts, text_states]:
                peers = [[sender uuid hex, sender name, headers?], ...]
                (headers: the sender's HELLO headers, a map, when known);
                the rest are columns laid out as Arrow lays them out, little-endian:
                peer_index int32, received float64 (epoch seconds), payloads
                and their texts (``codec.stored_texts``) as one buffer each with
                n + 1 int32 end offsets, and one state octet per text
        newest  the latest ``received`` time in the chunk (time retention)
    meta(key PRIMARY KEY, value)      -- log_id, next (offset), start (trimmed below)
    trimmed(grp PRIMARY KEY, below)   -- messages of grp below ``below`` may be gone
    consumers(id PRIMARY KEY, committed, groups, updated)

Storing the columns in Arrow's layout, and the ``text`` column made once at
ingest, lets a reader build Arrow record batches from a chunk without a
Python object per message. Chunks written by older versions (data: msgpack
``[peers, peer_index, received, payloads]``) are read as well.

``meta.next`` is written in the same transaction as the chunks it covers, so
a reader never sees an offset below ``next`` missing unless it was trimmed.

Trimming is **per group**, as Kafka's retention is per partition: deleting a
group's chunks records, in ``trimmed``, the offset below which that group's
messages may be gone. A reader of some groups has lost data only if one of
*its* groups was trimmed above its position, so a query on one group never
costs a query on another its unread messages, and a quiet group never holds
the rest of the log back. ``meta.start`` is a floor for every group, set by
``trim(before)`` over the whole log (a chunk that straddles it keeps its
older messages on disk until it is wholly below, and readers skip them);
``trim(before, groups)`` records ``before`` as those groups' floor in the
same way when the cut falls inside a chunk. ``group_bounds`` gives each
group's own earliest offset: a read of several groups checks each.
``log_id`` is a random id made when the file is created: a reader that kept
offsets of another log (the file was deleted and made anew) can tell that
its offsets mean nothing here.

A *consumer* (one streaming query) registers where it starts and commits
how far it has processed. ``trim_committed`` deletes, group by group, what
every consumer of that group has committed; consumers that have not
committed for ``consumer_ttl`` seconds stop holding the log back.
``retain(max_age, max_bytes)`` deletes the oldest chunks by time or size,
with or without any query running (Kafka's ``retention.ms`` and
``retention.bytes``).

One ``MessageLog`` object is one SQLite connection: use it from one thread
at a time. Several objects (threads, processes) may open the same file; WAL
lets readers read while one writer writes.

Kept whole: one log (``MessageLog``) and its chunk format, which is the format of its
rows: readers are handed chunks as they are stored.
"""

from __future__ import annotations

import functools
import heapq
import logging
import os
import platform
import sqlite3
import sys
import time
import uuid
from array import array
from bisect import bisect_left
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple, Optional, Sequence, Union

import msgpack

from .codec import TEXT_LATER, stored_texts

__all__ = ["MessageLog", "LogRecord", "Consumer", "Chunk", "DecodedChunk", "encode_chunk",
           "decode_chunk", "host_id"]

_log = logging.getLogger(__name__)

#: (group, sender uuid hex, sender name, received epoch seconds, payload[, sender headers])
LogRecord = tuple
#: (offset, group, sender uuid hex, sender name, received, payload)
LogRow = tuple[int, str, str, str, float, bytes]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY,
    grp TEXT NOT NULL,
    lo INTEGER NOT NULL,
    hi INTEGER NOT NULL,
    count INTEGER NOT NULL,
    seqs BLOB NOT NULL,
    data BLOB NOT NULL,
    newest REAL
);
CREATE INDEX IF NOT EXISTS chunks_by_hi ON chunks (hi);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value);
CREATE TABLE IF NOT EXISTS trimmed (grp TEXT PRIMARY KEY, below INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS consumers (
    id TEXT PRIMARY KEY,
    committed INTEGER NOT NULL,
    groups TEXT NOT NULL,
    updated REAL NOT NULL
);
"""

_SWAP = sys.byteorder != "little"


class Chunk(NamedTuple):
    """One stored chunk, still encoded (what the log service sends to workers)."""

    group: str
    seqs: bytes
    data: bytes


@dataclass(slots=True)
class DecodedChunk:
    """A chunk's messages as columns (buffers in Arrow's layout, native byte order)."""

    group: str
    offsets: array                # array('q'), increasing
    peers: list                   # [[sender hex, name, headers?], ...]
    peer_index: array             # array('i'), one per message
    received: array               # array('d'), epoch seconds, one per message
    payload_ends: array           # array('i'), n + 1 end offsets into payload_data
    payload_data: bytes
    #: the stored ``text`` (``codec.stored_texts``); None for chunks of older versions
    text_ends: Optional[array] = None
    text_data: bytes = b""
    text_states: bytes = b""

    def payloads(self, a: int, b: int) -> list[bytes]:
        """The payloads of messages ``a`` to ``b - 1``."""
        ends, data = self.payload_ends, self.payload_data
        return [data[ends[i]:ends[i + 1]] for i in range(a, b)]


def _column(code: str, blob: bytes) -> array:
    values = array(code)
    values.frombytes(blob)
    if _SWAP:  # pragma: no cover - big-endian hosts
        values.byteswap()
    return values


def _blob(values: array) -> bytes:
    if _SWAP:  # pragma: no cover - big-endian hosts
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def _ends(items: Sequence[bytes]) -> array:
    return array("i", accumulate(map(len, items), initial=0))


def _offsets_blob(offsets: Sequence[int]) -> bytes:
    return _blob(array("q", offsets))


def _offsets(blob: bytes) -> array:
    return _column("q", blob)


def encode_chunk(offsets: Sequence[int], records: Sequence[LogRecord],
                 texts: bool = True) -> tuple[bytes, bytes]:
    """``(seqs, data)`` of one chunk (records of one group, offsets increasing);
    ``texts=False`` leaves every ``text`` to the reader."""
    peers: dict[tuple[str, str], int] = {}
    described: list[list] = []
    index = array("i")
    for record in records:
        key = (record[1], record[2])
        number = peers.get(key)
        if number is None:
            number = peers[key] = len(peers)
            headers = record[5] if len(record) > 5 else None
            described.append([key[0], key[1], headers] if headers else [key[0], key[1]])
        index.append(number)
    payloads = [r[4] for r in records]
    text_data, text_ends = b"", array("i", bytes(4 * (len(payloads) + 1)))
    states = bytes([TEXT_LATER]) * len(payloads)
    if texts:
        try:
            text_data, text_ends, states = stored_texts(payloads)
        except Exception:  # a text is a convenience: it never holds a message back
            _log.warning("making the text of %d messages failed; readers will make them",
                         len(payloads), exc_info=True)
    received = array("d", [r[3] for r in records])
    data = msgpack.packb([2, described, _blob(index), _blob(received), _blob(_ends(payloads)),
                          b"".join(payloads), _blob(text_ends), text_data, states],
                         use_bin_type=True)
    return _offsets_blob(offsets), data


def decode_chunk(chunk: Chunk) -> DecodedChunk:
    """The columns of an encoded chunk."""
    fields = msgpack.unpackb(chunk.data, raw=False)
    if fields[0] == 2:
        _, peers, index, received, payload_ends, payloads, text_ends, texts, states = fields
        return DecodedChunk(chunk.group, _offsets(chunk.seqs), peers, _column("i", index),
                            _column("d", received), _column("i", payload_ends), payloads,
                            _column("i", text_ends), texts, states)
    peers, index, received, payload_list = fields  # written by an older version
    return DecodedChunk(chunk.group, _offsets(chunk.seqs), peers, array("i", index),
                        array("d", received), _ends(payload_list), b"".join(payload_list))


@functools.cache
def host_id() -> str:
    """Names this machine (its kernel's boot id, else its host name): processes that agree
    on it share the file system's locks and memory maps, which SQLite's WAL needs."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return platform.node()


@dataclass(frozen=True, slots=True)
class Consumer:
    """A registered reader of the log (one streaming query)."""

    id: str
    committed: int          #: every offset below this one has been processed
    groups: tuple[str, ...]
    updated: float          #: epoch seconds of its last registration or commit


def _group_filter(groups: Optional[Sequence[str]]) -> tuple[str, list[str]]:
    if not groups:
        return "", []
    return f" AND grp IN ({','.join('?' * len(groups))})", list(groups)


class MessageLog:
    """One connection to the log file at ``path`` (created when missing)."""

    def __init__(self, path: Union[str, os.PathLike[str]], *, timeout: float = 10.0,
                 max_value: Optional[int] = None, readonly: bool = False) -> None:
        """``max_value``: the most bytes one stored value (a chunk) may take; default
        SQLite's own limit (about 1 GB). ``readonly``: open an existing log to read it
        (``sqlite3.OperationalError`` when there is none), never create or write."""
        self.path = Path(path)
        if readonly:
            db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                 timeout=timeout, isolation_level=None,
                                 check_same_thread=False)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None,
                                 check_same_thread=False)
        try:
            if max_value is not None:
                db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_value)
            if not readonly:
                self._create(db)
            self.log_id: str = str(self._meta("log_id", db))
            # SQLite refuses a value longer than this; a chunk carries a few bytes per message
            self.max_payload: int = db.getlimit(sqlite3.SQLITE_LIMIT_LENGTH) - 4096
        except BaseException:
            db.close()
            raise
        self._db = db

    @staticmethod
    def _create(db: sqlite3.Connection) -> None:
        """Make the tables and the log's id unless they exist (a new file gets 64 KiB pages:
        a chunk of a few MB costs about half the CPU to read than from 4 KiB pages)."""
        db.execute("PRAGMA page_size=65536")  # no effect on an existing file
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(chunks)")}
        if "newest" not in columns:  # a log written by an older peermesh
            db.execute("ALTER TABLE chunks ADD COLUMN newest REAL")
            db.execute("UPDATE chunks SET newest = ?", (time.time(),))
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("INSERT OR IGNORE INTO meta VALUES ('log_id', ?)", (uuid.uuid4().hex,))
            db.execute("INSERT OR IGNORE INTO meta VALUES ('next', 0)")
            db.execute("INSERT OR IGNORE INTO meta VALUES ('start', 0)")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    @contextmanager
    def _snapshot(self) -> Iterator[None]:
        """Statements inside read one state of the log (a WAL read transaction)."""
        if self._db.in_transaction:
            yield
            return
        self._db.execute("BEGIN")
        try:
            yield
        finally:
            self._db.execute("COMMIT")

    # --- meta ---------------------------------------------------------------

    def _meta(self, key: str, db: Optional[sqlite3.Connection] = None) -> Any:
        row = (db or self._db).execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0]

    def bounds(self, groups: Optional[Sequence[str]] = None) -> tuple[int, int]:
        """``(earliest, next)``: the lowest of the groups' earliest offsets (see
        ``earliests``; default: of the whole log) and the next offset."""
        with self._snapshot():
            floors, nxt = self.group_bounds(groups)
            return min(floors.values(), default=self.earliest), nxt

    def group_bounds(self, groups: Optional[Sequence[str]] = None
                     ) -> tuple[dict[str, int], int]:
        """``({group: earliest}, next)``: every message of a group with ``earliest <=
        offset < next`` is still held. Each group has its own (trims are per group); a
        reader of several groups has lost data only where one of them starts above it."""
        rows = dict(self._db.execute("SELECT key, value FROM meta WHERE key IN "
                                     "('start', 'next')").fetchall())
        floor = int(rows["start"])
        if not groups:
            return {}, int(rows["next"])
        below = dict(self._db.execute(
            f"SELECT grp, below FROM trimmed WHERE grp IN ({','.join('?' * len(groups))})",
            list(groups)).fetchall())
        return ({g: max(floor, int(below.get(g, floor))) for g in groups},
                int(rows["next"]))

    def _earliest(self, floor: int, groups: Optional[Sequence[str]]) -> int:
        if not groups:
            return floor
        floors, _ = self.group_bounds(groups)
        return min(floors.values())

    @property
    def next_offset(self) -> int:
        """The offset the next appended message gets."""
        return int(self._meta("next"))

    @property
    def earliest(self) -> int:
        """The lowest offset not trimmed (``next_offset`` when nothing was ever kept)."""
        return int(self._meta("start"))

    # --- writing ------------------------------------------------------------

    def append(self, records: Sequence[LogRecord], texts: bool = True) -> tuple[int, int]:
        """Append ``records`` in order, in one transaction; ``(first, next)`` offsets.

        ``texts``: store each message's ``text`` too (else readers make it)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            first = int(self._meta("next"))
            nxt = first + len(records)
            if records:
                by_group: dict[str, tuple[list[int], list[LogRecord]]] = {}
                for offset, record in enumerate(records, first):
                    entry = by_group.get(record[0])
                    if entry is None:
                        entry = by_group[record[0]] = ([], [])
                    entry[0].append(offset)
                    entry[1].append(record)
                for group, (offsets, members) in by_group.items():
                    seqs, data = encode_chunk(offsets, members, texts)
                    db.execute("INSERT INTO chunks (grp, lo, hi, count, seqs, data, newest) "
                               "VALUES (?, ?, ?, ?, ?, ?, ?)",
                               (group, offsets[0], offsets[-1], len(offsets), seqs, data,
                                max(r[3] for r in members)))
                db.execute("UPDATE meta SET value = ? WHERE key = 'next'", (nxt,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return first, nxt

    def trim(self, before: int, groups: Optional[Sequence[str]] = None) -> int:
        """Drop the messages of ``groups`` (default: every group) below offset ``before``;
        the new earliest offset of those groups."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            start, nxt = int(self._meta("start")), int(self._meta("next"))
            before = min(int(before), nxt)
            if not groups:
                if before > start:
                    db.execute("DELETE FROM chunks WHERE hi < ?", (before,))
                    db.execute("UPDATE meta SET value = ? WHERE key = 'start'", (before,))
            else:
                where, args = _group_filter(groups)
                self._delete(f"hi < ?{where}", [before, *args])
                # a chunk that straddles ``before`` keeps its older messages on disk; the
                # group's floor hides them (only where the group held something below)
                floors, _ = self.group_bounds(groups)
                cut = [g for g in groups if floors[g] < before and
                       self._count_group(floors[g], before, g)]
                db.executemany("INSERT INTO trimmed VALUES (?, ?) ON CONFLICT(grp) DO UPDATE "
                               "SET below = max(below, excluded.below)",
                               [(g, before) for g in cut])
            earliest = self._earliest(int(self._meta("start")), groups)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return earliest

    def _delete(self, where: str, args: Sequence[Any]) -> int:
        """Delete the chunks ``where`` holds for (in a transaction); record what each group
        lost in ``trimmed``. How many messages went."""
        db = self._db
        gone = db.execute(f"SELECT grp, max(hi), sum(count) FROM chunks WHERE {where} "
                          "GROUP BY grp", args).fetchall()
        if not gone:
            return 0
        db.execute(f"DELETE FROM chunks WHERE {where}", args)
        db.executemany("INSERT INTO trimmed VALUES (?, ?) ON CONFLICT(grp) DO UPDATE SET "
                       "below = max(below, excluded.below)",
                       [(group, int(hi) + 1) for group, hi, _ in gone])
        return sum(int(count) for _, _, count in gone)

    def retain(self, max_age: Optional[float] = None, max_bytes: Optional[int] = None,
               now: Optional[float] = None) -> int:
        """Delete chunks whose newest message is older than ``max_age`` seconds, then the
        oldest chunks while the log holds more than ``max_bytes``; how many messages went.

        Works with no query running; readers of a group that lost messages they
        had not read see it as data loss (``failOnDataLoss``).
        """
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            removed = 0
            if max_age is not None:
                now = time.time() if now is None else now
                removed += self._delete("newest < ?", [now - max_age])
            if max_bytes is not None:
                (total,) = db.execute("SELECT coalesce(sum(length(data) + length(seqs)), 0) "
                                      "FROM chunks").fetchone()
                excess = int(total) - int(max_bytes)
                if excess > 0:
                    cut, freed = None, 0
                    for chunk_id, size in db.execute("SELECT id, length(data) + length(seqs) "
                                                     "FROM chunks ORDER BY lo, id"):
                        cut, freed = chunk_id, freed + int(size)
                        if freed >= excess:
                            break
                    if cut is not None:
                        (lo,) = db.execute("SELECT lo FROM chunks WHERE id = ?",
                                           (cut,)).fetchone()
                        removed += self._delete("lo < ? OR (lo = ? AND id <= ?)",
                                                [lo, lo, cut])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return removed

    # --- consumers ----------------------------------------------------------

    def register(self, consumer: str, offset: int, groups: Iterable[str] = (),
                 now: Optional[float] = None) -> None:
        """Record a consumer at ``offset`` (a known consumer keeps a higher committed offset)."""
        now = time.time() if now is None else now
        self._db.execute(
            "INSERT INTO consumers VALUES (?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
            "committed = max(committed, excluded.committed), groups = excluded.groups, "
            "updated = excluded.updated",
            (consumer, int(offset), ",".join(groups), now))

    def commit(self, consumer: str, offset: int, groups: Iterable[str] = (),
               now: Optional[float] = None) -> None:
        """``consumer`` has processed every message below ``offset``."""
        self.register(consumer, offset, groups, now)

    def forget(self, consumer: str) -> bool:
        """Stop tracking ``consumer`` (an id, or a ``consumerName``: every query of that
        name); True if it was known."""
        cursor = self._db.execute("DELETE FROM consumers WHERE id = ? OR (instr(id, '#') > 0 "
                                  "AND substr(id, 1, instr(id, '#') - 1) = ?)",
                                  (consumer, consumer))
        return cursor.rowcount > 0

    def consumers(self) -> list[Consumer]:
        """Every registered consumer, by id."""
        rows = self._db.execute("SELECT id, committed, groups, updated FROM consumers "
                                "ORDER BY id").fetchall()
        return [Consumer(r[0], int(r[1]), tuple(g for g in r[2].split(",") if g), float(r[3]))
                for r in rows]

    def trim_committed(self, consumer_ttl: Optional[float] = None,
                       now: Optional[float] = None) -> int:
        """Trim, group by group, what every live consumer of that group has committed;
        how many messages went.

        Consumers silent for more than ``consumer_ttl`` seconds do not count. A
        group no live consumer reads is not trimmed here (a query may still
        start from its earliest offset; ``retain`` bounds it by time or size).
        A consumer registered without groups counts for every group.
        """
        now = time.time() if now is None else now
        live = [c for c in self.consumers()
                if consumer_ttl is None or c.updated >= now - consumer_ttl]
        if not live:
            return 0
        every = min((c.committed for c in live if not c.groups), default=None)
        lowest: dict[str, int] = {}
        for consumer in live:
            for group in consumer.groups:
                lowest[group] = min(lowest.get(group, consumer.committed), consumer.committed)
        if every is not None:
            for group in self.groups():
                lowest[group] = min(lowest.get(group, every), every)
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            removed = sum(self._delete("grp = ? AND hi < ?", [group, before])
                          for group, before in sorted(lowest.items()))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return removed

    # --- reading ------------------------------------------------------------

    def chunks(self, start: int, end: int, groups: Optional[Sequence[str]] = None,
               max_bytes: Optional[int] = None) -> tuple[list[Chunk], int]:
        """Chunks holding offsets in ``[start, end)`` of those groups, by lowest offset,
        and ``resume``: every message of the range below ``resume`` is in those chunks.

        ``resume`` is ``end`` unless ``max_bytes`` cut the list short; then it is
        the lowest offset of the first chunk left out. Chunks may hold offsets
        outside ``[start, resume)``: readers filter.
        """
        with self._snapshot():
            return self._chunks(start, end, groups, max_bytes)

    def _chunks(self, start: int, end: int, groups: Optional[Sequence[str]],
                max_bytes: Optional[int]) -> tuple[list[Chunk], int]:
        where, args = _group_filter(groups)
        # the blobs are read one chunk at a time, after the sort: sorting rows that carry
        # them would copy every chunk of the range into a temporary tree on each call
        found = self._db.execute(
            f"SELECT id, lo, length(data) + length(seqs) FROM chunks WHERE hi >= ? AND lo < ?"
            f"{where} ORDER BY lo", [int(start), int(end), *args]).fetchall()
        result: list[Chunk] = []
        size = 0
        resume = int(end)
        for chunk_id, lo, length in found:
            if max_bytes is not None and result and size + length > max_bytes and lo > start:
                resume = int(lo)
                break
            row = self._db.execute("SELECT grp, seqs, data FROM chunks WHERE id = ?",
                                   (chunk_id,)).fetchone()
            result.append(Chunk(*row))
            size += length
        return result, resume

    def fetch(self, start: int, end: int, groups: Optional[Sequence[str]] = None,
              max_bytes: Optional[int] = None) -> dict[str, Any]:
        """What a ``FETCH`` of ``[start, end)`` answers (see ``protocol``): the log's id
        and bounds, the chunks holding the range from ``earliest`` on (at most about
        ``max_bytes``) and where the next fetch resumes."""
        with self._snapshot():  # bounds and chunks as of one moment
            floors, nxt = self.group_bounds(groups)
            earliest = min(floors.values(), default=self.earliest)
            first, last = max(start, earliest), min(end, nxt)
            chunks, resume = self._chunks(first, last, groups, max_bytes)
        return {"log": self.log_id, "earliest": earliest, "next": nxt, "chunks": chunks,
                "floors": floors,
                "resume": max(start, resume) if last > first else max(start, last)}

    def _offset_lists(self, start: int, end: int, groups: Optional[Sequence[str]],
                      descending: bool = False) -> Iterator[tuple[int, int, array]]:
        """``(lo, hi, offsets)`` of the chunks touching the range."""
        where, args = _group_filter(groups)
        order = "hi DESC" if descending else "lo"
        for lo, hi, seqs in self._db.execute(
                f"SELECT lo, hi, seqs FROM chunks WHERE hi >= ? AND lo < ?{where} "
                f"ORDER BY {order}", [int(start), int(end), *args]):
            yield int(lo), int(hi), _offsets(seqs)

    def last_offset(self, start: int, end: int,
                    groups: Optional[Sequence[str]] = None) -> Optional[int]:
        """The highest offset in ``[start, end)`` of a message in those groups, or None."""
        best: Optional[int] = None
        for lo, hi, offsets in self._offset_lists(start, end, groups, descending=True):
            if best is not None and hi <= best:
                break
            if hi < end:
                candidate = hi
            else:
                i = bisect_left(offsets, end)
                if not i or offsets[i - 1] < start:
                    continue
                candidate = offsets[i - 1]
            if candidate >= start and (best is None or candidate > best):
                best = candidate
        return best

    def nth_offset(self, start: int, end: int, n: int,
                   groups: Optional[Sequence[str]] = None) -> Optional[int]:
        """The offset of the ``n``-th message (1-based) in ``[start, end)`` of those groups,
        or None when there are fewer."""
        if n < 1:
            raise ValueError("n must be at least 1")
        found: list[int] = []   # a max-heap (negated) of the n smallest offsets seen
        for lo, hi, offsets in self._offset_lists(start, end, groups):
            if len(found) >= n and lo > -found[0]:
                break  # chunks come by lowest offset: nothing smaller can follow
            a, b = bisect_left(offsets, start), bisect_left(offsets, end)
            for offset in offsets[a:b]:
                if len(found) < n:
                    heapq.heappush(found, -offset)
                elif offset < -found[0]:
                    heapq.heapreplace(found, -offset)
                else:
                    break  # increasing within a chunk
        return -found[0] if len(found) >= n else None

    def count(self, start: int, end: int, groups: Optional[Sequence[str]] = None) -> int:
        """How many messages of those groups ``[start, end)`` holds (from each group's
        earliest offset on)."""
        with self._snapshot():
            if not groups:
                return self._count(max(start, self.earliest), end, None)
            floors, _ = self.group_bounds(groups)
            return sum(self._count_group(max(start, floors[g]), end, g) for g in groups)

    def _count_group(self, start: int, end: int, group: str) -> int:
        return self._count(start, end, [group])

    def _count(self, start: int, end: int, groups: Optional[Sequence[str]]) -> int:
        total = 0
        for lo, hi, offsets in self._offset_lists(start, end, groups):
            if lo >= start and hi < end:
                total += len(offsets)
            else:
                total += bisect_left(offsets, end) - bisect_left(offsets, start)
        return total

    def read(self, start: int, end: int, groups: Optional[Sequence[str]] = None,
             limit: Optional[int] = None) -> list[LogRow]:
        """Messages with ``start <= offset < end`` in those groups, in offset order (at most
        ``limit``): ``(offset, group, sender, name, received, payload)``."""
        with self._snapshot():
            floors, _ = self.group_bounds(groups)
            start = max(int(start), min(floors.values(), default=self.earliest))
            chunks, _ = self._chunks(start, end, groups, None)
        rows = sorted((r for r in rows_of(chunks, start, end) if r[0] >= floors.get(r[1], 0)),
                      key=lambda r: r[0])
        return rows if limit is None else rows[:limit]

    def offset_at(self, when: float, groups: Optional[Sequence[str]] = None) -> int:
        """The offset of the first message of ``groups`` received at or after ``when``
        (epoch seconds), or the next offset when there is none."""
        where, args = _group_filter(groups)
        earliest, nxt = self.bounds(groups)
        best: Optional[int] = None
        for group, seqs, data, lo in self._db.execute(
                f"SELECT grp, seqs, data, lo FROM chunks WHERE newest >= ? AND hi >= ?{where} "
                "ORDER BY lo", [float(when), earliest, *args]):
            if best is not None and lo > best:
                break  # chunks come by lowest offset: nothing earlier can follow
            decoded = decode_chunk(Chunk(group, seqs, data))
            for offset, received in zip(decoded.offsets, decoded.received):
                if offset >= earliest and received >= when:
                    best = offset if best is None else min(best, offset)
                    break
        return nxt if best is None else best

    def groups(self) -> list[str]:
        """The groups that have messages in the log."""
        return [r[0] for r in self._db.execute("SELECT DISTINCT grp FROM chunks ORDER BY grp")]

    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    def __enter__(self) -> "MessageLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<MessageLog {self.path} {self.log_id[:8]}>"


def rows_of(chunks: Iterable[Chunk], start: int, end: int) -> Iterator[LogRow]:
    """The messages of ``chunks`` with ``start <= offset < end`` (chunk by chunk)."""
    for chunk in chunks:
        decoded = decode_chunk(chunk)
        offsets = decoded.offsets
        a, b = bisect_left(offsets, start), bisect_left(offsets, end)
        peers, index, received = decoded.peers, decoded.peer_index, decoded.received
        for i, payload in zip(range(a, b), decoded.payloads(a, b)):
            sender, name = peers[index[i]][:2]
            yield offsets[i], chunk.group, sender, name, received[i], payload
