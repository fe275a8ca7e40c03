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

This module builds the parser; the actions are in ``usercommands``,
``clientcommands`` (``read``, ``write``) and ``gatewaycommand``; passwords are read by
``passwords``.
"""

from __future__ import annotations

import argparse
from typing import Callable

from ..argtypes import positive_count, text
from ..cli.output import PROG
from .clientcommands import _add_client_commands
from .gatewaycommand import MTL_KEYS, _add_gateway_command, load_mtl_table
from .passwords import PASSWORD_ENV, password_options, read_password
from .usercommands import _cmd_add, _cmd_list, _cmd_remove, _credentials_option, _expiry

# The credentials (scramp) and the client (pyzmq, asyncio) are imported by the actions
# that use them, so that building the parser for any other command stays quick.

__all__ = ["add_commands", "read_password", "PASSWORD_ENV", "MTL_KEYS", "load_mtl_table"]


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
