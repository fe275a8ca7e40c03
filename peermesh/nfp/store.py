"""Job persistence: one SQLite file per node (stdlib ``sqlite3``, WAL mode).

How it works
------------
``JobStore(path)`` opens (or creates) the node's file. Two tables share it:

* ``worker_jobs`` - jobs this node's workers accepted, keyed by (worker, job
  UUID): the POST body, the state, the result and the times. A job is
  written when it is accepted (before the 202 goes out) and again when it
  finishes, each in its own transaction, so a worker killed with SIGKILL
  finds every accepted job on restart: finished ones answer GET as before,
  unfinished ones are run again (workers are idempotent, per the spec).
* ``client_jobs`` - jobs this node's client posted: service, task, target,
  the workers that accepted it, the last known state and (optionally) the
  result.

WAL with ``synchronous=NORMAL``: a commit is one ``write`` to the WAL, which
survives the process being killed (not a power cut before the next
checkpoint). Checkpoints, which fsync, run every half second in a thread of
their own (with their own connection), so a commit on the hub never waits
for the disk. Finished jobs older than ``retention`` seconds are removed by
``purge`` (the overlay calls it periodically; the search runs in a thread,
see there); unfinished jobs are never purged (the age counts from the job's
creation and its end alike). Times are wall-clock (``time.time``) so they
mean something after a restart.

Group commit, and the durability rule
-------------------------------------
Writes are not committed one by one: the first write opens a transaction,
later ones join it. Everything that tells another process a write happened
goes through ``after_commit(fn, ...)``, which runs ``fn`` at once when
nothing is pending and otherwise right after the commit, in order. While
something waits that way the transaction is committed when the node's hub
is next idle (nothing else ready to run), or ``commit_delay`` seconds after
the first wait if the hub never gets idle (under load); while nothing waits
(a client's own records) it is committed ``lazy_delay`` seconds after it
was opened, so a busy client commits once per many jobs; ``commit()`` and
``close()`` commit at once. So:

* **Workers never acknowledge what is not durably written**: a 202 is sent
  only once the accepted job is committed, a result (final EVENT, or 200 to
  a GET) only once it is committed, a DELETE's outcome once committed. A
  job that finishes before the hub is idle is accepted and finished in one
  commit, and its 202 leaves with the result.
* **Clients' own records** (what they posted, the last answer) are kept in
  memory first, one merged row per job, and written at the next commit
  (within ``lazy_delay``, 20 ms by default; reads of the client's jobs write
  them first): a job posted and answered within that time costs one row
  write, not an insert and an update, and nothing waits for that commit: a
  POST leaves, and ``run`` returns, before the record is committed. A
  client killed in that window can lose the last 20 ms of its job list,
  never a job: the worker's committed record answers GET.

A failed commit is rolled back and the acknowledgements that waited for it
are dropped (logged): the requesters' timeouts and retries answer for them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import gevent

from ..errors import StoreError
from ..wire.nfp import to_json
from ..storefile import WalCheckpointer, open_store

__all__ = ["JobStore", "WorkerJob", "ClientJob", "store_path", "PENDING", "RUNNING",
           "COMPLETED", "FAILED", "CANCELLED", "FINAL_STATES"]

PENDING, RUNNING, COMPLETED, FAILED, CANCELLED = "pending", "running", "completed", "failed", \
    "cancelled"
FINAL_STATES = frozenset((COMPLETED, FAILED, CANCELLED))
_CHECKPOINT_EVERY = 0.5  # seconds between WAL checkpoints (in a background thread)
COMMIT_DELAY = 0.002     # longest an acknowledgement waits for its commit (hub never idle)
LAZY_DELAY = 0.02        # longest a write nothing waits for stays uncommitted
_PURGE_CHUNK = 500       # expired jobs deleted between two yields to the hub

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS worker_jobs (
    worker   TEXT NOT NULL,
    uuid     TEXT NOT NULL,
    service  TEXT NOT NULL,
    task     TEXT NOT NULL,
    body     TEXT NOT NULL,
    state    TEXT NOT NULL,
    result   TEXT,
    created  REAL NOT NULL,
    finished REAL,
    PRIMARY KEY (worker, uuid)
) WITHOUT ROWID;
DROP INDEX IF EXISTS worker_jobs_created;
CREATE TABLE IF NOT EXISTS client_jobs (
    uuid     TEXT PRIMARY KEY,
    service  TEXT NOT NULL,
    task     TEXT NOT NULL,
    target   TEXT NOT NULL,
    body     TEXT NOT NULL,
    workers  TEXT NOT NULL DEFAULT '[]',
    state    TEXT NOT NULL,
    status   INTEGER,
    reason   TEXT NOT NULL DEFAULT '',
    result   TEXT,
    created  REAL NOT NULL,
    updated  REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS client_jobs_updated ON client_jobs (updated);
"""
_SELECT_WORKER = ("SELECT worker, uuid, service, task, body, state, result, created, finished "
                  "FROM worker_jobs")
_SELECT_CLIENT = ("SELECT uuid, service, task, target, body, workers, state, status, reason, "
                  "result, created, updated FROM client_jobs")


def store_path(data_dir: os.PathLike[str] | str, node_name: str) -> Path:
    """``<data_dir>/nfp-<node name>.sqlite3`` (the name made safe for a file name)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", node_name) or "node"
    return Path(data_dir) / f"nfp-{safe}.sqlite3"


@dataclass(slots=True)
class WorkerJob:
    """A job as one worker stored it."""

    worker: str
    uuid: str
    service: str
    task: str
    body: dict[str, Any]
    state: str
    result: Optional[dict[str, Any]]
    created: float
    finished: Optional[float]


@dataclass(slots=True)
class ClientJob:
    """A job as the client that posted it stored it."""

    uuid: str
    service: str
    task: str
    target: str
    body: dict[str, Any]
    workers: list[str]
    state: str
    status: Optional[int]
    reason: str
    result: Optional[dict[str, Any]]
    created: float
    updated: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {"uuid": self.uuid, "service": self.service, "task": self.task,
                "target": self.target, "args": self.body.get("args", []),
                "kwargs": self.body.get("kwargs", {}), "workers": self.workers,
                "state": self.state, "status": self.status, "reason": self.reason,
                "result": self.result, "created": self.created, "updated": self.updated}


_dumps = to_json


class JobStore:
    """The node's SQLite file. Use it from one thread (the node's hub); see group commit."""

    def __init__(self, path: os.PathLike[str] | str, retention: float = 7 * 86400.0,
                 commit_delay: float = COMMIT_DELAY, lazy_delay: float = LAZY_DELAY) -> None:
        self.path = Path(path)
        self.retention = float(retention)
        self.commit_delay = float(commit_delay)
        self.lazy_delay = float(lazy_delay)
        self._txn = False                  # a write transaction is open
        self._after: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._idle: Any = None             # hub watchers that commit (made at the first write)
        self._timer: Any = None
        self._lazy: Any = None
        self.commits = 0
        # client records not written yet: uuid -> (new row?, columns); see _flush_client
        self._client_rows: dict[str, tuple[bool, dict[str, Any]]] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = self._open(self.path)
        self._checkpointer = WalCheckpointer(self.path, _CHECKPOINT_EVERY)

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection:
        """The store's connection, its schema in place; StoreError if the file cannot be
        one (not SQLite, another program's tables, unreadable, locked)."""
        def check(db: sqlite3.Connection, found: set[str]) -> None:
            if "worker_jobs" in found:
                db.execute(_SELECT_WORKER + " LIMIT 0")
            if "client_jobs" in found:
                db.execute(_SELECT_CLIENT + " LIMIT 0")
        return open_store(path, "peermesh job store", {"worker_jobs", "client_jobs"}, _SCHEMA,
                          check=check)

    def close(self) -> None:
        """Commit, close the file (after a last checkpoint)."""
        self.commit()
        for watcher in (self._idle, self._timer, self._lazy):
            if watcher is not None:
                watcher.stop()
                watcher.close()
        self._idle = self._timer = self._lazy = None
        self._checkpointer.stop()
        self._db.close()

    # --- group commit ---------------------------------------------------

    def _write(self, sql: str, args: Any = ()) -> sqlite3.Cursor:
        """Execute a write in the open transaction (opening it, and arming its commit)."""
        if not self._txn:
            self._begin()
        return self._db.execute(sql, args)

    def _begin(self) -> None:
        self._db.execute("BEGIN")
        self._txn = True
        if not self._client_rows:   # (else armed when the first row was held)
            self._arm_lazy()

    def _arm_lazy(self) -> None:
        """Commit ``lazy_delay`` seconds from now (unless something commits sooner)."""
        if self._lazy is None:
            loop = gevent.get_hub().loop
            self._idle = loop.idle()
            self._timer = loop.timer(self.commit_delay, self.commit_delay)
            self._lazy = loop.timer(self.lazy_delay, self.lazy_delay)
        self._lazy.again(self._on_hub_idle)

    def _on_hub_idle(self) -> None:
        try:
            self.commit()
        except Exception:  # never let a callback's bug escape into the hub
            log.exception("committing the job store failed")

    @property
    def pending(self) -> bool:
        """True while written data waits for its commit."""
        return self._txn or bool(self._client_rows)

    def after_commit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` once everything written so far is committed (now if it is)."""
        if self._txn:
            if not self._after:     # the first acknowledgement waiting: commit soon
                self._idle.start(self._on_hub_idle)
                self._timer.again(self._on_hub_idle)
            self._after.append((fn, args))
        else:
            fn(*args)

    def commit(self) -> None:
        """Commit what is pending now, then run what waited for it (in order)."""
        self._flush_client()
        if self._lazy is not None:
            self._idle.stop()
            self._timer.stop()
            self._lazy.stop()
        if self._txn:
            self._txn = False
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error:
                log.exception("commit of %s failed; %d acknowledgement(s) dropped", self.path,
                              len(self._after))
                self._after.clear()
                try:
                    self._db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                return
            self.commits += 1
        # (a callback that writes opens a new transaction; what it queues waits for that one)
        waiting, self._after = self._after, []
        for fn, args in waiting:
            try:
                fn(*args)
            except Exception:
                log.exception("after-commit callback %r failed", fn)

    # --- worker side ----------------------------------------------------

    def add_worker_job(self, worker: str, uuid: str, service: str, task: str,
                       body: dict[str, Any], body_text: Optional[str] = None) -> bool:
        """Store a newly accepted job; False if this worker already has that UUID."""
        cursor = self._write(
            "INSERT OR IGNORE INTO worker_jobs (worker, uuid, service, task, body, state, created)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (worker, uuid, service, task, body_text if body_text is not None else _dumps(body),
             PENDING, time.time()))
        return cursor.rowcount == 1

    def finish_worker_job(self, worker: str, uuid: str, state: str,
                          result: dict[str, Any], result_text: Optional[str] = None) -> None:
        """Record the final state and result of a job (``result_text``: it as JSON, if known)."""
        self._write(
            "UPDATE worker_jobs SET state = ?, result = ?, finished = ? "
            "WHERE worker = ? AND uuid = ?",
            (state, result_text if result_text is not None else _dumps(result), time.time(),
             worker, uuid))

    def set_worker_state(self, worker: str, uuid: str, state: str) -> None:
        """Change the state of an unfinished job (e.g. pending -> running)."""
        self._write("UPDATE worker_jobs SET state = ? WHERE worker = ? AND uuid = ?",
                    (state, worker, uuid))

    def worker_job(self, worker: str, uuid: str) -> Optional[WorkerJob]:
        """One job of ``worker``, or None."""
        row = self._db.execute(_SELECT_WORKER + " WHERE worker = ? AND uuid = ?",
                               (worker, uuid)).fetchone()
        return self._worker_job(row) if row else None

    def delete_worker_job(self, worker: str, uuid: str) -> bool:
        """Remove a job's record; True if there was one."""
        return self._write("DELETE FROM worker_jobs WHERE worker = ? AND uuid = ?",
                           (worker, uuid)).rowcount == 1

    def unfinished_worker_jobs(self, worker: str) -> list[WorkerJob]:
        """Jobs of ``worker`` that were accepted but never finished, oldest first."""
        rows = self._db.execute(
            _SELECT_WORKER + " WHERE worker = ? AND finished IS NULL ORDER BY created",
            (worker,)).fetchall()
        return [self._worker_job(row) for row in rows]

    def worker_jobs(self, worker: Optional[str] = None, limit: int = 1000) -> list[WorkerJob]:
        """Recent jobs (of one worker, or all), newest first."""
        sql = _SELECT_WORKER
        args: tuple[Any, ...] = ()
        if worker is not None:
            sql += " WHERE worker = ?"
            args = (worker,)
        rows = self._db.execute(sql + " ORDER BY created DESC LIMIT ?", (*args, limit))
        return [self._worker_job(row) for row in rows.fetchall()]

    def worker_bytes(self, worker: str) -> int:
        """Octets of the POST bodies ``worker``'s jobs hold in the store."""
        self._flush_client()
        row = self._db.execute("SELECT total(length(CAST(body AS BLOB))) FROM worker_jobs "
                               "WHERE worker = ?", (worker,)).fetchone()
        return int(row[0])

    def worker_bytes_by_caller(self, worker: str) -> dict[str, int]:
        """Octets of the POST bodies ``worker``'s jobs hold, by the key the body names as
        its ``caller`` (bodies without one are left out)."""
        self._flush_client()
        rows = self._db.execute(
            "SELECT caller, total(length(CAST(body AS BLOB))) FROM (SELECT body, CASE WHEN "
            "json_valid(body) THEN json_extract(body, '$.caller') END AS caller FROM "
            "worker_jobs WHERE worker = ?) WHERE typeof(caller) = 'text' GROUP BY caller",
            (worker,)).fetchall()
        return {caller: int(octets) for caller, octets in rows}

    def count_worker_jobs(self, worker: str) -> dict[str, int]:
        """Number of jobs of ``worker`` by state."""
        rows = self._db.execute("SELECT state, count(*) FROM worker_jobs WHERE worker = ? "
                                "GROUP BY state", (worker,)).fetchall()
        return {state: n for state, n in rows}

    @staticmethod
    def _worker_job(row: tuple[Any, ...]) -> WorkerJob:
        worker, uuid, service, task, body, state, result, created, finished = row
        return WorkerJob(worker, uuid, service, task, json.loads(body), state,
                         json.loads(result) if result is not None else None, created, finished)

    # --- client side ----------------------------------------------------

    def add_client_job(self, uuid: str, service: str, task: str, target: str,
                       body: dict[str, Any], state: str = "posting",
                       body_text: Optional[str] = None) -> None:
        """Record a job before it is posted (so a crash mid-post leaves a trace);
        ``body_text``: ``body`` as JSON, if the caller has it."""
        now = time.time()
        self._hold_client(uuid, True, {
            "service": service, "task": task, "target": target,
            "body": body_text if body_text is not None else _dumps(body),
            "workers": "[]", "state": state, "status": None, "reason": "", "result": None,
            "created": now, "updated": now})

    def update_client_job(self, uuid: str, *, state: Optional[str] = None,
                          status: Optional[int] = None, reason: Optional[str] = None,
                          workers: Optional[list[str]] = None,
                          result: Optional[dict[str, Any]] = None) -> None:
        """Update what is known about a posted job."""
        columns: dict[str, Any] = {"updated": time.time()}
        if state is not None:
            columns["state"] = state
        if status is not None:
            columns["status"] = status
        if reason is not None:
            columns["reason"] = reason
        if workers is not None:
            columns["workers"] = _dumps(workers)
        if result is not None:
            columns["result"] = _dumps(result)
        self._hold_client(uuid, False, columns)

    def _hold_client(self, uuid: str, new: bool, columns: dict[str, Any]) -> None:
        """Keep a client record's change in memory until the next commit (merged per job)."""
        rows = self._client_rows
        if not rows and not self._txn:
            self._arm_lazy()
        held = rows.get(uuid)
        if held is None or new:
            rows[uuid] = (new, columns)
        else:
            held[1].update(columns)    # still a new row if it was one: written whole

    _CLIENT_COLUMNS = ("service", "task", "target", "body", "workers", "state", "status",
                       "reason", "result", "created", "updated")
    _INSERT_CLIENT = (f"INSERT OR REPLACE INTO client_jobs (uuid, {', '.join(_CLIENT_COLUMNS)}) "
                      f"VALUES ({', '.join('?' * (len(_CLIENT_COLUMNS) + 1))})")

    def _flush_client(self) -> None:
        """Write the held client records (if any) into the open transaction."""
        if not self._client_rows:
            return
        rows, self._client_rows = self._client_rows, {}
        new = [(uuid, *[c[k] for k in self._CLIENT_COLUMNS])
               for uuid, (is_new, c) in rows.items() if is_new]
        if new:
            if not self._txn:
                self._begin()
            self._db.executemany(self._INSERT_CLIENT, new)
        for uuid, (is_new, columns) in rows.items():
            if not is_new:
                self._write(f"UPDATE client_jobs SET {' = ?, '.join(columns)} = ? "
                            f"WHERE uuid = ?", (*columns.values(), uuid))

    def client_job(self, uuid: str) -> Optional[ClientJob]:
        """One posted job, or None."""
        self._flush_client()
        row = self._db.execute(_SELECT_CLIENT + " WHERE uuid = ?", (uuid,)).fetchone()
        return self._client_job(row) if row else None

    def find_client_jobs(self, prefix: str) -> list[ClientJob]:
        """Posted jobs whose UUID starts with ``prefix``."""
        self._flush_client()
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._db.execute(_SELECT_CLIENT + " WHERE uuid LIKE ? ESCAPE '\\' LIMIT 10",
                                (escaped + "%",)).fetchall()
        return [self._client_job(row) for row in rows]

    def client_jobs(self, limit: int = 1000) -> list[ClientJob]:
        """Posted jobs, newest first."""
        self._flush_client()
        rows = self._db.execute(_SELECT_CLIENT + " ORDER BY created DESC LIMIT ?", (limit,))
        return [self._client_job(row) for row in rows.fetchall()]

    def delete_client_job(self, uuid: str) -> None:
        """Forget a posted job."""
        self._flush_client()
        self._write("DELETE FROM client_jobs WHERE uuid = ?", (uuid,))

    @staticmethod
    def _client_job(row: tuple[Any, ...]) -> ClientJob:
        (uuid, service, task, target, body, workers, state, status, reason, result, created,
         updated) = row
        return ClientJob(uuid, service, task, target, json.loads(body), json.loads(workers), state,
                         status, reason, json.loads(result) if result is not None else None,
                         created, updated)

    # --- retention ------------------------------------------------------

    def purge(self, now: Optional[float] = None) -> int:
        """Remove finished jobs older than ``retention``; the number removed.

        A worker job goes once both its creation and its end are older than the
        cutoff. ``worker_jobs`` has no index on its times (it would cost every
        job a second B-tree write in its commit), so the search for them scans
        the table in a thread of the hub's pool, on a connection of its own,
        and the hub only deletes what it found, by key, ``_PURGE_CHUNK`` at a
        time."""
        self.commit()     # (the scan's connection sees only what is committed)
        cutoff = (time.time() if now is None else now) - self.retention
        expired = gevent.get_hub().threadpool.apply(self._expired_worker_jobs, (cutoff,))
        removed = 0
        for start in range(0, len(expired), _PURGE_CHUNK):
            if not self._txn:
                self._begin()
            removed += self._db.executemany(
                "DELETE FROM worker_jobs WHERE worker = ? AND uuid = ? AND finished < ?",
                [(*key, cutoff) for key in expired[start:start + _PURGE_CHUNK]]).rowcount
            gevent.sleep(0)
        removed += self._write(
            "DELETE FROM client_jobs WHERE updated < ? AND state IN ('completed', 'failed', "
            "'cancelled', 'deleted', 'lost', 'mixed', 'expired', 'unknown')", (cutoff,)).rowcount
        return removed

    def _expired_worker_jobs(self, cutoff: float) -> list[tuple[str, str]]:
        """Keys of worker jobs created and finished before ``cutoff`` (in a thread)."""
        db = sqlite3.connect(str(self.path), timeout=5.0)
        try:
            return db.execute("SELECT worker, uuid FROM worker_jobs WHERE finished < ? "
                              "AND created < ?", (cutoff, cutoff)).fetchall()
        finally:
            db.close()

    def __iter__(self) -> Iterator[WorkerJob]:
        return iter(self.worker_jobs())
