"""Durable content for MTL ``confirm: full``: one SQLite file (stdlib ``sqlite3``, WAL mode).

How it works
------------
``ContentStore(path)`` opens (or creates) the file. A gateway's is
``<data dir>/mtl.sqlite3``, or ``mtl-<name>.sqlite3`` when its node has a
configured name (``gateway_store_path``): named by something that stays the
same, so a restarted gateway finds what it stored. ``open_gateway_store``
opens it and takes in stores of the earlier default name,
``mtl-<6 hex digits>.sqlite3`` (named after a random node name): the one
such store is renamed, several are copied in and removed, so an upgrade
loses none of their content. The gateway holds a lock on ``<store>.lock`` while it runs:
a second gateway of the same name and data directory is refused rather than
handing out the same content again. Each stored content is
one row of ``mtl_content``: an id that only grows (never reused), the
resource it was written to, its properties (the encoded field table, opaque
here) and its body. A resource's content is a queue, handed out in id order:

* ``append(resource, body, properties)`` stages content and returns its id;
  ``commit()`` writes everything staged (one ``executemany`` and one
  transaction) and only then makes it available to readers.
* ``take(lease, resource, limit)`` hands pending content to a reader lease
  as ``Delivery`` values, numbered by the lease's own content sequence
  (1, 2, ...: the sequence the reader confirms with).
* ``confirm(lease, sequence, multiple)`` deletes what the lease confirms
  (``multiple``: everything it holds up to and including ``sequence``);
  ``reject(..., recycle=True)`` puts it back to be handed out again, before
  anything newer; ``reject(..., recycle=False)`` deletes it (drops it).
  ``release(lease)`` puts back everything a lease holds (the client left,
  or its lease ended). Sequences the lease does not hold are ignored.

What is handed out, and to which lease, lives in memory only: after a
restart every stored content is pending again, in id order. So content is
delivered at least once and, once its confirm is committed, never again.

Content ids across gateways
---------------------------
Each store has an ``origin``, a random 63-bit number made with the file.
Every content has a 16-byte content id (``cid``): the origin of the store
that first took it and its id there (8 octets each, big-endian). A copy
stored from another gateway (``append(..., cid=...)``: a replica or a
handover) keeps its cid, and the store remembers, per origin, the highest
id it ever took from it (``mtl_marks``). ``knows(cid)`` is True for a
content held here or, by that mark, seen before and deleted since: a second
copy, or a copy of something a reader already confirmed, is not stored
again. With ``record`` set, ``commit`` lists what it wrote in ``committed``
and confirms and drops list their cids in ``deleted``, for the gateway to
replicate; ``snapshot`` reads committed content in id order, ``forget``
deletes by cid.

Commit policy (group commit)
----------------------------
Nothing commits on its own: the caller (the gateway's driver) calls
``commit()`` once per batch of commands it drained from its sockets, and
sends writers their Confirm only after that commit returned. So nothing
acknowledged is lost when the process is killed (WAL with
``synchronous=NORMAL``: a commit is one ``write`` of the WAL, which survives
the process, not a power cut before the next checkpoint; pass
``synchronous="FULL"`` for that, at one ``fsync`` per commit). Confirms and
drops take effect in memory at once and reach the file with the next
commit: a crash in between hands that content out again. Checkpoints (they
``fsync``) run every half second in a thread of their own, on a connection
of their own, so a commit never waits for the disk.

Bounds
------
Every content counts ``len(body) + len(properties) + OVERHEAD`` bytes while
it is stored (staged, pending or handed out). ``append`` raises
``StoreFull`` (and stores nothing) when the content would take the
resource past ``max_resource_bytes`` (default 64 MiB) or the whole store
past ``max_bytes`` (default 256 MiB); the gateway rejects that content and
the writer may retry once readers have confirmed some. Memory holds about
150 bytes per stored content (its id, size and resource; about 150 more for
a copy from another store, its content id), so ``max_bytes`` bounds it too:
with the defaults at most about 1.6 million contents, ~240-480 MB. One mark
per other store that content came from (a handful of gateways).

What is watched (the gateway's metrics): ``stored`` and ``confirmed`` count
contents committed and confirmed; ``count``, ``size`` and ``handed_out`` say
what is there; ``oldest_age()`` is how long the oldest stored content has waited
for its confirm, from the time of the commit that wrote it (or from the start,
for content stored before). One time is kept per commit, at most
``_COMMIT_TIMES`` of them (thinned by half, keeping the oldest, when more):
past that the age is read from an older commit, so it may be overstated,
never understated.

Kept whole: one store (``ContentStore``) and how its file is named, locked and taken
over from earlier names: all of it is the one schema's life cycle.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import secrets
import sqlite3
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import StoreError
from .errors import MtlError
from ..storefile import WalCheckpointer, open_store

__all__ = ["ContentStore", "Delivery", "StoreFull", "store_path", "gateway_store_path",
           "open_gateway_store", "make_cid", "split_cid",
           "CID_BYTES", "OVERHEAD", "MAX_BYTES", "MAX_RESOURCE_BYTES"]

log = logging.getLogger(__name__)

OVERHEAD = 64                          # bytes each content counts besides body and properties
MAX_BYTES = 256 * 1024 * 1024          # default bound of the whole store
MAX_RESOURCE_BYTES = 64 * 1024 * 1024  # default bound of one resource
_CHECKPOINT_EVERY = 0.5                # seconds between WAL checkpoints (background thread)
_READ_CHUNK = 500                      # ids per SELECT (below SQLite's variable limit)
_COMMIT_TIMES = 1024                   # commit times kept for ``oldest_age``

_SCHEMA = """
CREATE TABLE IF NOT EXISTS mtl_content (
    id         INTEGER PRIMARY KEY,
    resource   TEXT NOT NULL,
    properties BLOB NOT NULL,
    body       BLOB NOT NULL,
    cid        BLOB                 -- NULL: taken here first (origin, id)
);
CREATE TABLE IF NOT EXISTS mtl_meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS mtl_marks (
    origin INTEGER PRIMARY KEY,     -- another store's origin
    last   INTEGER NOT NULL         -- the highest of its ids ever stored here
);
"""

#: a content id: the origin of the store that first took it, and its id there
CID_BYTES = 16


def make_cid(origin: int, content_id: int) -> bytes:
    """The 16-byte content id of ``content_id`` taken first by the store ``origin``."""
    return origin.to_bytes(8, "big") + content_id.to_bytes(8, "big")


def split_cid(cid: bytes) -> tuple[int, int]:
    """(origin, id) of a content id."""
    return int.from_bytes(cid[:8], "big"), int.from_bytes(cid[8:], "big")


class StoreFull(MtlError):
    """Appending would take a resource or the store past its bound; nothing was stored."""


def store_path(data_dir: os.PathLike[str] | str, name: str) -> Path:
    """``<data_dir>/mtl-<name>.sqlite3`` (the name made safe for a file name)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name) or "gateway"
    return Path(data_dir) / f"mtl-{safe}.sqlite3"


#: the store name gateways without a configured name once used: their random node name
_EARLIER_DEFAULT = re.compile(r"mtl-[0-9A-F]{6}\.sqlite3")


def gateway_store_path(data_dir: os.PathLike[str] | str, name: Optional[str]) -> Path:
    """A gateway's store: ``mtl-<name>.sqlite3`` for a configured node ``name``, else
    ``mtl.sqlite3`` (the data directory alone names it)."""
    return store_path(data_dir, name) if name else Path(data_dir) / "mtl.sqlite3"


def open_gateway_store(data_dir: os.PathLike[str] | str, name: Optional[str],
                       **options: Any) -> ContentStore:
    """The ``ContentStore`` at ``gateway_store_path``; without a ``name``, with the
    content of stores of the earlier default name taken in (see the module doc)."""
    path = gateway_store_path(data_dir, name)
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    lock = _lock(path)
    earlier = [] if name else sorted(
        p for p in Path(data_dir).glob("mtl-*.sqlite3") if _EARLIER_DEFAULT.fullmatch(p.name))
    if len(earlier) == 1 and not path.exists():
        _checkpointed(earlier[0])
        os.replace(earlier[0], path)
        log.warning("MTL content store %s renamed %s (a restart finds it there)",
                    earlier[0], path)
        earlier = []
    try:
        store = ContentStore(path, **options)
    except BaseException:
        os.close(lock)
        raise
    store.lock = lock
    try:
        for old in earlier:
            _take_in(store, old)
    except BaseException:
        store.close()
        raise
    return store


def _lock(path: Path) -> int:
    """An exclusive lock on ``<path>.lock`` (its descriptor), held while the gateway runs:
    two gateways must not serve one store; StoreError if another holds it."""
    import fcntl

    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StoreError(f"the MTL content store {path} is in use by another gateway; give "
                         "each gateway of a data directory its own name (--name)") from None
    return fd


def _checkpointed(path: Path) -> None:
    """Write ``path``'s WAL into it (its -wal and -shm files go), so it can be moved."""
    db = sqlite3.connect(str(path), isolation_level=None)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("PRAGMA journal_mode=DELETE")
    finally:
        db.close()


def _take_in(store: ContentStore, path: Path) -> None:
    """Copy every content of the store at ``path`` into ``store`` (keeping its content
    ids), then remove that file; left in place if it does not fit."""
    old = ContentStore(path)
    copied, after = 0, 0
    try:
        while True:
            rows, after = old.snapshot(after, 256)
            if not rows:
                break
            for _, cid, resource, properties, body in rows:
                if not store.knows(cid):
                    store.append(resource, body, properties, cid=cid)
                    copied += 1
            store.commit()
    except StoreFull as exc:
        store.commit()
        log.warning("MTL content store %s: not all of %s fits (%s); that file is kept",
                    store.path, path, exc)
        return
    finally:
        old.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    log.warning("MTL content store %s took in %d content(s) of %s (removed)", store.path,
                copied, path)


@dataclass(frozen=True, slots=True)
class Delivery:
    """Content handed to a reader lease: ``sequence`` is the lease's, ``id`` the store's."""

    sequence: int
    id: int
    resource: str
    properties: bytes
    body: bytes


@dataclass(slots=True)
class _Queue:
    """One resource: pending ids (``back``: put back, sorted, all older than ``fresh``)."""

    fresh: deque[int] = field(default_factory=deque)
    back: list[int] = field(default_factory=list)
    size: int = 0          # bytes of every stored content of the resource

    def __len__(self) -> int:
        return len(self.fresh) + len(self.back)

    def pop(self, limit: int) -> list[int]:
        ids = self.back[:limit]
        del self.back[:limit]
        while len(ids) < limit and self.fresh:
            ids.append(self.fresh.popleft())
        return ids

    def put_back(self, content_id: int) -> None:
        bisect.insort(self.back, content_id)


@dataclass(slots=True)
class _Lease:
    """What one reader lease holds: its sequence -> (content id, resource), in order."""

    held: OrderedDict[int, tuple[int, str]] = field(default_factory=OrderedDict)
    next_sequence: int = 1


class ContentStore:
    """The gateway's durable content. Use it from one thread; see the module doc."""

    def __init__(self, path: os.PathLike[str] | str, *, max_bytes: int = MAX_BYTES,
                 max_resource_bytes: int = MAX_RESOURCE_BYTES,
                 synchronous: str = "NORMAL") -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.max_resource_bytes = max_resource_bytes
        self.size = 0                                   # bytes of every stored content
        self.commits = 0
        self._queues: dict[str, _Queue] = {}
        self._sizes: dict[int, tuple[int, str]] = {}    # id -> (bytes it counts, resource)
        self._leases: dict[str, _Lease] = {}
        self._staged: list[tuple[int, str, bytes, bytes, Optional[bytes]]] = []
        self._doomed: list[tuple[int]] = []             # ids to delete at the next commit
        self._foreign: dict[bytes, int] = {}            # cid -> id, of copies from elsewhere
        self._cids: dict[int, bytes] = {}               # id -> cid, of the same
        self._marks: dict[int, int] = {}                # origin -> highest id taken from it
        #: set by a replicating gateway: ``committed`` and ``deleted`` are kept for it
        self.record = False
        #: (id, cid, resource, properties, body) written by the commits since last emptied
        self.committed: list[tuple[int, bytes, str, bytes, bytes]] = []
        #: cids confirmed or dropped since last emptied
        self.deleted: list[bytes] = []
        #: a descriptor holding the gateway's lock on the file (``open_gateway_store``)
        self.lock: Optional[int] = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = self._open(self.path, synchronous)
        self.origin, self._next_id = self._load()
        #: contents committed, and confirmed by readers, since the store opened
        self.stored = 0
        self.confirmed = 0
        #: (first id a commit wrote, its monotonic time), oldest first (``oldest_age``)
        self._commit_times: list[tuple[int, float]] = [(0, time.monotonic())]
        self._checkpointer = WalCheckpointer(self.path, _CHECKPOINT_EVERY)

    @staticmethod
    def _open(path: Path, synchronous: str) -> sqlite3.Connection:
        def migrate(db: sqlite3.Connection) -> None:
            columns = {row[1] for row in db.execute("PRAGMA table_info(mtl_content)")}
            if "cid" not in columns:           # a store made before content ids
                db.execute("ALTER TABLE mtl_content ADD COLUMN cid BLOB")
            db.execute("SELECT id, resource, properties, body, cid FROM mtl_content LIMIT 0")
        return open_store(path, "MTL content store", {"mtl_content"}, _SCHEMA,
                          synchronous=synchronous, migrate=migrate)

    def _load(self) -> tuple[int, int]:
        """Every stored content pending again, in id order; the origin and the next id."""
        rows = self._db.execute("SELECT id, resource, length(body) + length(properties), cid "
                                "FROM mtl_content ORDER BY id")
        last = 0
        for content_id, resource, length, cid in rows:
            size = length + OVERHEAD
            queue = self._queue(resource)
            queue.fresh.append(content_id)
            queue.size += size
            self._sizes[content_id] = (size, resource)
            self.size += size
            if cid is not None:
                self._foreign[bytes(cid)] = content_id
                self._cids[content_id] = bytes(cid)
            last = content_id
        self._marks = dict(self._db.execute("SELECT origin, last FROM mtl_marks"))
        meta = dict(self._db.execute("SELECT key, value FROM mtl_meta"))
        origin = meta.get("origin")
        if origin is None:
            origin = secrets.randbits(63) or 1
            self._db.execute("INSERT INTO mtl_meta (key, value) VALUES ('origin', ?)", (origin,))
        return origin, max(last, meta.get("last_id", 0)) + 1

    def _queue(self, resource: str) -> _Queue:
        queue = self._queues.get(resource)
        if queue is None:
            queue = self._queues[resource] = _Queue()
        return queue

    def close(self) -> None:
        """Commit, then close the file (after a last checkpoint); release ``lock``."""
        try:
            self.commit()
            self._checkpointer.stop()
            self._db.close()
        finally:
            if self.lock is not None:
                os.close(self.lock)
                self.lock = None

    # --- writing ---------------------------------------------------------

    def append(self, resource: str, body: bytes, properties: bytes = b"",
               cid: Optional[bytes] = None) -> int:
        """Stage content for ``resource``; its id. Readers see it after ``commit()``.

        ``cid``: the content id of a copy from another store (see the module
        doc); the caller checks ``knows(cid)`` first. StoreFull if it does not fit."""
        size = len(body) + len(properties) + OVERHEAD
        queue = self._queues.get(resource)
        held = queue.size if queue is not None else 0
        if held + size > self.max_resource_bytes:
            raise StoreFull(f"resource {resource!r} holds {held} bytes; {size} more would "
                            f"pass its bound of {self.max_resource_bytes}")
        if self.size + size > self.max_bytes:
            raise StoreFull(f"the store holds {self.size} bytes; {size} more would pass its "
                            f"bound of {self.max_bytes}")
        if queue is None:
            queue = self._queue(resource)
        content_id = self._next_id
        self._next_id += 1
        if cid is not None:
            self._foreign[cid] = content_id
            self._cids[content_id] = cid
        self._staged.append((content_id, resource, properties, body, cid))
        self._sizes[content_id] = (size, resource)
        queue.size += size
        self.size += size
        return content_id

    def commit(self) -> None:
        """Write what was staged, confirmed and dropped; then staged content is pending.

        An error (disk full, I/O) rolls the transaction back, un-stages what
        was appended (so nothing that was not written is ever acknowledged)
        and raises StoreError; confirms and drops stay due for the next commit."""
        if not self._staged and not self._doomed:
            return
        staged, doomed = self._staged, self._doomed
        self._staged = []
        try:
            self._db.execute("BEGIN")
            if staged:
                self._db.executemany("INSERT INTO mtl_content (id, resource, properties, body, "
                                     "cid) VALUES (?, ?, ?, ?, ?)", staged)
                marks = self._new_marks(staged)
                if marks:
                    self._db.executemany("INSERT OR REPLACE INTO mtl_marks (origin, last) "
                                         "VALUES (?, ?)", marks.items())
            if doomed:
                self._db.executemany("DELETE FROM mtl_content WHERE id = ?", doomed)
                if (self._next_id - 1,) in doomed:   # the newest goes: keep its id apart
                    self._db.execute("INSERT OR REPLACE INTO mtl_meta (key, value) "
                                     "VALUES ('last_id', ?)", (self._next_id - 1,))
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            for content_id, resource, _, _, _ in staged:
                self._discard(content_id)
            raise StoreError(f"commit to {self.path} failed: {exc}; {len(staged)} appended "
                             "content(s) not stored") from None
        self._doomed = []
        self.commits += 1
        if staged:
            self._marks.update(marks)
            self.stored += len(staged)
            times = self._commit_times
            times.append((staged[0][0], time.monotonic()))
            if len(times) > _COMMIT_TIMES:
                del times[1::2]
        for content_id, resource, properties, body, cid in staged:
            if content_id in self._sizes:     # (unless forgotten meanwhile)
                self._queues[resource].fresh.append(content_id)
                if self.record:
                    self.committed.append((content_id, cid or make_cid(self.origin, content_id),
                                           resource, properties, body))

    def _new_marks(self, staged: list[tuple[int, str, bytes, bytes, Optional[bytes]]]
                   ) -> dict[int, int]:
        marks: dict[int, int] = {}
        for row in staged:
            cid = row[4]
            if cid is not None:
                origin, number = split_cid(cid)
                if number > marks.get(origin, self._marks.get(origin, 0)):
                    marks[origin] = number
        return marks

    # --- content ids --------------------------------------------------------

    def cid(self, content_id: int) -> bytes:
        """The content id of stored content ``content_id``."""
        return self._cids.get(content_id) or make_cid(self.origin, content_id)

    def knows(self, cid: bytes) -> bool:
        """True if content ``cid`` is held here, or was and is deleted (see the module doc)."""
        origin, number = split_cid(cid)
        if origin == self.origin:
            return number < self._next_id
        return cid in self._foreign or number <= self._marks.get(origin, 0)

    def forget(self, cids: "list[bytes]") -> int:
        """Delete the contents with these content ids (those held here); how many."""
        gone = 0
        for cid in cids:
            origin, number = split_cid(cid)
            content_id = number if origin == self.origin else self._foreign.get(cid)
            if content_id is not None and content_id in self._sizes:
                self._doomed.append((content_id,))
                self._discard(content_id)
                gone += 1
        return gone

    def snapshot(self, after: int, limit: int
                 ) -> tuple[list[tuple[int, bytes, str, bytes, bytes]], int]:
        """Up to ``limit`` committed contents with an id above ``after``, in id order, as
        (id, cid, resource, properties, body); and the id to continue after."""
        rows = self._db.execute("SELECT id, resource, properties, body FROM mtl_content "
                                "WHERE id > ? ORDER BY id LIMIT ?", (after, limit)).fetchall()
        out = [(i, self.cid(i), r, bytes(p), bytes(b)) for i, r, p, b in rows
               if i in self._sizes]
        return out, rows[-1][0] if rows else after

    def all_cids(self) -> set[bytes]:
        """The content ids of everything stored."""
        return {self.cid(i) for i in self._sizes}

    # --- reading ----------------------------------------------------------

    def take(self, lease: str, resource: str, limit: int) -> list[Delivery]:
        """Up to ``limit`` pending contents of ``resource``, oldest first, now held by
        ``lease`` (numbered by its content sequence)."""
        queue = self._queues.get(resource)
        if queue is None or limit < 1:
            return []
        ids = [i for i in queue.pop(limit) if i in self._sizes]
        while len(ids) < limit and queue:   # (some were forgotten: take more)
            ids += [i for i in queue.pop(limit - len(ids)) if i in self._sizes]
        if not ids:
            return []
        rows: dict[int, tuple[bytes, bytes]] = {}
        for start in range(0, len(ids), _READ_CHUNK):
            chunk = ids[start:start + _READ_CHUNK]
            rows.update((i, (p, b)) for i, p, b in self._db.execute(
                f"SELECT id, properties, body FROM mtl_content WHERE id IN "
                f"({', '.join('?' * len(chunk))})", chunk))
        held = self._leases.get(lease)
        if held is None:
            held = self._leases[lease] = _Lease()
        deliveries = []
        for content_id in ids:
            row = rows.get(content_id)
            if row is None:        # never happens while this store is the file's only user
                log.warning("content %d of %r vanished from %s", content_id, resource, self.path)
                self._discard(content_id)
                continue
            sequence = held.next_sequence
            held.next_sequence += 1
            held.held[sequence] = (content_id, resource)
            deliveries.append(Delivery(sequence, content_id, resource, bytes(row[0]),
                                       bytes(row[1])))
        return deliveries

    def confirm(self, lease: str, sequence: int, multiple: bool = False) -> int:
        """Delete what ``lease`` confirms; how many contents that was."""
        picked = self._pick(lease, sequence, multiple)
        for content_id, resource in picked:
            self._delete(content_id)
        self.confirmed += len(picked)
        return len(picked)

    def reject(self, lease: str, sequence: int, multiple: bool = False,
               recycle: bool = False) -> int:
        """Hand what ``lease`` rejects out again (``recycle``) or drop it; how many."""
        picked = self._pick(lease, sequence, multiple)
        for content_id, resource in picked:
            if content_id not in self._sizes:
                continue                        # forgotten meanwhile
            if recycle:
                self._queues[resource].put_back(content_id)
            else:
                self._delete(content_id)
        return len(picked)

    def release(self, lease: str) -> int:
        """Put back everything ``lease`` holds and forget the lease; how many."""
        held = self._leases.pop(lease, None)
        if held is None:
            return 0
        for content_id, resource in held.held.values():
            if content_id in self._sizes:
                self._queues[resource].put_back(content_id)
        return len(held.held)

    def _pick(self, lease: str, sequence: int, multiple: bool) -> list[tuple[int, str]]:
        held = self._leases.get(lease)
        if held is None:
            return []
        if not multiple:
            one = held.held.pop(sequence, None)
            return [one] if one is not None else []
        picked = []
        while held.held:
            first = next(iter(held.held))
            if first > sequence:
                break
            picked.append(held.held.pop(first))
        return picked

    def _delete(self, content_id: int) -> None:
        if content_id not in self._sizes:
            return                              # forgotten meanwhile
        if self.record:
            self.deleted.append(self.cid(content_id))
        self._doomed.append((content_id,))
        self._discard(content_id)

    def _discard(self, content_id: int) -> None:
        """Stop counting a content that is gone (the resource too once it holds none)."""
        entry = self._sizes.pop(content_id, None)
        if entry is None:
            return
        size, resource = entry
        cid = self._cids.pop(content_id, None)
        if cid is not None:
            del self._foreign[cid]
        self.size -= size
        queue = self._queues[resource]
        queue.size -= size
        if not queue.size:
            del self._queues[resource]

    # --- what is there ------------------------------------------------------

    def pending(self, resource: str) -> int:
        """How many contents of ``resource`` wait to be handed out (committed ones)."""
        queue = self._queues.get(resource)
        return len(queue) if queue is not None else 0

    def held(self, lease: str) -> int:
        """How many contents ``lease`` holds unconfirmed."""
        held = self._leases.get(lease)
        return len(held.held) if held is not None else 0

    @property
    def handed_out(self) -> int:
        """How many contents readers hold unconfirmed (every lease)."""
        return sum(len(held.held) for held in self._leases.values())

    def oldest_age(self) -> float:
        """Seconds the oldest stored content has waited (0 when none, or only staged
        content): see the module doc. Reads the whole table of sizes in the worst case:
        for a scrape, not for every message."""
        oldest = next(iter(self._sizes), None)
        if oldest is None or self._staged and oldest >= self._staged[0][0]:
            return 0.0
        times = self._commit_times
        at = bisect.bisect_right(times, (oldest, float("inf"))) - 1
        del times[:max(at, 0)]  # commits whose content is all gone
        return time.monotonic() - times[0][1] if times else 0.0

    def resources(self) -> list[str]:
        """Resources that hold content."""
        return sorted(self._queues)

    @property
    def count(self) -> int:
        """How many contents are stored (staged, pending or handed out)."""
        return len(self._sizes)
