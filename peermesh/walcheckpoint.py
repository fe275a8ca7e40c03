"""WAL checkpoints of an SQLite file in a background thread, never on the hub.

The stores (NFP jobs, MTL content) turn SQLite's automatic checkpoints off
(``wal_autocheckpoint=0``), because a checkpoint fsyncs and would stall the
hub that commits. ``WalCheckpointer`` runs them from a thread of its own on
a connection of its own: a passive one every ``every`` seconds, and a last
truncating one when stopped.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

__all__ = ["WalCheckpointer"]


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
