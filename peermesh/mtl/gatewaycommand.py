"""``peermesh mtl gateway``: a node with a ``Gateway`` until Ctrl-C / SIGTERM, its options from the
command line, then the ``[mtl]`` table of ``--config`` (``MTL_KEYS``), then the defaults."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Callable, Optional

from ..argtypes import cidr, is_seconds, seconds, text, utf8
from ..cli.output import EXIT_OK, PROG, emit, note, table, to_json
from .usercommands import _credentials_option

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..config import NodeConfig
    from .credentials import CredentialsFile


def _port(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 65535


def _vhosts(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in value.items())


#: keys of the ``[mtl]`` table of ``--config``: (what a value must be, check, default);
#: each is the ``peermesh mtl gateway`` option of the same name (``--data-dir``:
#: ``data_dir``; ``virtual_hosts`` is ``--vhost``); a default of None: see the option's help
MTL_KEYS: dict[str, tuple[str, Callable[[Any], bool], Any]] = {
    "credentials": ("a path", lambda v: isinstance(v, str) and bool(v), None),
    "data_dir": ("a path", lambda v: isinstance(v, str) and bool(v), None),
    "address": ("an IPv4 address or host name", lambda v: isinstance(v, str) and bool(v), None),
    "control_port": ("a port, 0 (any free one) to 65535", _port, 0),
    "data_port": ("a port, 0 (any free one) to 65535", _port, 0),
    "run": ("always or elected", lambda v: v in ("always", "elected"), "elected"),
    "broker": ("auto or always", lambda v: v in ("auto", "always"), "auto"),
    "priority": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool), 0),
    "virtual_hosts": ("a table of virtual host = group prefix", _vhosts, None),
    "plain": ("true or false", lambda v: isinstance(v, bool), None),
    "anonymous": ("true or false", lambda v: isinstance(v, bool), False),
    "heartbeat": ("a positive number of seconds", is_seconds, 1.0),
    "lease_ttl": ("a positive number of seconds", is_seconds, 30.0),
    "session_lifetime": ("a positive number of seconds", is_seconds, None),
}


def load_mtl_table(path: "Optional[os.PathLike[str] | str]") -> dict[str, Any]:
    """The checked ``[mtl]`` table of TOML file ``path`` ({} if none); ValueError if wrong."""
    from ..config import read_table

    return read_table(path, "mtl", MTL_KEYS)


def _virtual_host(item: str) -> tuple[str, str]:
    """Option type: ``NAME=PREFIX`` (PREFIX may be empty)."""
    name, sep, prefix = item.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{item!r} is not NAME=PREFIX (e.g. /lab=lab.)")
    return utf8(name), utf8(prefix)


def _port_arg(value: str) -> int:
    """Option type: a TCP port, 0 for any free one."""
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port (0 to 65535)")
    return port


def _add_gateway_command(command: Callable[..., argparse.ArgumentParser]) -> None:
    gateway = command(
        "mtl gateway", "run a node with an MTL gateway, until Ctrl-C",
        "Start a node with an 11/MTL gateway and serve clients off the LAN until Ctrl-C or "
        "SIGTERM. The node stays on loopback unless an interface is given (--interface, "
        "$PEERMESH_INTERFACE or [node] interface); the gateway's two sockets listen on "
        "that interface's address unless --address says otherwise. With --run elected "
        "(the default) it serves only while its node is the mesh's elected broker and "
        "answers 503 naming the serving gateway otherwise; with --run always it serves "
        "from start to stop. Options also come from the [mtl] table of --config. Prints "
        "one JSON line per event on stdout: ready (the endpoints), serving, standing-by, "
        "replica (a standby holds a copy of the serving gateway's content).",
        f"  {PROG} mtl gateway --run always --control-port 5560\n"
        f"  {PROG} mtl gateway -i eth0 --data-dir /var/lib/peermesh --vhost /lab=lab.\n"
        f"  {PROG} mtl gateway --config /etc/peermesh/peermesh.toml",
        _cmd_gateway)
    group = gateway.add_argument_group("gateway options (also [mtl] in --config)")
    group.add_argument("--run", choices=("always", "elected"),
                       help="always: serve from start to stop; elected: only while this node "
                            "is the elected broker (default: elected)")
    group.add_argument("--broker", choices=("auto", "always"),
                       help="candidacy with --run elected: auto (elected by priority, then "
                            "UUID) or always (outranks every auto candidate) (default: auto)")
    group.add_argument("--priority", type=int, metavar="N",
                       help="election priority with --run elected, higher wins (default: 0)")
    group.add_argument("--address", metavar="HOST", type=text,
                       help="where the control and data sockets listen (default: the "
                            "interface's IPv4 address)")
    group.add_argument("--peer-network", action="append", metavar="CIDR", type=cidr,
                       help="use and hand to clients the endpoints other gateways advertise "
                            "only in this network (default: the node's interface network); "
                            "repeatable")
    group.add_argument("--control-port", type=_port_arg, metavar="PORT",
                       help="the control flow's TCP port (default: 0, any free one)")
    group.add_argument("--data-port", type=_port_arg, metavar="PORT",
                       help="the data flow's TCP port, the one each 202 names (default: 0, "
                            "any free one)")
    _credentials_option(group, short=False)
    group.add_argument("--data-dir", metavar="DIR", type=text,
                       help="where confirm: full content is stored (mtl.sqlite3, or "
                            "mtl-NAME.sqlite3 with --name; "
                            "default: $PEERMESH_DATA_DIR, else ~/.local/share/peermesh)")
    group.add_argument("--vhost", metavar="NAME=PREFIX", action="append", type=_virtual_host,
                       help="a virtual host and the prefix of the groups it reaches; "
                            "repeatable (default: / with no prefix)")
    group.add_argument("--plain", action="store_const", const=True,
                       help="also offer SASL PLAIN on a plain link (the password crosses "
                            "it) (default: only on a CURVE link, when the node has keys)")
    group.add_argument("--no-plain", dest="plain", action="store_const", const=False,
                       help="never offer SASL PLAIN, not even on a CURVE link")
    group.add_argument("--anonymous", action="store_const", const=True,
                       help="also offer SASL ANONYMOUS (with the grants of the user "
                            "'anonymous') (default: off)")
    group.add_argument("--heartbeat", type=seconds, metavar="SECONDS",
                       help="Ping a data link silent this long; it is dead after 3 (default: "
                            "1.0)")
    group.add_argument("--lease-ttl", type=seconds, metavar="SECONDS",
                       help="how long a lease outlives its data link (default: 30.0)")
    group.add_argument("--session-lifetime", type=seconds, metavar="SECONDS",
                       help="401 after this long, then the client authenticates again "
                            "(default: never)")


def _gateway_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The gateway's options: the command line, else the [mtl] table, else the defaults."""
    table = load_mtl_table(getattr(args, "config", None))
    given = dict(vars(args), virtual_hosts=dict(args.vhost) if args.vhost else None)
    return {key: given[key] if given.get(key) is not None else table.get(key, default)
            for key, (_, _, default) in MTL_KEYS.items()}


_STATES = {"serving": "serving", "standing-by": "standing by",
           "replica": "a replica of the serving gateway"}


def _cmd_gateway(args: argparse.Namespace, config: "NodeConfig") -> int:
    from ..cli.session import NodeSession
    from ..net.interfaces import select_interface
    from .credentials import CredentialsFile, default_credentials_path, default_data_dir
    from .gateway import Gateway

    settings = _gateway_settings(args)
    if config.interface is None:            # not configured anywhere: stay on this host
        config = config.replace(interface="lo")
    address = settings["address"] or select_interface(config.interface).address
    credentials_path = Path(settings["credentials"] or default_credentials_path())
    if credentials_path.is_dir():
        raise ValueError(f"credentials file {credentials_path} is a directory")
    data_dir = Path(settings["data_dir"] or default_data_dir())
    if data_dir.exists() and not data_dir.is_dir():
        raise ValueError(f"data directory {data_dir} is a file, not a directory")
    credentials = CredentialsFile(credentials_path)
    if not credentials.users:
        note(f"warning: no users in {credentials_path} yet; add them with '{PROG} mtl user "
             "add' (a running gateway reads the file again)")
    session = NodeSession(config, serving=True)

    def state(name: str) -> None:
        emit(to_json({"event": name, "control": gateway.control_endpoint}))
        note(f"{_STATES[name]} at {gateway.control_endpoint}")

    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        gateway = Gateway(credentials, address=address, control_port=settings["control_port"],
                          data_port=settings["data_port"], run=settings["run"],
                          broker=settings["broker"], priority=settings["priority"],
                          data_dir=data_dir, virtual_hosts=settings["virtual_hosts"],
                          plain=settings["plain"], anonymous=settings["anonymous"],
                          heartbeat=settings["heartbeat"], lease_ttl=settings["lease_ttl"],
                          session_lifetime=settings["session_lifetime"],
                          peer_networks=args.peer_network, on_state=state)
        gateway.attach(session.node)
    except BaseException:
        session.close()
        raise
    try:
        node = session.start()
        try:
            gateway.start()
        except OSError as exc:
            raise RuntimeError(f"cannot open the content store in {data_dir}: {exc}") from exc
        emit(to_json({"event": "ready", "node": node.name, "uuid": node.uuid.hex,
                      "pid": os.getpid(), "control": gateway.control_endpoint,
                      "data": gateway.data_endpoint, "run": settings["run"],
                      "credentials": str(credentials_path),
                      "store": str(gateway.store.path if gateway.store else "")}))
        note(f"MTL gateway on {node.name} ({node.uuid.hex}): control {gateway.control_endpoint},"
             f" data {gateway.data_endpoint}"
             f"{'' if settings['run'] == 'always' else ', serving while elected'}; "
             "Ctrl-C to stop")
        session.wait_stopped()
    finally:
        try:
            gateway.stop()
        finally:
            session.close()
    return EXIT_OK
