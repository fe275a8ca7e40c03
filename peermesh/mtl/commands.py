"""``peermesh mtl`` subcommands: the gateway's users from the shell.

Registered through ``peermesh.cli.commands.COMMAND_MODULES``::

    peermesh mtl user add NAME [--read PATTERN]... [--write PATTERN]... [--expires WHEN]
    peermesh mtl user remove NAME
    peermesh mtl user list [--json]

Each takes ``--credentials PATH`` (default: ``$PEERMESH_MTL_CREDENTIALS``,
else ``mtl-credentials.json`` in the data directory). A password is never
taken from the command line: it comes from ``--password-file PATH`` (its
first line; ``-`` is stdin), ``--password-env VAR``, else
``$PEERMESH_MTL_PASSWORD``, else a prompt on the terminal.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ..argtypes import positive_count, text
from ..cli.output import EXIT_OK, PROG, clean, emit, note, table, to_json
from .credentials import (MAX_ITERATIONS, MIN_ITERATIONS, CredentialsError, CredentialsFile,
                          User, default_credentials_path, format_time, make_user, parse_time)

__all__ = ["add_commands", "read_password", "PASSWORD_ENV"]

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
    try:
        when = parse_time(value)
    except CredentialsError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("expires ", "", 1)) from None
    if when <= time.time():
        raise argparse.ArgumentTypeError(f"{value!r} has passed already")
    return when


def _credentials_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--credentials", "-c", metavar="PATH", type=text,
                        help="the credentials file (default: $PEERMESH_MTL_CREDENTIALS, else "
                             "mtl-credentials.json in $PEERMESH_DATA_DIR, else in "
                             "~/.local/share/peermesh)")


def _credentials(args: argparse.Namespace) -> CredentialsFile:
    path = Path(args.credentials) if args.credentials else default_credentials_path()
    if path.is_dir():
        raise ValueError(f"credentials file {path} is a directory")
    return CredentialsFile(path)


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``mtl`` and its actions to the ``peermesh`` parser."""
    command(
        "mtl", "11/MTL gateway: manage its users",
        "The MTL gateway lets clients off the LAN read and write mesh groups. Its users, "
        "their salted SCRAM-SHA-256 verifiers (never a password) and the groups each may "
        "read and write live in a credentials file that the gateway re-reads when it "
        "changes. 'peermesh mtl ACTION --help' shows the options of each action.",
        f"  {PROG} mtl user add alice --read 'chat' --read 'sensors.*' --write chat\n"
        f"  {PROG} mtl user list --json",
        None)
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
    add.add_argument("--iterations", metavar="N", type=positive_count, default=4096,
                     help=f"PBKDF2 iterations of the verifier, {MIN_ITERATIONS}.."
                          f"{MAX_ITERATIONS}; each costs the client at login "
                          "(default: %(default)s)")
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
    credentials = _credentials(args)
    try:   # the arguments are checked before the password is asked for
        make_user(args.name, "-", args.read, args.write, args.expires, MIN_ITERATIONS)
        if not MIN_ITERATIONS <= args.iterations <= MAX_ITERATIONS:
            raise CredentialsError(f"--iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    except CredentialsError as exc:
        raise ValueError(str(exc)) from None
    if credentials.user(args.name) is not None and not args.replace:
        raise ValueError(f"user {args.name!r} exists in {credentials.path}; add --replace to "
                         "change its password, grants or expiry")
    password = read_password(args, confirm=True)
    user = make_user(args.name, password, read=args.read, write=args.write,
                     expires=args.expires, iterations=args.iterations)
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
    credentials = _credentials(args)

    def drop(users: dict[str, User]) -> None:
        if users.pop(args.name, None) is None:
            raise CredentialsError(f"no user {args.name!r} in {credentials.path}")

    credentials.update(drop)
    note(f"removed user {clean(args.name)} from {credentials.path}")
    return EXIT_OK


def _cmd_list(args: argparse.Namespace, config: Any) -> int:
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
