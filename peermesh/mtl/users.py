"""MTL users and the credentials file: who may log in to a gateway, and with what
grants (``peermesh.mtl.credentials`` gathers this module, ``sasl`` and ``throttle``).

The credentials file
--------------------
One JSON object, written atomically (a temporary file in the same directory,
``fsync``, rename) with mode 0600, and changed under an advisory lock
(``<file>.lock``) so that two ``peermesh mtl user`` commands never lose each
other's edit::

    {
      "peermesh-mtl-credentials": 1,
      "users": {
        "alice": {
          "scram-sha-256": {"salt": "<base64>", "stored-key": "<base64>",
                            "server-key": "<base64>", "iterations": 4096},
          "read": ["chat", "sensors.*"],
          "write": ["chat"],
          "expires": "2027-01-01T00:00:00Z"
        }
      }
    }

* A user holds a salted SCRAM-SHA-256 verifier (RFC 5802, RFC 7677) as
  ``scramp`` makes it: salt, stored key, server key, iteration count. The
  password itself is never stored; PLAIN is verified against the same
  verifier. ``DEFAULT_ITERATIONS`` (4096, RFC 7677's minimum) costs the
  client about 1 ms per authentication and the server nothing (the server
  only computes HMACs); PLAIN costs the server that 1 ms instead.
* ``read`` and ``write`` grant resources (mesh groups) by shell-style
  patterns matched case-sensitively against the whole name (``fnmatchcase``:
  ``*`` any run of characters, ``?`` one, ``[abc]`` one of a set); ``["*"]``
  grants everything, ``[]`` (or a missing key) nothing.
* ``expires`` (optional) is an ISO 8601 time; without a zone it is UTC. From
  then on the user cannot authenticate, and a gateway that checks
  ``CredentialsFile.still_valid`` sends its sessions 401.
* Unknown keys, wrong types, bad base64, wrong key lengths and iteration
  counts outside 4096..10,000,000 are errors that name the file and the
  entry (``CredentialsError``); the file is at most ``MAX_FILE_BYTES``.

A gateway keeps one ``CredentialsFile`` and calls ``refresh()`` now and then:
it re-reads the file when its inode, size or modification time changed and
bumps ``generation``. ``still_valid(user, now)`` tells whether a session
authenticated as ``user`` may go on (the entry is unchanged and not expired);
on False the gateway answers 401 and the client authenticates again.
"""
from __future__ import annotations

import base64
import binascii
import contextlib
import datetime
import fcntl
import hmac
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import scramp
from scramp.utils import saslprep

from ..config import default_data_dir
from .errors import MtlError

__all__ = ["CredentialsError", "Verifier", "User", "CredentialsFile", "make_user",
           "check_name", "parse_credentials", "dump_credentials", "parse_time", "format_time",
           "default_credentials_path", "default_data_dir", "DEFAULT_ITERATIONS", "MIN_ITERATIONS",
           "MAX_ITERATIONS", "MECHANISMS", "MAX_FILE_BYTES"]

log = logging.getLogger(__name__)

DEFAULT_ITERATIONS = 4096           # RFC 7677's minimum for SCRAM-SHA-256
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 10_000_000
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_NAME = 255                      # a user name or pattern fits an MTL short string
MECHANISMS = ("SCRAM-SHA-256", "PLAIN")
_FORMAT_KEY, _FORMAT = "peermesh-mtl-credentials", 1
_SCRAM_KEY = "scram-sha-256"
_USER_KEYS = frozenset({_SCRAM_KEY, "read", "write", "expires"})
_VERIFIER_KEYS = frozenset({"salt", "stored-key", "server-key", "iterations"})
_KEY_BYTES = 32                     # SHA-256 output: stored key and server key
_MIN_SALT = 12                      # scramp's minimum


class CredentialsError(MtlError):
    """A credentials file that cannot be read or used, or a user entry that is not valid."""


def default_credentials_path() -> Path:
    """``$PEERMESH_MTL_CREDENTIALS``, else ``mtl-credentials.json`` in ``default_data_dir()``."""
    env = os.environ.get("PEERMESH_MTL_CREDENTIALS")
    return Path(env) if env else default_data_dir() / "mtl-credentials.json"


# --------------------------------------------------------------------------
# Users


@dataclass(frozen=True, slots=True)
class Verifier:
    """A salted SCRAM-SHA-256 verifier, as ``scramp`` makes it."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def as_scramp(self) -> tuple[bytes, bytes, bytes, int]:
        """The tuple scramp's ``auth_fn`` returns."""
        return self.salt, self.stored_key, self.server_key, self.iterations

    def check_password(self, password: str) -> bool:
        """True if ``password`` is the one this verifier was made from."""
        try:
            _, stored_key, _, _ = _SCRAM.make_auth_info(password, self.iterations, self.salt)
        except scramp.ScramException:       # a password SASLprep refuses
            return False
        return hmac.compare_digest(stored_key, self.stored_key)


_SCRAM = scramp.ScramMechanism("SCRAM-SHA-256")


@dataclass(frozen=True, slots=True)
class User:
    """One user of the credentials file. Two equal ``User`` values are the same entry."""

    name: str
    verifier: Verifier
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    expires: Optional[float] = None     # Unix time; None: never

    def may_read(self, resource: str) -> bool:
        """True if a ``read`` pattern matches ``resource``."""
        return any(fnmatchcase(resource, p) for p in self.read)

    def may_write(self, resource: str) -> bool:
        """True if a ``write`` pattern matches ``resource``."""
        return any(fnmatchcase(resource, p) for p in self.write)

    def expired(self, now: float) -> bool:
        """True from ``expires`` on (``now`` in Unix time)."""
        return self.expires is not None and now >= self.expires


def make_user(name: str, password: str, read: Sequence[str] = (), write: Sequence[str] = (),
              expires: Optional[float] = None, iterations: int = DEFAULT_ITERATIONS) -> User:
    """A new user with a fresh salt; CredentialsError naming what is wrong with an argument."""
    name = check_name(name)
    if not isinstance(password, str) or not password:
        raise CredentialsError("the password must not be empty")
    if not isinstance(iterations, int) or not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise CredentialsError(f"the iteration count must be {MIN_ITERATIONS}.."
                               f"{MAX_ITERATIONS}, not {iterations!r}")
    try:
        salt, stored_key, server_key, count = _SCRAM.make_auth_info(password, iterations)
    except scramp.ScramException as exc:
        raise CredentialsError(f"the password cannot be used: {exc.args[0]}") from None
    return User(name, Verifier(salt, stored_key, server_key, count),
                tuple(_pattern(p, "read") for p in read),
                tuple(_pattern(p, "write") for p in write), _expiry(expires))


def check_name(name: str) -> str:
    """``name`` if it can be a user name (SASLprep leaves it as it is, printable, 1..255
    characters); else CredentialsError."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME or not name.isprintable():
        raise CredentialsError(f"user name {name!r} must be 1..{MAX_NAME} printable characters")
    try:
        prepared = saslprep(name)
    except scramp.ScramException as exc:
        raise CredentialsError(f"user name {name!r}: {exc.args[0]}") from None
    if prepared != name:
        raise CredentialsError(f"user name {name!r} is not in SASLprep form "
                               f"(that would be {prepared!r})")
    return name


def _pattern(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME \
            or not value.isprintable():
        raise CredentialsError(f"{what} pattern {value!r} must be 1..{MAX_NAME} printable "
                               "characters")
    return value


def _expiry(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) \
            and value == value and abs(value) != float("inf"):
        return float(value)
    raise CredentialsError(f"expiry {value!r} must be a Unix time")


# --------------------------------------------------------------------------
# The file: JSON to users and back


def parse_credentials(data: bytes, source: str) -> dict[str, User]:
    """The users of a credentials file's bytes; CredentialsError naming ``source`` and the
    entry that is wrong."""
    def bad(where: str, what: str) -> CredentialsError:
        return CredentialsError(f"credentials file {source}: {where}{what}")

    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise bad("", "is not UTF-8 text") from None
    except ValueError as exc:
        raise bad("", f"is not valid JSON ({exc})") from None
    except RecursionError:
        raise bad("", "is not valid JSON (nested too deeply)") from None
    if not isinstance(doc, dict) or doc.get(_FORMAT_KEY) != _FORMAT:
        raise bad("", f'is not a peermesh MTL credentials file (no "{_FORMAT_KEY}": '
                      f"{_FORMAT})")
    unknown = sorted(set(doc) - {_FORMAT_KEY, "users"})
    if unknown:
        raise bad("", f"unknown key(s) {', '.join(unknown)}")
    users = doc.get("users", {})
    if not isinstance(users, dict):
        raise bad("users: ", "must be an object")
    result: dict[str, User] = {}
    for name, entry in users.items():
        where = f"user {name!r}: "
        try:
            result[check_name(name)] = _user(name, entry)
        except CredentialsError as exc:
            raise bad(where, str(exc)) from None
    return result


def _user(name: str, entry: Any) -> User:
    if not isinstance(entry, dict):
        raise CredentialsError("must be an object")
    unknown = sorted(set(entry) - _USER_KEYS)
    if unknown:
        raise CredentialsError(f"unknown key(s) {', '.join(unknown)}")
    raw = entry.get(_SCRAM_KEY)
    if not isinstance(raw, dict):
        raise CredentialsError(f'"{_SCRAM_KEY}" must be an object with '
                               f"{', '.join(sorted(_VERIFIER_KEYS))}")
    if set(raw) != _VERIFIER_KEYS:
        raise CredentialsError(f'"{_SCRAM_KEY}" must have exactly the keys '
                               f"{', '.join(sorted(_VERIFIER_KEYS))}")
    salt = _b64(raw["salt"], "salt")
    stored_key, server_key = _b64(raw["stored-key"], "stored-key"), \
        _b64(raw["server-key"], "server-key")
    if len(salt) < _MIN_SALT:
        raise CredentialsError(f"the salt must be at least {_MIN_SALT} bytes")
    if len(stored_key) != _KEY_BYTES or len(server_key) != _KEY_BYTES:
        raise CredentialsError(f"stored-key and server-key must be {_KEY_BYTES} bytes each")
    iterations = raw["iterations"]
    if not isinstance(iterations, int) or isinstance(iterations, bool) \
            or not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise CredentialsError(f"iterations must be an integer {MIN_ITERATIONS}.."
                               f"{MAX_ITERATIONS}, not {iterations!r}")
    grants = {}
    for mode in ("read", "write"):
        patterns = entry.get(mode, [])
        if not isinstance(patterns, list):
            raise CredentialsError(f'"{mode}" must be a list of patterns')
        grants[mode] = tuple(_pattern(p, mode) for p in patterns)
    expires = entry.get("expires")
    return User(name, Verifier(salt, stored_key, server_key, iterations), grants["read"],
                grants["write"], None if expires is None else parse_time(expires))


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise CredentialsError(f"{what} must be base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise CredentialsError(f"{what} is not valid base64") from None


def parse_time(text: Any) -> float:
    """An ISO 8601 time (UTC when it has no zone) as Unix time; CredentialsError if not one."""
    if not isinstance(text, str):
        raise CredentialsError(f"expires must be an ISO 8601 time, not {text!r}")
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise CredentialsError(f"expires {text!r} is not an ISO 8601 time "
                               "(e.g. 2027-01-01 or 2027-01-01T12:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def format_time(when: float) -> str:
    """Unix time as ISO 8601 UTC text (``2027-01-01T00:00:00Z``)."""
    moment = datetime.datetime.fromtimestamp(when, datetime.timezone.utc)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def dump_credentials(users: Mapping[str, User]) -> bytes:
    """The file's bytes for ``users`` (sorted by name)."""
    entries: dict[str, Any] = {}
    for name in sorted(users):
        user = users[name]
        v = user.verifier
        entry: dict[str, Any] = {
            _SCRAM_KEY: {"salt": _text(v.salt), "stored-key": _text(v.stored_key),
                         "server-key": _text(v.server_key), "iterations": v.iterations},
            "read": list(user.read), "write": list(user.write)}
        if user.expires is not None:
            entry["expires"] = format_time(user.expires)
        entries[name] = entry
    return (json.dumps({_FORMAT_KEY: _FORMAT, "users": entries}, indent=2, ensure_ascii=False)
            + "\n").encode("utf-8")


def _text(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class CredentialsFile:
    """The users of one credentials file, re-read when it changes. A missing file has no users.

    ``generation`` goes up each time ``refresh`` finds different users.
    """

    def __init__(self, path: os.PathLike[str] | str) -> None:
        self.path = Path(path)
        self.generation = 0
        self._stat: Optional[tuple[int, int, int, int]] = None
        self.users: dict[str, User] = {}
        self.refresh()

    def user(self, name: str) -> Optional[User]:
        """The user called ``name``, or None."""
        return self.users.get(name)

    def still_valid(self, user: User, now: float) -> bool:
        """True while ``user``'s entry is in the file unchanged and not expired (Unix
        ``now``); a gateway answers 401 once it is False."""
        return self.users.get(user.name) == user and not user.expired(now)

    def refresh(self, force: bool = False) -> bool:
        """Re-read the file if it changed on disk (or ``force``); True if the users changed.

        CredentialsError (and the users read before are kept) if the new file
        cannot be read or used."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            stat = None
        except OSError as exc:
            raise CredentialsError(f"cannot read credentials file {self.path}: "
                                   f"{exc.strerror}") from None
        else:
            stat = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if stat == self._stat and self.generation and not force:
            return False
        users = self._read() if stat is not None else {}
        self._stat = stat
        if users == self.users and self.generation:
            return False
        self.users = users
        self.generation += 1
        return True

    def _read(self) -> dict[str, User]:
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_mode & 0o077:
                    log.warning("credentials file %s is readable by other users; its verifiers "
                                "allow offline password guessing (chmod 600)", self.path)
                data = f.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise CredentialsError(f"cannot read credentials file {self.path}: "
                                   f"{exc.strerror}") from None
        if len(data) > MAX_FILE_BYTES:
            raise CredentialsError(f"credentials file {self.path} is larger than "
                                   f"{MAX_FILE_BYTES} bytes")
        return parse_credentials(data, str(self.path))

    def update(self, change: Callable[[dict[str, User]], object]) -> None:
        """Apply ``change`` to the users as they are on disk now, and write the result
        (atomically, mode 0600), all under the file's lock."""
        with self._locked():
            self.refresh(force=True)     # what is on disk now
            users = dict(self.users)
            change(users)
            self._write(dump_credentials(users))
            self.refresh()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise CredentialsError(f"cannot lock credentials file {self.path}: "
                                   f"{exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write(self, data: bytes) -> None:
        directory = self.path.parent
        try:
            fd, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=directory)
        except OSError as exc:
            raise CredentialsError(f"cannot write credentials file {self.path}: "
                                   f"{exc.strerror}") from None
        try:
            with os.fdopen(fd, "wb") as f:       # mkstemp made it 0600
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, self.path)
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise CredentialsError(f"cannot write credentials file {self.path}: "
                                   f"{exc.strerror}") from None
