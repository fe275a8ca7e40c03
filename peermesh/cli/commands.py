"""The ``peermesh`` command: run a node, list peers, shout and whisper from the shell.

Nodes take the common options (interface, beacon port and interval, name,
headers, groups, ``--config``). ``run`` prints events until Ctrl-C or
SIGTERM. ``agent`` runs a long-lived node with a local control socket (see
``peermesh.agent.server``). ``peers``, ``shout``, ``whisper`` and ``events`` go
through the agent when one answers at the agent path, and otherwise start a
short-lived node of their own, wait a bounded time for the mesh, act and
leave; ``join``, ``leave`` and ``status`` need the agent.

This module is the entry point (``main``): it reads the command line (the fast
path, ``peermesh.cli.fastpath``, else the parser, ``peermesh.cli.parser``),
runs the command and maps failures onto exit codes. The options are in
``peermesh.cli.options``, the commands in ``serving``, ``meshcommands`` and
``agentcommands``.
"""

from __future__ import annotations

import os
import sys

from ..errors import InterfaceError, PeermeshError
from .fastpath import plain_agent_args, probe_agent
from .options import build_config, command_log, setup_logging
from .output import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, NotFound, note
from .session import install_handlers

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing at run time
if TYPE_CHECKING:
    import argparse
    from typing import Any, Optional, Sequence

    from ..config import NodeConfig

__all__ = ["main", "build_parser", "build_config"]


def __getattr__(name: str) -> Any:
    """``build_parser`` and ``COMMAND_MODULES`` (``peermesh.cli.parser``) and ``cmd_agent``
    (``peermesh.cli.serving``), for the programs that use them from here; loaded when
    asked for, as the fast path does without them."""
    if name in ("build_parser", "COMMAND_MODULES"):
        from . import parser

        return getattr(parser, name)
    if name == "cmd_agent":
        from .serving import cmd_agent

        return cmd_agent
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _failures() -> tuple[type[BaseException], ...]:
    """Runtime failures (exit code 1); pyzmq's only when something has loaded it."""
    zmq = sys.modules.get("zmq")
    return (RuntimeError, OSError, PeermeshError) + ((zmq.ZMQError,) if zmq else ())


def _usage_errors() -> tuple[type[BaseException], ...]:
    """Usage errors (exit code 2): bad values, unknown names, a key file that cannot be
    used (``KeyFileError``, only when something has loaded it)."""
    keys = sys.modules.get("peermesh.io.keys")
    return (NotFound, InterfaceError, ValueError) + ((keys.KeyFileError,) if keys else ())


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``peermesh`` command; returns the exit code."""
    install_handlers()
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        return _interrupted(None)


def _main(argv: list[str]) -> int:
    plain = plain_agent_args(argv)
    probe = None
    if plain is not None:
        probe = probe_agent(plain.agent)
        if probe is not None and not isinstance(probe, BaseException):
            plain.agent_probe = probe
            return _execute(plain)
    from .parser import BUILTIN, COMMANDS_OF, build_parser

    first = next((a for a in argv if not a.startswith("-")), None)
    known = first in BUILTIN or first in COMMANDS_OF
    parser = build_parser(command_modules=first not in BUILTIN, only=first if known else None)
    args, extra = parser.parse_known_args(argv)
    if extra:  # the command's own usage line, not the top-level one
        getattr(args, "usage_parser", parser).error(
            f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if probe is not None:
        args.agent_probe = probe  # why the agent could not be used: not asked twice
    return _execute(args)


def _execute(args: argparse.Namespace) -> int:
    """Run the command ``args`` chose, mapping failures onto exit codes."""
    config: Optional[NodeConfig] = None
    agent_first = getattr(args, "agent_first", False)
    if args.verbose or not agent_first or getattr(args, "log_format", None):
        # (else when it starts a node of its own)
        setup_logging(args)
    try:
        sys.stdout.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        pass
    try:
        if not agent_first:
            if getattr(args, "node_options", True):
                config = build_config(args)
            else:
                from ..config import NodeConfig

                config = NodeConfig()
    except ValueError as exc:
        return _fail(exc, EXIT_USAGE, args.verbose)
    try:
        return int(args.handler(args, config))
    except _usage_errors() as exc:
        in_use = getattr(exc, "in_use", False)  # a port someone else holds: runtime
        return _fail(exc, EXIT_FAILURE if in_use else EXIT_USAGE, args.verbose)
    except KeyboardInterrupt as exc:
        return _interrupted(exc)
    except Exception as exc:
        if not isinstance(exc, _failures()):
            raise
        if isinstance(exc, BrokenPipeError):
            return _broken_pipe()
        return _fail(exc, EXIT_FAILURE, args.verbose)


def _interrupted(exc: Optional[BaseException]) -> int:
    """Say that a signal stopped the command, and what it left undone."""
    left = getattr(exc, "left", "")
    note(f"interrupted{': ' + left if left else ''}")
    return EXIT_INTERRUPTED


def _fail(exc: BaseException | str, code: int, verbosity: int) -> int:
    if verbosity >= 2 and isinstance(exc, BaseException):
        command_log().debug("details", exc_info=exc)
    note(f"error: {exc}")
    return code


def _broken_pipe() -> int:
    """stdout was closed (e.g. piped into ``head``): leave quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
