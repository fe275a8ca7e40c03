"""CURVE keypairs in the certificate files ZeroMQ's ``zcert`` writes.

A certificate is a small ZPL text file (ZeroMQ Property Language)::

    #   ZeroMQ CURVE Public Certificate
    metadata
        name = "alice"
    curve
        public-key = "<40 Z85 characters>"

``zcert_save(cert, "node.key")`` writes that public certificate to
``node.key`` and the secret one, which adds ``secret-key = "..."``, to
``node.key_secret``; ``write_keypair`` does the same, the secret file mode
0600 whatever the umask. Z85 is ZeroMQ's text form of a key (RFC 32: 32
octets as 40 characters).

Reading is strict: a missing, unreadable, malformed or (for a secret)
group- or world-readable file raises ``KeyFileError`` naming the file and
what is wrong, and a secret key must belong to the public key beside it.
"""

from __future__ import annotations

import datetime
import os
import re
import stat
from dataclasses import dataclass
from typing import Mapping, Optional

import zmq
from zmq.utils import z85

from ..errors import PeermeshError

__all__ = ["Keypair", "CurveError", "KeyFileError", "generate", "write_keypair", "load_keypair",
           "load_public_key", "z85_key", "SECRET_SUFFIX"]

#: what ``zcert_save`` appends to the public file's name for the secret one
SECRET_SUFFIX = "_secret"
#: certificate files are a few hundred octets; anything far larger is not one
_MAX_FILE = 64 * 1024
_PROPERTY = re.compile(r'^(\s*)([A-Za-z0-9$\-_@.&+/]+)\s*=\s*(?:"([^"]*)"|\'([^\']*)\'|(\S*))\s*(?:#.*)?$')
_SECTION = re.compile(r"^(\s*)([A-Za-z0-9$\-_@.&+/]+)\s*(?:#.*)?$")

_PUBLIC_BANNER = """\
#   ****  Generated on {now} by peermesh  ****
#   ZeroMQ CURVE Public Certificate
#   Exchange securely, or use a secure mechanism to verify the contents
#   of this file after exchange. Store public certificates in your home
#   directory, in the .curve subdirectory.

"""
_SECRET_BANNER = """\
#   ****  Generated on {now} by peermesh  ****
#   ZeroMQ CURVE **Secret** Certificate
#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.

"""


class CurveError(PeermeshError):
    """CURVE keys or allowlists cannot be used as configured."""


class KeyFileError(CurveError):
    """A key file is missing, unreadable, malformed or too open."""


@dataclass(frozen=True, slots=True)
class Keypair:
    """A CURVE keypair, both keys in Z85 (40 ASCII octets each); ``secret`` may be absent
    for a peer's public certificate."""

    public: bytes
    secret: Optional[bytes] = None

    @property
    def public_raw(self) -> bytes:
        """The public key's 32 octets (as a version-3 beacon carries it)."""
        return z85.decode(self.public)

    def __repr__(self) -> str:  # never print a secret key
        return f"Keypair(public={self.public.decode()!r})"


def generate() -> Keypair:
    """A new random keypair (libsodium through libzmq) whose public key does not start
    with a zero octet: Zyre, and peermesh as Zyre does, drop a beacon carrying such a key
    (it reads as "no key"), so one key in 256 would leave its node unreachable."""
    while True:
        public, secret = zmq.curve_keypair()
        keypair = Keypair(public, secret)
        if keypair.public_raw[0] != 0:
            return keypair


def z85_key(value: object, what: str = "key") -> bytes:
    """``value`` (40 Z85 characters, str or bytes) as Z85 bytes; KeyFileError otherwise."""
    if isinstance(value, str):
        value = value.encode("ascii", "replace")
    if not isinstance(value, bytes) or len(value) != 40:
        raise KeyFileError(f"{what} is not 40 Z85 characters")
    try:
        z85.decode(value)
    except (KeyError, ValueError):
        raise KeyFileError(f"{what} is not valid Z85") from None
    return value


# --- writing --------------------------------------------------------------

def _certificate(banner: str, keypair: Keypair, secret: bool,
                 metadata: Mapping[str, str]) -> str:
    lines = [banner.format(now=datetime.datetime.now().replace(microsecond=0)), "metadata\n"]
    for key, value in metadata.items():
        if not _PROPERTY.match(f"    {key} = \"x\"") or '"' in value or "\n" in value:
            raise ValueError(f"metadata {key!r} = {value!r} cannot be written to a certificate")
        lines.append(f'    {key} = "{value}"\n')
    lines.append("curve\n")
    lines.append(f'    public-key = "{keypair.public.decode()}"\n')
    if secret:
        assert keypair.secret is not None
        lines.append(f'    secret-key = "{keypair.secret.decode()}"\n')
    return "".join(lines)


def write_keypair(path: os.PathLike[str] | str, keypair: Keypair,
                  metadata: Mapping[str, str] = {}, *, overwrite: bool = False) -> tuple[str, str]:
    """Write ``path`` (public certificate) and ``path_secret`` (mode 0600); return both.

    Refuses (``KeyFileError``) to replace existing files unless ``overwrite``.
    """
    if keypair.secret is None:
        raise ValueError("a keypair without its secret key cannot be written")
    public_path = os.fspath(path)
    secret_path = public_path + SECRET_SUFFIX
    for target in () if overwrite else (public_path, secret_path):
        if os.path.lexists(target):
            raise KeyFileError(f"{target} exists already; remove it first or choose another "
                               "name")
    for target, text, mode, banner in (
            (secret_path, True, 0o600, _SECRET_BANNER),
            (public_path, False, 0o644, _PUBLIC_BANNER)):
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
        try:
            fd = os.open(target, flags, mode)
        except OSError as exc:
            raise KeyFileError(f"cannot write {target}: {exc.strerror}") from None
        with os.fdopen(fd, "w", encoding="ascii") as f:
            os.fchmod(fd, mode)  # whatever the umask (and for a file that existed)
            f.write(_certificate(banner, keypair, text, metadata))
    return public_path, secret_path


# --- reading --------------------------------------------------------------

def _read(path: str) -> dict[str, str]:
    """The ``curve`` and ``metadata`` properties of certificate ``path`` (``curve/public-key``...)."""
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_FILE + 1)
    except FileNotFoundError:
        raise KeyFileError(f"no key file at {path}") from None
    except IsADirectoryError:
        raise KeyFileError(f"{path} is a directory, not a key file") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc.strerror}") from None
    if len(data) > _MAX_FILE:
        raise KeyFileError(f"{path} is not a certificate: over {_MAX_FILE} octets")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyFileError(f"{path} is not a certificate: not UTF-8 text") from None
    properties: dict[str, str] = {}
    section = ""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        prop = _PROPERTY.match(line)
        if prop is not None:
            indent, name = prop[1], prop[2]
            value = next(v for v in prop.groups()[2:] if v is not None)
            properties[f"{section}/{name}" if indent else name] = value
            continue
        head = _SECTION.match(line)
        if head is None:
            raise KeyFileError(f"{path} is not a certificate: line {number} is not ZPL")
        if not head[1]:
            section = head[2]
    return properties


def load_keypair(path: os.PathLike[str] | str) -> Keypair:
    """The keypair in secret certificate ``path`` (a ``..._secret`` file).

    KeyFileError when the file is missing, unreadable, malformed, readable
    by group or others, holds no secret key, or the keys do not belong
    together.
    """
    path = os.fspath(path)
    properties = _read(path)
    if "curve/secret-key" not in properties:
        hint = (f" (is the secret one {path}{SECRET_SUFFIX}?)"
                if os.path.exists(path + SECRET_SUFFIX) else "")
        raise KeyFileError(f"{path} holds no secret key{hint}")
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(f"secret key file {path} is open to others (mode "
                           f"{stat.S_IMODE(mode):04o}); run: chmod 600 {path}")
    secret = z85_key(properties["curve/secret-key"], f"secret-key in {path}")
    public = z85_key(properties.get("curve/public-key", ""), f"public-key in {path}")
    if zmq.curve_public(secret) != public:
        raise KeyFileError(f"{path}: the secret key does not belong to its public key")
    return Keypair(public, secret)


def load_public_key(path: os.PathLike[str] | str) -> bytes:
    """The Z85 public key in certificate ``path`` (public or secret); KeyFileError otherwise."""
    path = os.fspath(path)
    properties = _read(path)
    if "curve/public-key" not in properties:
        raise KeyFileError(f"{path} holds no curve public-key")
    return z85_key(properties["curve/public-key"], f"public-key in {path}")
