"""``peermesh mtl user add|remove|list``: the gateway's SASL users in its credentials file."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ..argtypes import text
from ..cli.output import EXIT_OK, clean, emit, note, table, to_json
from .passwords import read_password

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .credentials import CredentialsFile


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
