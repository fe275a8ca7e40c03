"""How the ``mtl`` commands read a user's password: never from the command line, but from
``--password-file``, ``--password-env``, ``$PEERMESH_MTL_PASSWORD`` or a prompt on the terminal."""

from __future__ import annotations

import argparse
import os
import sys

from ..argtypes import text


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
