"""The NFP options of the ``job``, ``worker``, ``broker`` and ``file`` commands: the ``[nfp]``
table's keys, the environment, the command line (which wins), and the node they configure."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Callable, Optional
import gevent

from ..argtypes import is_seconds
from ..cli.output import table
from ..cli.session import NodeSession
from ..config import read_table
from ..overlay.election import MODES
from .mesh import NfpNode, default_data_dir


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


#: keys of the ``[nfp]`` table of ``--config``: (what a value must be, check, default);
#: each is the option of the same name (``--data-dir`` is ``data_dir``) of the commands
#: that have it; a default of None means "see the option's help"
NFP_KEYS: dict[str, tuple[str, Callable[[Any], bool], Any]] = {
    "data_dir": ("a path", _text, None),
    "keepalive": ("a positive number of seconds", is_seconds, 1.0),
    "multiplier": ("an integer of at least 2", lambda v: _integer(v) and v >= 2, 3),
    "request_timeout": ("a positive number of seconds", is_seconds, 5.0),
    "queue_timeout": ("a positive number of seconds", is_seconds, 30.0),
    "broker": (f"one of {', '.join(MODES)}", lambda v: v in MODES, None),
    "priority": ("an integer", _integer, 0),
    "admin_token": ("a string", _text, None),
    "admin_keys": ("a path", _text, None),
    "grants": ("a path", _text, None),
    "retention": ("a positive number of seconds", is_seconds, 7 * 86400.0),
    "inventory": ("a path", _text, None),
    "files_root": ("a path", _text, None),
    "service": ("a string", _text, "demo"),
    "tasks": ("a module name", _text, "peermesh.nfp.demo"),
    "worker_name": ("a string", _text, None),
}


#: options whose environment variable overrides the file (the command line overrides both)
_NFP_ENV = {"data_dir": "PEERMESH_DATA_DIR", "admin_token": "PEERMESH_NFP_ADMIN_TOKEN"}


#: keys only ``peermesh worker`` reads (``job --service`` is the job's service, not this)
_WORKER_ONLY = frozenset(("service", "tasks", "worker_name"))


def load_nfp_table(path: Optional[os.PathLike[str] | str]) -> dict[str, Any]:
    """The checked ``[nfp]`` table of TOML file ``path`` ({} if none); ValueError if wrong."""
    return read_table(path, "nfp", NFP_KEYS)


def _resolve_nfp_options(args: argparse.Namespace, worker: bool = False) -> None:
    """Fill the NFP options not given on the command line: environment, [nfp], defaults."""
    table = load_nfp_table(getattr(args, "config", None))
    for key, (_, _, default) in NFP_KEYS.items():
        if not hasattr(args, key) or getattr(args, key) is not None \
                or (key in _WORKER_ONLY and not worker):
            continue                                   # not this command's, or given
        env = _NFP_ENV.get(key)
        if env is not None and os.environ.get(env):
            if key == "admin_token":
                setattr(args, key, os.environ[env])
            continue                                   # data_dir: default_data_dir() reads it
        setattr(args, key, table.get(key, default))
    for key, option in (("inventory", "--inventory"), ("files_root", "--files-root")):
        where = getattr(args, key, None)
        if where is not None and not Path(where).is_dir():
            raise ValueError(f"{option} {where}: not a directory")
    data_dir = Path(args.data_dir) if getattr(args, "data_dir", None) else default_data_dir()
    if data_dir.exists() and not data_dir.is_dir():
        raise ValueError(f"data directory {data_dir} is a file, not a directory (give another "
                         "with --data-dir or $PEERMESH_DATA_DIR)")


def _option(args: argparse.Namespace, key: str) -> Any:
    """An NFP option's value, or its default for a command that does not take it."""
    value = getattr(args, key, None)
    return NFP_KEYS[key][2] if value is None else value


def _nfp_node(session: NodeSession, args: argparse.Namespace, *, broker: str = "never",
              store_name: Optional[str] = None) -> NfpNode:
    try:
        return NfpNode(session.node, data_dir=args.data_dir, broker=broker,
                       priority=_option(args, "priority"), keepalive=_option(args, "keepalive"),
                       multiplier=_option(args, "multiplier"),
                       queue_timeout=_option(args, "queue_timeout"),
                       request_timeout=_option(args, "request_timeout"),
                       retention=_option(args, "retention"),
                       admin_token=getattr(args, "admin_token", None),
                       admin_keys=getattr(args, "admin_keys", None),
                       grants=getattr(args, "grants", None),
                       inventory_dir=getattr(args, "inventory", None),
                       files_root=getattr(args, "files_root", None), store_name=store_name,
                       peer_networks=getattr(args, "peer_network", None),
                       on_shutdown=lambda: gevent.spawn(session.stop))
    except OSError as exc:
        raise RuntimeError(f"cannot open the job store: {exc}") from exc
