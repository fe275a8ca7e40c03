"""``peermesh keygen``: make a node's CURVE keypair as ZeroMQ certificate files.

Registered through ``peermesh.cli.commands.COMMAND_MODULES``. ``keygen PATH``
writes the public certificate to ``PATH`` and the secret one to
``PATH_secret`` (mode 0600), as ZeroMQ's ``zcert_save`` names them, and prints
the public key. Copy the public file into the allowed-keys directory of the
nodes that should admit this one.
"""

from __future__ import annotations

import argparse
import json
from typing import Callable, Optional

from ..cli.output import EXIT_FAILURE, EXIT_OK, PROG, emit, note
from ..config import NodeConfig

__all__ = ["add_commands"]


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``keygen`` with build_parser's ``command`` factory."""
    keygen = command(
        "keygen", "make a CURVE keypair (ZeroMQ certificate files)",
        "Write a new CURVE keypair as ZeroMQ certificates: the public one to PATH and the "
        "secret one to PATH_secret (mode 0600 whatever the umask). A node uses the secret "
        "file (key_file, --key-file, PEERMESH_KEY_FILE); the nodes that admit it hold a copy "
        "of the public file in their allowed-keys directory. Existing files are never "
        "replaced unless --force is given.",
        f"  {PROG} keygen /etc/peermesh/node.key\n"
        f"  {PROG} keygen alice.key --name alice --json\n"
        f"  cp alice.key /etc/peermesh/allowed/     # on every node that admits alice",
        cmd_keygen, node_options=False)
    keygen.add_argument("path", metavar="PATH",
                        help="public certificate to write; the secret one is PATH_secret")
    keygen.add_argument("--name", help="a name stored in the certificates' metadata")
    keygen.add_argument("--force", action="store_true",
                        help="replace existing files (the old key is lost)")
    keygen.add_argument("--json", action="store_true",
                        help="print a JSON object: public key and both paths")


def cmd_keygen(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Generate and write a keypair; print its public key."""
    from ..io.keys import KeyFileError, generate, write_keypair

    keypair = generate()
    metadata = {"name": args.name} if args.name else {}
    try:
        public, secret = write_keypair(args.path, keypair, metadata, overwrite=args.force)
    except (KeyFileError, ValueError) as exc:
        note(f"error: {exc}")
        return EXIT_FAILURE
    if args.json:
        emit(json.dumps({"public_key": keypair.public.decode(), "public": public,
                         "secret": secret}))
    else:
        emit(keypair.public.decode())
        note(f"wrote {public} (public) and {secret} (secret, mode 0600)")
    return EXIT_OK
