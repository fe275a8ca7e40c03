"""The SQLite files the stores write, opened as another process would.

``other_view`` is a second connection to a store's file (what a reader in
another process sees, or a lock it holds), closed at the end of the
``with``; ``journal_mode`` says how a file is journalled; ``make_database``
writes a SQLite file that is not a store (other tables, an old schema).
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from os import PathLike
from typing import Any, ContextManager, Union

Where = Union[str, "PathLike[str]"]


def other_view(path: Where, **options: Any) -> "ContextManager[sqlite3.Connection]":
    """A connection of its own to the file at ``path`` (``sqlite3.connect`` options),
    closed when the ``with`` ends."""
    return closing(sqlite3.connect(str(path), **options))


def journal_mode(path: Where) -> str:
    """The file's journal mode ("wal", "delete", ...)."""
    with other_view(path) as db:
        return str(db.execute("PRAGMA journal_mode").fetchone()[0])


def make_database(path: Where, script: str) -> None:
    """A SQLite file at ``path`` made by the SQL ``script``, committed and closed."""
    with other_view(path) as db:
        db.executescript(script)
        db.commit()
