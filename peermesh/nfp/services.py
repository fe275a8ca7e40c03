"""Broker services and their authorisation: SID inventory, FSS files, the admin token.

How it works
------------
The broker hosts three services as ordinary workers inside its own process
(connected to its ROUTER over ``inproc``), so they are posted to and fetched
like any job:

* ``mmi.service.broker`` - ``show_broker``, ``show_workers``, ``show_clients``,
  ``show_services``; and, for authorised callers only, ``disconnect`` (every
  worker gets DISCONNECT and re-registers), ``restart`` (the broker drops all
  state and starts afresh) and ``shutdown`` (the broker's node leaves).
* ``sid.service.broker`` - ``get_inventory(name)``: the file ``<name>.yaml``,
  ``<name>.yml`` or ``<name>.json`` from the inventory directory. YAML needs
  PyYAML (an optional dependency); without it only JSON files are read.
* ``fss.service.broker`` - ``list_files(url)``, ``file_details(url)`` (size,
  SHA-256, chunk count) and ``fetch_file(url, chunk, chunk_size)`` (one chunk,
  base64, with its own SHA-256) for ``nf://path`` URLs under the files root.
  Paths are resolved (symlinks included) and refused unless they stay under
  the root: ``nf://../../etc/passwd`` is an error.

Every worker also answers ``mmi.service.worker`` (``show_broker``,
``show_workers``, ``show_clients``; ``disconnect``, ``restart`` and
``shutdown`` for authorised callers). The MMI tasks are ``Broker.mmi_tasks``
and ``Worker.mmi_tasks``; this module imports neither (they import it).

Authorisation: NFP's security sections are TBD, so destructive calls need a
shared secret, ``admin_token``, configured on the broker (or worker) and
passed as the ``token`` keyword argument of the task. Without a configured
token destructive calls are always refused. Without CURVE keys the token
travels in the clear on the LAN: it stops accidents and casual misuse, not
an attacker who can read the network. On a mesh with keys, ``admin_keys``
(a set of public keys) replaces it: a call is allowed when the key its
request was authenticated with is one of them. What else each key may use
(tasks, FSS files) is in its grants (``peermesh.nfp.grants``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
from pathlib import Path
from typing import AbstractSet, Any, Callable, Optional

import gevent

from .errors import NfpError
from .grants import Grants

__all__ = ["authorise", "later", "sid_tasks", "fss_tasks", "resolve_nf_url",
           "NotAuthorised", "yaml_available", "CHUNK_SIZE"]

CHUNK_SIZE = 256 * 1024
MAX_CHUNK = 4 * 1024 * 1024
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


class NotAuthorised(NfpError):
    """A destructive management call without the right token."""


def authorise(configured: Optional[str], given: Any, what: str,
              admin_keys: Optional[AbstractSet[bytes]] = None, caller: Any = None) -> None:
    """NotAuthorised unless ``given`` is the ``configured`` admin token; with
    ``admin_keys`` (on a mesh with CURVE keys) unless ``caller``, the key the request
    was authenticated with, is one of them (the token is not used then)."""
    if admin_keys is not None:
        if not isinstance(caller, str) or caller.encode() not in admin_keys:
            raise NotAuthorised(f"{what} is refused: the caller's key is not an admin key")
        return
    if not configured:
        raise NotAuthorised(f"{what} is refused: no admin token is configured")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), configured.encode()):
        raise NotAuthorised(f"{what} is refused: missing or wrong token")


def later(action: Callable[[], Any]) -> None:
    """Run ``action`` once the job that asked for it has answered."""
    gevent.spawn_later(0.2, action)


# --- SID --------------------------------------------------------------------

def yaml_available() -> bool:
    """True when PyYAML can be imported (YAML inventory files are then read too)."""
    try:
        import yaml  # noqa: F401
    except ImportError:
        return False
    return True


def sid_tasks(directory: Optional[os.PathLike[str] | str]) -> dict[str, Callable[..., Any]]:
    """The ``sid.service.broker`` tasks over inventory ``directory``."""

    def get_inventory(job: Any, name: Optional[str] = None) -> dict[str, Any]:
        if directory is None:
            raise LookupError("this broker has no inventory directory configured")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"inventory name {name!r} must be letters, digits, '.', '_', '-'")
        root = Path(directory)
        for suffix in (".yaml", ".yml", ".json"):
            path = root / f"{name}{suffix}"
            if not path.is_file():
                continue
            text = path.read_text(encoding="utf-8")
            if suffix == ".json":
                data = json.loads(text)
            else:
                try:
                    import yaml
                except ImportError:
                    raise RuntimeError(f"{path.name} is YAML but PyYAML is not installed; "
                                       "install PyYAML or use a .json file") from None
                data = yaml.safe_load(text)
            if data is None:
                data = {}
            if not isinstance(data, dict):
                raise ValueError(f"inventory {path.name} is not a mapping")
            return data
        raise LookupError(f"no inventory for {name!r} (looked for {name}.yaml, .yml, .json)")

    def list_inventory(job: Any) -> list[str]:
        if directory is None:
            return []
        suffixes = (".yaml", ".yml", ".json")
        return sorted({p.stem for p in Path(directory).iterdir()
                       if p.suffix in suffixes and _NAME.match(p.stem)})

    return {"get_inventory": get_inventory, "list_inventory": list_inventory}


# --- FSS --------------------------------------------------------------------

def resolve_nf_url(root: os.PathLike[str] | str, url: str) -> Path:
    """The file ``url`` (``nf://path``) names under ``root``; ValueError outside it.

    The path is relative to the root (a leading ``/`` is the root too); ``..`` and
    symlinks are resolved first and the result must still be under the root.
    """
    if not isinstance(url, str) or not url.startswith("nf://"):
        raise ValueError(f"{url!r} is not an nf:// URL")
    relative = url[len("nf://"):]
    if "\x00" in relative:
        raise ValueError("nf:// path contains NUL")
    base = Path(root).resolve()
    path = (base / relative.lstrip("/")).resolve() if relative.strip("/") else base
    if not path.is_relative_to(base):
        raise ValueError(f"{url} is outside the files root; refused")
    return path


def fss_tasks(root: Optional[os.PathLike[str] | str],
              grants: Optional[Grants] = None) -> dict[str, Callable[..., Any]]:
    """The ``fss.service.broker`` tasks serving files under ``root`` (with ``grants``: only
    the URLs granted to the caller's key)."""

    def where(url: Any, job: Any) -> Path:
        if root is None:
            raise LookupError("this broker serves no files (no files root configured)")
        path = resolve_nf_url(root, url)
        if grants is not None:
            relative = path.relative_to(Path(root).resolve()).as_posix()
            normal = "nf://" + ("" if relative == "." else relative)
            if not grants.allows_file(job.caller, normal):
                raise NotAuthorised(f"{normal} is not granted to the caller's key")
        return path

    def list_files(job: Any, url: str = "nf://") -> list[str]:
        path = where(url, job)
        if not path.is_dir():
            raise NotADirectoryError(f"{url} is not a directory")
        base = Path(root).resolve()  # type: ignore[arg-type]
        return sorted(f"nf://{p.relative_to(base).as_posix()}" + ("/" if p.is_dir() else "")
                      for p in path.iterdir())

    def file_details(job: Any, url: str, chunk_size: int = CHUNK_SIZE) -> dict[str, Any]:
        path = where(url, job)
        if not path.is_file():
            raise FileNotFoundError(f"{url} is not a file")
        size_limit = _chunk_size(chunk_size)
        digest = hashlib.sha256()
        size = 0
        with path.open("rb") as f:
            while True:
                block = f.read(1 << 20)
                if not block:
                    break
                digest.update(block)
                size += len(block)
                gevent.sleep(0)
        return {"url": url, "size": size, "sha256": digest.hexdigest(),
                "chunk_size": size_limit, "chunks": max(1, -(-size // size_limit)),
                "mtime": path.stat().st_mtime}

    def fetch_file(job: Any, url: str, chunk: int = 0, chunk_size: int = CHUNK_SIZE
                   ) -> dict[str, Any]:
        path = where(url, job)
        if not path.is_file():
            raise FileNotFoundError(f"{url} is not a file")
        limit = _chunk_size(chunk_size)
        if not isinstance(chunk, int) or chunk < 0:
            raise ValueError("chunk must be a non-negative integer")
        with path.open("rb") as f:
            f.seek(chunk * limit)
            data = f.read(limit)
            eof = not f.read(1)
        return {"url": url, "chunk": chunk, "offset": chunk * limit, "size": len(data),
                "eof": eof, "sha256": hashlib.sha256(data).hexdigest(),
                "data": base64.b64encode(data).decode("ascii")}

    return {"list_files": list_files, "file_details": file_details, "fetch_file": fetch_file}


def _chunk_size(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_CHUNK:
        raise ValueError(f"chunk_size must be 1..{MAX_CHUNK}")
    return value
