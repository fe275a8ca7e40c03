"""The stores' SQLite files: opened one way, checkpointed in a background thread.

The stores (NFP jobs, MTL content) open their file with ``open_store``: a
file holding another program's tables is refused before anything is
written, the journal is WAL, and SQLite's automatic checkpoints are off
(``wal_autocheckpoint=0``), because a checkpoint fsyncs and would stall the
hub that commits. ``WalCheckpointer`` runs them from a thread of its own on
a connection of its own: a passive one every ``every`` seconds, and a last
truncating one when stopped.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Callable, Optional

from .errors import StoreError

__all__ = ["WalCheckpointer", "open_store"]


def open_store(path: Path, kind: str, tables: set[str], schema: str, *,
               synchronous: str = "NORMAL",
               check: Optional[Callable[[sqlite3.Connection, set[str]], None]] = None,
               migrate: Optional[Callable[[sqlite3.Connection], None]] = None
               ) -> sqlite3.Connection:
    """``path`` opened as a ``kind`` (say "MTL content store") whose tables are among
    ``tables``, ``schema`` in place. ``check(db, tables found)`` runs before anything is
    written, ``migrate(db)`` after the schema. StoreError if the file cannot be one (not
    SQLite, another program's tables, unreadable, locked); a refused file is left as it was."""
    try:
        db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False,
                             timeout=5.0)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open the {kind} {path}: {exc}") from None
    try:
        found = {name for name, in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if found and not found & tables:
            raise sqlite3.DatabaseError(f"it holds other tables ({', '.join(sorted(found))})")
        if check is not None:
            check(db, found)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous}")
        db.execute("PRAGMA wal_autocheckpoint=0")   # (``WalCheckpointer`` runs them)
        db.executescript(schema)
        if migrate is not None:
            migrate(db)
    except sqlite3.Error as exc:
        db.close()
        raise StoreError(f"{path} is not a usable {kind}: {exc}") from None
    return db


class WalCheckpointer:
    """Checkpoints ``path``'s write-ahead log every ``every`` seconds until ``stop``."""

    def __init__(self, path: Path, every: float = 0.5) -> None:
        self.path = path
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"peermesh-checkpoint-{path.name}")
        self._thread.start()

    def _loop(self) -> None:
        try:
            db = sqlite3.connect(str(self.path), isolation_level=None, timeout=5.0)
        except sqlite3.Error:
            return
        try:
            while not self._stop.wait(self.every):
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error:
                    pass  # busy or locked: the next round tries again
            try:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass
        finally:
            db.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Run the last checkpoint and wait (at most ``timeout`` seconds) for the thread."""
        self._stop.set()
        self._thread.join(timeout)
