"""``peermesh mtl`` subcommands: a gateway, its users and its clients from the shell.

Registered through ``peermesh.cli.commands.COMMAND_MODULES``::

    peermesh mtl gateway [--run always|elected] [--address A] [--control-port P] ...
    peermesh mtl user add NAME [--read PATTERN]... [--write PATTERN]... [--expires WHEN]
    peermesh mtl user remove NAME
    peermesh mtl user list [--json]
    peermesh mtl read GROUP... --gateway ENDPOINT... [--user NAME] [--confirm full] [--json]
    peermesh mtl write GROUP [MESSAGE|-] --gateway ENDPOINT... [--user NAME] [--confirm full]

``gateway`` runs a node (the node options, ``lo`` unless an interface is
configured) with a ``Gateway`` until Ctrl-C / SIGTERM; its options come from
the command line, then the ``[mtl]`` table of ``--config`` (``MTL_KEYS``),
then the defaults, and it prints one JSON line per event (``ready``,
``serving``, ``standing-by``, ``replica``) on stdout. The ``user`` actions
take ``--credentials PATH`` (default: ``$PEERMESH_MTL_CREDENTIALS``, else
``mtl-credentials.json`` in the data directory). ``read`` and ``write`` are
clients of a gateway (``--gateway``, repeated for failover; default
``$PEERMESH_MTL_GATEWAY``, comma-separated), as ``--user`` (default
``$PEERMESH_MTL_USER``; none: ANONYMOUS). A password is never taken from the
command line: it comes from
``--password-file PATH`` (its first line; ``-`` is stdin),
``--password-env VAR``, else ``$PEERMESH_MTL_PASSWORD``, else a prompt on
the terminal.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Optional

from ..argtypes import cidr, is_seconds, positive_count, seconds, text, utf8
from ..cli.output import EXIT_OK, PROG, clean, emit, note, table, to_json
from ..cli.progress import Progress

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..config import NodeConfig
    from .credentials import CredentialsFile

# The credentials (scramp) and the client (pyzmq, asyncio) are imported by the actions
# that use them, so that building the parser for any other command stays quick.

__all__ = ["add_commands", "read_password", "PASSWORD_ENV", "MTL_KEYS", "load_mtl_table"]

#: the environment variable a password is read from when no option names a source
PASSWORD_ENV = "PEERMESH_MTL_PASSWORD"


def read_password(args: argparse.Namespace, confirm: bool = False) -> str:
    """The password from ``--password-file``, ``--password-env``, ``$PEERMESH_MTL_PASSWORD``
    or the terminal (asked twice with ``confirm``); ValueError saying what is missing."""
    if args.password_file is not None:
        where = "standard input" if args.password_file == "-" else args.password_file
        try:
            if args.password_file == "-":
                line = sys.stdin.readline()
            else:
                with open(args.password_file, encoding="utf-8") as f:
                    line = f.readline()
        except OSError as exc:
            raise ValueError(f"cannot read the password file {where}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ValueError(f"the password file {where} is not UTF-8 text") from None
        password = line.rstrip("\r\n")
        if not password:
            raise ValueError(f"the first line of {where} is empty: no password")
        return password
    variable = args.password_env or (PASSWORD_ENV if os.environ.get(PASSWORD_ENV) else None)
    if variable is not None:
        password = os.environ.get(variable, "")
        if not password:
            raise ValueError(f"${variable} is not set or empty: no password")
        return password
    if not sys.stdin.isatty():
        raise ValueError("no password: standard input is not a terminal to ask on; give "
                         f"--password-file PATH, --password-env VAR or ${PASSWORD_ENV}")
    import getpass

    password = getpass.getpass("Password: ")
    if not password:
        raise ValueError("the password must not be empty")
    if confirm and getpass.getpass("Password again: ") != password:
        raise ValueError("the two passwords differ")
    return password


def password_options(parser: argparse.ArgumentParser) -> None:
    """``--password-file`` and ``--password-env`` (one of them, or neither)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--password-file", metavar="PATH", type=text,
                       help="read the password from the first line of PATH (- : stdin)")
    group.add_argument("--password-env", metavar="VAR", type=text,
                       help=f"read the password from environment variable VAR (default: "
                            f"${PASSWORD_ENV} when set, else a prompt)")


def _expiry(value: str) -> float:
    """Option type: an ISO 8601 time from now on."""
    from .credentials import CredentialsError, parse_time

    try:
        when = parse_time(value)
    except CredentialsError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("expires ", "", 1)) from None
    if when <= time.time():
        raise argparse.ArgumentTypeError(f"{value!r} has passed already")
    return when


def _credentials_option(parser: "argparse.ArgumentParser | argparse._ArgumentGroup",
                        short: bool = True) -> None:
    parser.add_argument(*(("--credentials", "-c") if short else ("--credentials",)),
                        metavar="PATH", type=text,
                        help="the credentials file (default: $PEERMESH_MTL_CREDENTIALS, else "
                             "mtl-credentials.json in $PEERMESH_DATA_DIR, else in "
                             "~/.local/share/peermesh)")


def _credentials(args: argparse.Namespace) -> "CredentialsFile":
    from .credentials import CredentialsFile, default_credentials_path

    path = Path(args.credentials) if args.credentials else default_credentials_path()
    if path.is_dir():
        raise ValueError(f"credentials file {path} is a directory")
    return CredentialsFile(path)


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``mtl`` and its actions to the ``peermesh`` parser."""
    command(
        "mtl", "11/MTL gateway: read and write groups from off the LAN, manage its users",
        "The MTL gateway lets clients off the LAN read and write mesh groups. Its users, "
        "their salted SCRAM-SHA-256 verifiers (never a password) and the groups each may "
        "read and write live in a credentials file that the gateway re-reads when it "
        "changes. 'peermesh mtl ACTION --help' shows the options of each action.",
        f"  {PROG} mtl user add alice --read 'chat' --read 'sensors.*' --write chat\n"
        f"  {PROG} mtl read chat --gateway tcp://gw.example:5560 --user alice\n"
        f"  echo hello | {PROG} mtl write chat - -g tcp://gw.example:5560 -u alice",
        None)
    _add_client_commands(command)
    _add_gateway_command(command)
    command(
        "mtl user", "add, remove and list the gateway's users",
        "Users of the MTL gateway in the credentials file.",
        f"  {PROG} mtl user add alice --read '*' --expires 2027-01-01\n"
        f"  {PROG} mtl user remove alice",
        None)
    add = command(
        "mtl user add", "add a user (or with --replace change one)",
        "Add a user with a password (asked on the terminal unless --password-file or "
        "--password-env says where it is) and the groups it may read and write. Patterns "
        "are shell-style and case-sensitive: '*' any run of characters, '?' one, '[ab]' "
        "one of a set; '*' alone grants every group. Without --read or --write the user "
        "may authenticate but use nothing.",
        f"  {PROG} mtl user add alice --read chat --read 'sensors.*' --write chat\n"
        f"  PEERMESH_MTL_PASSWORD=s3cret {PROG} mtl user add bot --write 'jobs.*'\n"
        f"  {PROG} mtl user add alice --replace --read '*' --password-file pw.txt",
        _cmd_add, node_options=False)
    add.add_argument("name", metavar="NAME", type=text, help="the user name")
    add.add_argument("--read", "-r", metavar="PATTERN", action="append", default=[], type=text,
                     help="groups the user may read (repeat for several)")
    add.add_argument("--write", "-w", metavar="PATTERN", action="append", default=[],
                     type=text, help="groups the user may write (repeat for several)")
    add.add_argument("--expires", metavar="WHEN", type=_expiry,
                     help="ISO 8601 time (UTC without a zone) from which the user cannot "
                          "authenticate; gateways end its sessions (default: never)")
    add.add_argument("--iterations", metavar="N", type=positive_count,
                     help="PBKDF2 iterations of the verifier, 4096 (RFC 7677's minimum, the "
                          "default) to 10000000; the client computes them at each login")
    add.add_argument("--replace", action="store_true",
                     help="replace the user if it exists (new password, grants, expiry)")
    password_options(add)
    _credentials_option(add)

    remove = command(
        "mtl user remove", "remove a user; gateways end its sessions",
        "Remove a user from the credentials file. Gateways answer its sessions 401 once "
        "they have re-read the file.",
        f"  {PROG} mtl user remove alice", _cmd_remove, node_options=False)
    remove.add_argument("name", metavar="NAME", type=text, help="the user name")
    _credentials_option(remove)

    listing = command(
        "mtl user list", "list the users and their grants",
        "The users of the credentials file, their grants and expiry.",
        f"  {PROG} mtl user list\n  {PROG} mtl user list --json", _cmd_list,
        node_options=False)
    listing.add_argument("--json", action="store_true", help="one JSON list on stdout")
    _credentials_option(listing)


def _cmd_add(args: argparse.Namespace, config: Any) -> int:
    from .credentials import (DEFAULT_ITERATIONS, MAX_ITERATIONS, MIN_ITERATIONS,
                              CredentialsError, User, make_user)

    credentials = _credentials(args)
    iterations = DEFAULT_ITERATIONS if args.iterations is None else args.iterations
    try:   # the arguments are checked before the password is asked for
        make_user(args.name, "-", args.read, args.write, args.expires, MIN_ITERATIONS)
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise CredentialsError(f"--iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    except CredentialsError as exc:
        raise ValueError(str(exc)) from None
    if credentials.user(args.name) is not None and not args.replace:
        raise ValueError(f"user {args.name!r} exists in {credentials.path}; add --replace to "
                         "change its password, grants or expiry")
    password = read_password(args, confirm=True)
    user = make_user(args.name, password, read=args.read, write=args.write,
                     expires=args.expires, iterations=iterations)
    replaced: list[bool] = []

    def put(users: dict[str, User]) -> None:
        replaced.append(user.name in users)
        if replaced[0] and not args.replace:   # added meanwhile by someone else
            raise CredentialsError(f"user {args.name!r} was added to {credentials.path} "
                                   "meanwhile; add --replace to change it")
        users[user.name] = user

    credentials.update(put)
    note(f"{'replaced' if replaced[0] else 'added'} user {clean(user.name)} in "
         f"{credentials.path}")
    return EXIT_OK


def _cmd_remove(args: argparse.Namespace, config: Any) -> int:
    from .credentials import CredentialsError, User

    credentials = _credentials(args)

    def drop(users: dict[str, User]) -> None:
        if users.pop(args.name, None) is None:
            raise CredentialsError(f"no user {args.name!r} in {credentials.path}")

    credentials.update(drop)
    note(f"removed user {clean(args.name)} from {credentials.path}")
    return EXIT_OK


def _cmd_list(args: argparse.Namespace, config: Any) -> int:
    from .credentials import format_time

    credentials = _credentials(args)
    now = time.time()
    users = [credentials.users[name] for name in sorted(credentials.users)]
    if args.json:
        emit(to_json([{"name": u.name, "read": list(u.read), "write": list(u.write),
                       "expires": format_time(u.expires) if u.expires is not None else None,
                       "expired": u.expired(now), "iterations": u.verifier.iterations}
                      for u in users]))
        return EXIT_OK
    if not users:
        note(f"no users in {credentials.path}")
        return EXIT_OK
    rows = [["USER", "READ", "WRITE", "EXPIRES"]]
    for u in users:
        expires = "never" if u.expires is None else format_time(u.expires) + (
            " (expired)" if u.expired(now) else "")
        rows.append([clean(u.name), clean(" ".join(u.read)) or "-",
                     clean(" ".join(u.write)) or "-", expires])
    emit(table(rows))
    return EXIT_OK


# --------------------------------------------------------------------------
# read and write: a client of a gateway

#: environment variables of the client options
GATEWAY_ENV, USER_ENV = "PEERMESH_MTL_GATEWAY", "PEERMESH_MTL_USER"


def _client_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("gateway options")
    group.add_argument("--gateway", "-g", metavar="ENDPOINT", action="append", type=text,
                       help="tcp://HOST:PORT of a gateway's control flow; repeat it for "
                            f"failover (default: ${GATEWAY_ENV}, comma-separated)")
    group.add_argument("--user", "-u", metavar="NAME", type=text,
                       help=f"authenticate as NAME (default: ${USER_ENV}; none: anonymous)")
    group.add_argument("--confirm", choices=("none", "full"), default="none",
                       help="none: content may be lost on the way; full: the gateway stores "
                            "it until a reader confirms it (default: %(default)s)")
    group.add_argument("--profile", default="mesh", type=text,
                       help="the gateway profile (default: %(default)s; 'test' has one "
                            "group, 'resource')")
    group.add_argument("--vhost", default="/", type=text, metavar="NAME",
                       help="the gateway's virtual host (default: %(default)s)")
    group.add_argument("--timeout", type=seconds, default=5.0, metavar="SECONDS",
                       help="longest wait for a gateway's answer (default: %(default)s)")
    group.add_argument("--server-key", metavar="FILE", type=text,
                       help="the gateway node's public certificate (peermesh keygen's PATH): "
                            "talk CURVE to a gateway on keys (default: a plain link)")
    password_options(parser)


def _add_client_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    read = command(
        "mtl read", "print what is written to mesh groups, through a gateway",
        "Summon each GROUP and print every content as it comes, one line each (the body "
        "as text), until Ctrl-C or --count. With --confirm full the gateway stores the "
        "groups' content, across restarts, until a confirmed reader (this one, or another "
        "sharing the queue) has printed and confirmed it.",
        f"  {PROG} mtl read chat -g tcp://gw.example:5560 -u alice\n"
        f"  {PROG} mtl read jobs --confirm full --json --count 10 -g tcp://gw.example:5560",
        _cmd_read, node_options=False)
    read.add_argument("groups", metavar="GROUP", nargs="+", type=text, help="a mesh group")
    read.add_argument("--json", action="store_true",
                      help="one JSON object per content: resource, sequence, body, properties")
    read.add_argument("--count", "-n", type=positive_count, metavar="N",
                      help="stop after N contents")
    _client_options(read)

    write = command(
        "mtl write", "write to a mesh group, through a gateway",
        "Send MESSAGE into GROUP; with '-' (or no MESSAGE) send each line of standard input "
        "as one content. With --confirm full it waits until the gateway has stored "
        "everything, and fails if it did not.",
        f"  {PROG} mtl write chat 'hello from afar' -g tcp://gw.example:5560 -u alice\n"
        f"  tail -f app.log | {PROG} mtl write logs - --confirm full -g tcp://gw.example:5560",
        _cmd_write, node_options=False)
    write.add_argument("group", metavar="GROUP", type=text, help="a mesh group")
    write.add_argument("message", metavar="MESSAGE", nargs="?", default="-", type=utf8,
                       help="the content; '-' (the default): each line of standard input")
    _client_options(write)


def _client(args: argparse.Namespace, password_from_stdin_ok: bool = True) -> Any:
    from .client import Client

    gateways = args.gateway or [g.strip() for g in os.environ.get(GATEWAY_ENV, "").split(",")
                                if g.strip()]
    if not gateways:
        raise ValueError(f"no gateway: give --gateway tcp://HOST:PORT or ${GATEWAY_ENV}")
    user = args.user or os.environ.get(USER_ENV) or None
    if user is not None and args.password_file == "-" and not password_from_stdin_ok:
        raise ValueError("standard input carries the messages: give the password with "
                         f"--password-file PATH, --password-env VAR or ${PASSWORD_ENV}")
    server_key = None
    if args.server_key is not None:
        from ..io.keys import load_public_key
        server_key = load_public_key(args.server_key)   # KeyFileError naming what is wrong
    password = read_password(args) if user is not None else None
    return Client(gateways, user, password, virtual_host=args.vhost, profile=args.profile,
                  timeout=args.timeout, server_key=server_key)


def _cmd_read(args: argparse.Namespace, config: Any) -> int:
    client = _client(args)
    shown = 0
    try:
        client.connect()
        reader = client.reader(args.groups, confirm=args.confirm)
        for group in args.groups:
            reader.summon(group)
        note(f"reading {', '.join(clean(g) for g in args.groups)} through {client.gateway}"
             f" as {clean(client.user or 'anonymous')}")
        with Progress("reading", total=args.count, unit="msg") if args.count is not None \
                else nullcontext(None) as bar:
            for received in reader:
                line = _render(received, args.json, len(args.groups) > 1)
                if bar is not None:
                    bar.emit(line)
                    bar.update()
                else:
                    emit(line)
                if args.confirm == "full":
                    reader.confirm(received)
                shown += 1
                if args.count is not None and shown >= args.count:
                    break
    except KeyboardInterrupt:   # Ctrl-C or SIGTERM: the normal end of following
        pass
    finally:
        client.close()
    return EXIT_OK


def _render(received: Any, as_json: bool, named: bool) -> str:
    if as_json:
        return to_json({"resource": received.resource, "sequence": received.sequence,
                        "body": received.body, "properties": received.properties})
    text = clean(received.body.decode("utf-8", "backslashreplace"))
    return f"{clean(received.resource)}: {text}" if named else text


def _cmd_write(args: argparse.Namespace, config: Any) -> int:
    from .client import ClientError

    lines = sys.stdin if args.message == "-" else [args.message]
    client = _client(args, password_from_stdin_ok=args.message != "-")
    sent = 0
    try:
        client.connect()
        where = client.gateway
        writer = client.writer([args.group], confirm=args.confirm)
        for line in lines:
            writer.send(line.rstrip("\n").encode("utf-8", "surrogateescape"), args.group)
            sent += 1
        if not writer.wait(args.timeout):
            raise ClientError(f"the gateway confirmed {sent - writer.unconfirmed} of {sent} "
                              f"contents within {args.timeout:g} s")
        if writer.rejected:
            raise ClientError(f"the gateway rejected {len(writer.rejected)} of {sent} contents")
    finally:
        client.close()
    note(f"wrote {sent} content{'s' if sent != 1 else ''} to {clean(args.group)} through "
         f"{where}{', all stored' if args.confirm == 'full' else ''}")
    return EXIT_OK


# --------------------------------------------------------------------------
# gateway: a node serving the MTL gateway


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

