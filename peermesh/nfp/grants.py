"""Per-key grants on a mesh with keys: which tasks and which FSS files a public key may use.

How it works
------------
NFP's role-based access control is TBD in the spec; on a mesh with CURVE
keys every request carries the key it was authenticated with (a worker's
direct caller's own key, or the key a broker passes on as ``caller``), so
permissions can be given per key. A grants file is TOML, one ``[[grant]]``
table per set of keys::

    [[grant]]
    keys = ["rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"]   # Z85 public keys
    tasks = ["echo/*", "fss.service.broker/*"]          # SERVICE/TASK patterns
    files = ["nf://public", "nf://public/*"]            # FSS URL patterns
    all_jobs = false                                    # GET/DELETE any key's jobs

Patterns are shell-style (``fnmatch``; ``*`` also matches ``/``). A key
named in several grants has all of them. A key named in none may do nothing
the grants govern:

* **tasks**: a POST of ``TASK`` to ``SERVICE`` is allowed when ``SERVICE/TASK``
  matches one of the key's task patterns; otherwise it is answered 500
  (ERROR: the spec defines no status for a refusal) and not stored. The
  management services ``mmi.service.*`` keep their own rule (reading is
  anyone's, the destructive calls need ``admin_keys``).
* **files**: ``list_files``, ``file_details`` and ``fetch_file`` of
  ``fss.service.broker`` (which also need a task grant) are allowed when the
  URL, normalised (``nf://`` plus the path under the files root, no
  trailing ``/``; the root is ``nf://``), matches one of the key's file
  patterns; otherwise the job fails with ``NotAuthorised``.

* **jobs**: a job belongs to the key it was posted with (stored with it). A
  GET or DELETE of it from another key, or a POST again of its UUID, is
  answered 500 (ERROR) and counted (``not_owner``), unless that key is an
  admin key (``admin_keys``) or a grant gives it ``all_jobs = true``; this
  holds with or without a grants file. Jobs posted without a key (a mesh
  without keys) belong to no one: any caller may GET or DELETE them.

The file is read again when its modification time changes (checked at most
once a second), so grants change without a restart; a file that no longer
reads keeps the previous grants and is logged.
"""

from __future__ import annotations

import logging
import os
import time
import tomllib
from fnmatch import fnmatchcase
from typing import AbstractSet, Any, Optional

from zmq.utils import z85

from .errors import NfpError

__all__ = ["Grants", "GrantsError", "may_use_job"]

log = logging.getLogger(__name__)

_CHECK_EVERY = 1.0    # seconds between two looks at the file's modification time


class GrantsError(NfpError, ValueError):
    """A grants file that cannot be read or is not valid."""


def _patterns(table: dict[str, Any], name: str, where: str) -> tuple[str, ...]:
    value = table.get(name, [])
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise GrantsError(f"{where}: {name} must be a list of non-empty strings")
    return tuple(value)


#: Z85 key -> (task patterns, file patterns, all_jobs)
_Table = dict[bytes, tuple[tuple[str, ...], tuple[str, ...], bool]]


def parse(text: str, where: str = "grants") -> _Table:
    """The grants of TOML ``text``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise GrantsError(f"{where} is not TOML: {exc}") from None
    unknown = set(data) - {"grant"}
    if unknown:
        raise GrantsError(f"{where}: unknown table(s) {', '.join(sorted(unknown))}; "
                          "grants are [[grant]] tables")
    tables = data.get("grant", [])
    if not isinstance(tables, list):
        raise GrantsError(f"{where}: grants are [[grant]] tables")
    grants: _Table = {}
    for n, table in enumerate(tables, 1):
        here = f"{where}, grant {n}"
        extra = set(table) - {"keys", "tasks", "files", "all_jobs"}
        if extra:
            raise GrantsError(f"{here}: unknown field(s) {', '.join(sorted(extra))} "
                              "(a grant has keys, tasks, files, all_jobs)")
        all_jobs = table.get("all_jobs", False)
        if not isinstance(all_jobs, bool):
            raise GrantsError(f"{here}: all_jobs must be true or false")
        keys = table.get("keys")
        if not isinstance(keys, list) or not keys:
            raise GrantsError(f"{here}: keys must list at least one Z85 public key")
        tasks, files = _patterns(table, "tasks", here), _patterns(table, "files", here)
        for key in keys:
            if not isinstance(key, str) or len(key) != 40 or not _z85(key):
                raise GrantsError(f"{here}: {key!r} is not a Z85 public key (40 characters, "
                                  "as in a certificate's public-key line)")
            old_tasks, old_files, old_all = grants.get(key.encode(), ((), (), False))
            grants[key.encode()] = (old_tasks + tasks, old_files + files, old_all or all_jobs)
    return grants


def _z85(key: str) -> bool:
    try:
        return len(z85.decode(key)) == 32
    except (ValueError, KeyError, TypeError):
        return False


class Grants:
    """The grants of a TOML file, read again when it changes."""

    def __init__(self, path: os.PathLike[str] | str) -> None:
        self.path = os.fspath(path)
        self._mtime = self._stat()
        self._checked = time.monotonic()
        try:
            with open(self.path, encoding="utf-8") as f:
                self._grants = parse(f.read(), self.path)
        except OSError as exc:
            raise GrantsError(f"cannot read grants file {self.path}: {exc.strerror}") from None

    def _stat(self) -> Optional[int]:
        try:
            return os.stat(self.path).st_mtime_ns
        except OSError:
            return None

    def _fresh(self) -> _Table:
        now = time.monotonic()
        if now - self._checked >= _CHECK_EVERY:
            self._checked = now
            self.reload()
        return self._grants

    def reload(self) -> None:
        """Read the file again if it changed (a file that does not read is logged)."""
        mtime = self._stat()
        if mtime == self._mtime:
            return
        self._mtime = mtime
        try:
            with open(self.path, encoding="utf-8") as f:
                self._grants = parse(f.read(), self.path)
        except (OSError, GrantsError) as exc:
            log.warning("grants file %s not reloaded, the previous grants stay: %s",
                        self.path, exc)

    def allows_task(self, caller: Any, service: str, task: str) -> bool:
        """True if key ``caller`` (Z85) may POST ``task`` to ``service``."""
        if service.startswith("mmi.service."):
            return True
        granted = self._fresh().get(caller.encode()) if isinstance(caller, str) else None
        name = f"{service}/{task}"
        return granted is not None and any(fnmatchcase(name, p) for p in granted[0])

    def allows_file(self, caller: Any, url: str) -> bool:
        """True if key ``caller`` (Z85) may read or list normalised FSS URL ``url``."""
        granted = self._fresh().get(caller.encode()) if isinstance(caller, str) else None
        return granted is not None and any(fnmatchcase(url, p) for p in granted[1])

    def allows_all_jobs(self, caller: Any) -> bool:
        """True if key ``caller`` (Z85) may GET and DELETE every key's jobs."""
        granted = self._fresh().get(caller.encode()) if isinstance(caller, str) else None
        return granted is not None and granted[2]


def may_use_job(owner: Optional[str], caller: Any, admin_keys: Optional[AbstractSet[bytes]],
                grants: Optional[Grants]) -> bool:
    """True if key ``caller`` may GET or DELETE a job posted with key ``owner`` (None: a job
    posted without a key, anyone's): its owner, an admin key, or a key granted all_jobs."""
    if owner is None or owner == caller:
        return True
    if not isinstance(caller, str):
        return False
    if admin_keys is not None and caller.encode() in admin_keys:
        return True
    return grants is not None and grants.allows_all_jobs(caller)
