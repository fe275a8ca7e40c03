"""The ``peermesh`` command: run a node, list peers, shout and whisper from the shell.

Every subcommand starts its own node with the common options (interface,
beacon port and interval, name, headers, groups, ``--config``). ``run``
prints events until Ctrl-C or SIGTERM; ``peers``, ``shout`` and ``whisper``
start a short-lived node, wait a bounded time for the mesh, act and leave.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import textwrap
import time
from datetime import datetime
from typing import Any, Callable, Optional, Sequence
from uuid import UUID

import gevent
import zmq

from .config import NodeConfig, parse_header
from .errors import (AmbiguousPeerError, InterfaceError, PeermeshError, PeerNotResponding,
                     UnknownPeerError)
from .events import Event, EventType
from .node import Node, PeerInfo

__all__ = ["main", "build_parser", "build_config"]

log = logging.getLogger("peermesh.cli")

PROG = "peermesh"
#: modules whose ``add_commands(command)`` adds overlay subcommands; ``command``
#: is build_parser's factory: command(name, summary, description, examples,
#: handler) -> argparse parser, with handler(args, config) -> exit code
COMMAND_MODULES: tuple[str, ...] = ("peermesh.sim.commands",)
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
_DEFAULTS = NodeConfig()

_EXIT_CODES = """\
exit codes:
  0    success
  1    runtime failure (cannot bind a port, delivery not confirmed, ...)
  2    usage error (bad option, unknown interface, bad config), or the peer or
       group was not found in time
  130  interrupted (Ctrl-C or SIGTERM) before the command completed"""


class _Formatter(argparse.HelpFormatter):
    """Wraps one-line paragraphs, keeps multi-line ones (examples, exit codes) as written."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n\n".join(
            "\n".join(indent + line for line in para.splitlines()) if "\n" in para
            else textwrap.fill(para, width, initial_indent=indent, subsequent_indent=indent)
            for para in text.split("\n\n"))


# --------------------------------------------------------------------------
# Arguments and configuration


def _header_arg(text: str) -> tuple[str, str]:
    try:
        return parse_header(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    node = common.add_argument_group("node options")
    node.add_argument(
        "--interface", "-i", metavar="IFACE",
        help="network interface: a name (eth0, lo), one of its IPv4 addresses or a CIDR "
             "(10.0.0.0/24); 'lo' keeps the mesh on this host "
             "(default: $PEERMESH_INTERFACE, then the first up non-loopback IPv4 interface)")
    node.add_argument("--port", "-p", type=int, metavar="PORT",
                      help=f"UDP beacon port (default: {_DEFAULTS.port})")
    node.add_argument("--interval", type=_seconds_arg, metavar="SECONDS",
                      help=f"seconds between beacons (default: {_DEFAULTS.interval:g})")
    node.add_argument("--evasive", type=_seconds_arg, metavar="SECONDS",
                      help="silence after which a peer is PINGed and reported EVASIVE "
                           f"(default: {_DEFAULTS.evasive:g})")
    node.add_argument("--expired", type=_seconds_arg, metavar="SECONDS",
                      help="silence after which a peer is removed with EXIT "
                           f"(default: {_DEFAULTS.expired:g})")
    node.add_argument("--name", "-n",
                      help="public name of this node (default: first 6 hex digits of its UUID)")
    node.add_argument("--header", "-H", dest="headers", action="append", type=_header_arg,
                      default=[], metavar="K=V",
                      help="HELLO header sent to peers; repeatable")
    node.add_argument("--group", "-g", dest="groups", action="append", default=[],
                      metavar="GROUP", help="group to join at start; repeatable")
    node.add_argument("--config", "-c", metavar="FILE",
                      help="TOML file with a [node] table (see deploy/peermesh.example.toml); "
                           "$PEERMESH_* variables and these options override it")
    node.add_argument("--verbose", "-v", action="count", default=0,
                      help="log to stderr: -v info, -vv debug")
    return common


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``peermesh`` command."""
    common = _common_options()
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=_Formatter,
        description="Brokerless peer meshes on the LAN (ZRE v2, talks to Zyre and pyre).",
        epilog=f"""\
examples:
  {PROG} run --name alice --group chat          print events as they come
  {PROG} run --interface lo --json              a mesh on this host, JSON lines
  {PROG} peers --wait 3                         who is out there?
  {PROG} shout chat "hello everyone"
  {PROG} whisper alice "hi"

Run '{PROG} COMMAND --help' for the options of a command.

{_EXIT_CODES}""")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    def command(name: str, summary: str, description: str, examples: str,
                handler: Callable[[argparse.Namespace, NodeConfig], int]
                ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=summary, formatter_class=_Formatter,
                           description=description,
                           epilog=f"examples:\n{examples}\n\n{_EXIT_CODES}")
        p.set_defaults(handler=handler)
        return p

    run = command(
        "run", "join the mesh and print events until stopped",
        "Start a node, join its groups and print every event (ENTER, EXIT, JOIN, LEAVE, "
        "WHISPER, SHOUT, EVASIVE, SILENT) as it comes. Ctrl-C or SIGTERM leaves cleanly: "
        "peers see EXIT at once.",
        f"  {PROG} run --name alice --group chat --header role=sensor\n"
        f"  {PROG} run --interface lo --port 5999 --json | jq .",
        cmd_run)
    run.add_argument("--json", action="store_true",
                     help="one JSON object per line: event, peer (UUID hex), name, group, "
                          "headers, address, frames, message, reason")

    peers = command(
        "peers", "list the peers found within a few seconds",
        "Start a short-lived node, collect peers for --wait seconds, print them "
        "(UUID, name, address, groups, headers) and leave.",
        f"  {PROG} peers\n  {PROG} peers --interface lo --wait 1 --json",
        cmd_peers)
    peers.add_argument("--wait", "-w", type=_seconds_arg, default=2.0, metavar="SECONDS",
                       help="how long to collect peers (default: %(default)s)")
    peers.add_argument("--json", action="store_true",
                       help="print one JSON list of {peer, name, address, headers, groups}")

    shout = command(
        "shout", "send a message to every peer in a group",
        "Start a short-lived node, wait until the group's members have been found (no new "
        "member for about one beacon interval, at most --wait seconds), send MESSAGE to "
        "each of them, wait for their confirmation and leave.",
        f'  {PROG} shout chat "hello everyone"\n'
        f'  {PROG} shout --interface lo --wait 5 alerts "disk full"',
        cmd_shout)
    shout.add_argument("target", metavar="GROUP", help="the group to shout to")
    shout.add_argument("message", metavar="MESSAGE", help="the message (sent as UTF-8)")
    shout.add_argument("--wait", "-w", type=_seconds_arg, default=3.0, metavar="SECONDS",
                       help="longest wait for the group's members (default: %(default)s)")

    whisper = command(
        "whisper", "send a message to one peer",
        "Start a short-lived node, wait until exactly one peer matches PEER (a name, a UUID, "
        "or a unique UUID hex prefix), send MESSAGE to it, wait for its confirmation and "
        "leave. A full UUID is used as soon as that peer is found; a name or prefix once "
        "every peer had time to be found (about one beacon interval), so that an ambiguous "
        "PEER is refused rather than sent to whichever peer answered first.",
        f'  {PROG} whisper alice "hi"\n  {PROG} whisper 3f2a9c "hi"   # UUID prefix',
        cmd_whisper)
    whisper.add_argument("target", metavar="PEER", help="peer name, UUID or UUID hex prefix")
    whisper.add_argument("message", metavar="MESSAGE", help="the message (sent as UTF-8)")
    whisper.add_argument("--wait", "-w", type=_seconds_arg, default=3.0, metavar="SECONDS",
                         help="longest wait for the peer (default: %(default)s)")
    for module in COMMAND_MODULES:
        importlib.import_module(module).add_commands(command)
    return parser


def _version() -> str:
    from . import __version__
    return __version__


def build_config(args: argparse.Namespace) -> NodeConfig:
    """NodeConfig from --config, then $PEERMESH_*, then the command-line options.

    --group and --header add to the groups and headers from the file and
    environment. When only --evasive or --expired is given, the silent timeout
    is kept between them.
    """
    base = NodeConfig.load(args.config)
    overrides: dict[str, Any] = {
        "name": args.name, "interface": args.interface, "port": args.port,
        "interval": args.interval, "evasive": args.evasive, "expired": args.expired,
    }
    if args.groups:
        overrides["groups"] = tuple(dict.fromkeys([*base.groups, *args.groups]))
    if args.headers:
        overrides["headers"] = {**base.headers, **dict(args.headers)}
    evasive = args.evasive or base.evasive
    expired = args.expired or base.expired
    if args.evasive or args.expired:
        overrides["silent"] = min(max(base.silent, evasive), expired)
    return base.replace(**overrides)


# --------------------------------------------------------------------------
# A node with clean shutdown on SIGINT / SIGTERM


class _Session:
    """A started Node whose stop runs once, from a signal or from the command."""

    def __init__(self, config: NodeConfig) -> None:
        try:
            self.node = Node(config=config)
        except TypeError as exc:  # e.g. a TOML group or header that is not a string
            raise ValueError(f"invalid configuration: {exc}") from None
        self.interrupted = False
        self._stopper: Optional[gevent.Greenlet] = None
        # Keep the handler objects alive for the life of the process; gevent
        # runs each call in its own greenlet, so stop() may block there.
        self._handlers = [gevent.signal_handler(sig, self._on_signal)
                          for sig in (signal.SIGINT, signal.SIGTERM)]

    def start(self) -> Node:
        cfg = self.node.config
        try:
            self.node.start()
        except OSError as exc:
            raise RuntimeError(f"cannot start the node (UDP beacon port {cfg.port}): "
                               f"{exc.strerror or exc}") from exc
        except zmq.ZMQError as exc:
            raise RuntimeError(f"cannot start the node (mailbox): {exc}") from exc
        node = self.node
        log.info("node %s (%s) at %s, beacons to %s:%d every %gs", node.name, node.uuid.hex,
                 node.endpoint, node.interface.broadcast if node.interface else "?", cfg.port,
                 cfg.interval)
        return node

    def _on_signal(self) -> None:
        self.interrupted = True
        self.stop()

    def stop(self) -> None:
        """Stop the node (port-0 beacon, flush); concurrent callers wait for the same stop."""
        if self._stopper is None:
            self._stopper = gevent.spawn(self.node.stop)
        self._stopper.join()

    def wait_event(self, deadline: float) -> Optional[Event]:
        """The next event before ``deadline`` (monotonic), or None; STOP when interrupted."""
        return self.node.recv(max(0.0, deadline - time.monotonic()))


# --------------------------------------------------------------------------
# Output


def _clean(text: Any) -> str:
    """``text`` with control characters escaped, so a peer cannot drive the terminal."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _content(event: Event) -> str:
    parts = []
    for frame in event.frames:
        try:
            parts.append(_clean(frame.decode("utf-8")))
        except UnicodeDecodeError:
            parts.append("0x" + frame.hex())
    if len(parts) == 1:
        return parts[0]
    return f"({len(parts)} frames) " + " | ".join(parts)


def format_event(event: Event) -> str:
    """One human-readable line: time, event, peer name and short UUID, then details."""
    fields = [datetime.now().strftime("%H:%M:%S.%f")[:-3], f"{event.type.value:<7}"]
    if event.peer is not None:
        fields.append(f"{_clean(event.name)} ({event.peer.hex[:8]})")
    if event.group is not None:
        fields.append(f"[{_clean(event.group)}]")
    kind = event.type
    if kind in (EventType.SHOUT, EventType.WHISPER):
        fields.append(_content(event))
    if kind is EventType.ENTER:
        if event.address:
            fields.append(event.address)
        if event.headers:
            fields.append(" ".join(f"{_clean(k)}={_clean(v)}" for k, v in event.headers.items()))
    if event.reason:
        fields.append(f"({_clean(event.reason)})")
    return " ".join(fields).rstrip()


def _stdout_utf8() -> bool:
    return (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "") == "utf8"


def _json(obj: Any) -> str:
    """One line of JSON; non-ASCII text as is when stdout is UTF-8, else \\u escapes."""
    return json.dumps(obj, ensure_ascii=not _stdout_utf8())


def _print(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _stderr(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Subcommands


def cmd_run(args: argparse.Namespace, config: NodeConfig) -> int:
    """Print every event until SIGINT/SIGTERM stops the node."""
    session = _Session(config)
    node = session.start()
    groups = ", ".join(_clean(g) for g in node.groups()) or "none"
    _stderr(f"{_clean(node.name)} ({node.uuid.hex}) at {node.endpoint}, groups: {groups}; "
            "Ctrl-C to leave")
    render: Callable[[Event], str] = format_event
    if args.json:
        render = Event.to_json if _stdout_utf8() else lambda e: _json(e.to_dict())
    try:
        for event in node.events():
            _print(render(event))
    finally:
        session.stop()
    return EXIT_OK


def cmd_peers(args: argparse.Namespace, config: NodeConfig) -> int:
    """Collect peers for --wait seconds and print them."""
    session = _Session(config)
    node = session.start()
    try:
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline:
            event = session.wait_event(deadline)
            if session.interrupted:
                return EXIT_INTERRUPTED
            if event is not None and event.type is EventType.STOP:
                break
        infos = sorted((node.peer_info(uuid) for uuid in node.peers()),
                       key=lambda info: (info.name, info.uuid.hex))
    finally:
        session.stop()
    if args.json:
        _print(_json([info.to_dict() for info in infos]))
    elif infos:
        _print(_table(infos))
    if not infos:
        _stderr(f"no peers found within {args.wait:g} s")
    return EXIT_OK


def _table(infos: Sequence[PeerInfo]) -> str:
    rows = [("UUID", "NAME", "ADDRESS", "GROUPS", "HEADERS")]
    for info in infos:
        rows.append((info.uuid.hex, _clean(info.name), info.address,
                     ",".join(_clean(g) for g in info.groups) or "-",
                     " ".join(f"{_clean(k)}={_clean(v)}" for k, v in info.headers.items())
                     or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(row, widths)), row[4]]).rstrip()
                     for row in rows)


def cmd_shout(args: argparse.Namespace, config: NodeConfig) -> int:
    """Wait for GROUP's members to settle, shout MESSAGE to them, flush and leave."""
    group = args.target
    session = _Session(config)
    node = session.start()
    settle = _settle_time(config)
    try:
        start = time.monotonic()
        deadline = start + args.wait
        seen: set[Any] = set()
        last_new = start
        while True:
            members = set(node.peers_by_group(group))
            now = time.monotonic()
            if members - seen:
                seen |= members
                last_new = now
            if seen and now - last_new >= settle or now >= deadline:
                break
            event = session.wait_event(min(deadline, last_new + settle) if seen else deadline)
            if session.interrupted:
                return EXIT_INTERRUPTED
            if event is not None and event.type is EventType.STOP:
                break
        members = set(node.peers_by_group(group))
        if not members:
            raise _NotFound(f"no peer in group {group!r} appeared within {args.wait:g} s")
        node.shout(group, os.fsencode(args.message))
        confirmed = node.flush()
    finally:
        session.stop()
    _stderr(f"shouted to {len(members)} peer{'s' if len(members) != 1 else ''} "
            f"in group {group!r}")
    if not confirmed:
        raise RuntimeError("not every peer confirmed receipt within 1 s")
    return EXIT_OK


def cmd_whisper(args: argparse.Namespace, config: NodeConfig) -> int:
    """Wait for exactly one peer matching PEER, whisper MESSAGE, flush and leave.

    A full UUID is used as soon as that peer is known. A name or prefix is
    only trusted once every peer on the LAN had time to be found (about one
    beacon interval after start), so that a second match is not missed.
    """
    target = args.target
    session = _Session(config)
    node = session.start()
    try:
        start = time.monotonic()
        deadline = start + args.wait
        sure = start + _settle_time(config)
        exact = _is_full_uuid(target)
        while True:
            now = time.monotonic()
            try:
                uuid = node.find_peer(target)
                if exact or now >= min(sure, deadline):
                    break
                wake = min(sure, deadline)
            except AmbiguousPeerError as exc:
                # more peers appearing cannot resolve an ambiguity: give up at once
                raise _NotFound(f"{exc}; give more of the UUID") from None
            except UnknownPeerError:
                if now >= deadline:
                    raise _NotFound(f"no peer matching {target!r} appeared "
                                    f"within {args.wait:g} s") from None
                wake = deadline
            event = session.wait_event(wake)
            if session.interrupted:
                return EXIT_INTERRUPTED
            if event is not None and event.type is EventType.STOP:
                raise RuntimeError("the node stopped")
        name = node.peer_name(uuid)
        node.whisper(uuid, os.fsencode(args.message))
        confirmed = node.flush()
    finally:
        session.stop()
    _stderr(f"whispered to {_clean(name)} ({uuid.hex})")
    if not confirmed:
        raise RuntimeError(f"{_clean(name)} did not confirm receipt within 1 s")
    return EXIT_OK


def _settle_time(config: NodeConfig) -> float:
    """Time in which every peer on the LAN has beaconed at least once (one interval, plus)."""
    return config.interval * 1.25 + 0.05


def _is_full_uuid(text: str) -> bool:
    try:
        UUID(text)
        return True
    except ValueError:
        return False


class _NotFound(Exception):
    """The peer or group never appeared: exit code 2."""


# --------------------------------------------------------------------------
# Entry point


def _setup_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``peermesh`` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    _setup_logging(args.verbose)
    try:
        sys.stdout.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        pass
    try:
        config = build_config(args)
    except ValueError as exc:
        return _fail(exc, EXIT_USAGE, args.verbose)
    except TypeError as exc:  # a TOML value of the wrong type
        return _fail(f"invalid configuration: {exc}", EXIT_USAGE, args.verbose)
    try:
        return int(args.handler(args, config))
    except (_NotFound, InterfaceError, ValueError) as exc:
        return _fail(exc, EXIT_USAGE, args.verbose)
    except (PeerNotResponding, UnknownPeerError, RuntimeError, OSError, zmq.ZMQError,
            PeermeshError) as exc:
        if isinstance(exc, BrokenPipeError):
            return _broken_pipe()
        return _fail(exc, EXIT_FAILURE, args.verbose)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _fail(exc: BaseException | str, code: int, verbosity: int) -> int:
    if verbosity >= 2 and isinstance(exc, BaseException):
        log.debug("details", exc_info=exc)
    _stderr(f"error: {exc}")
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
