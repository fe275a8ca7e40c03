"""The ``peermesh`` command: run a node, list peers, shout and whisper from the shell.

Nodes take the common options (interface, beacon port and interval, name,
headers, groups, ``--config``). ``run`` prints events until Ctrl-C or
SIGTERM. ``agent`` runs a long-lived node with a local control socket (see
``peermesh.agent.server``). ``peers``, ``shout``, ``whisper`` and ``events`` go
through the agent when one answers at the agent path, and otherwise start a
short-lived node of their own, wait a bounded time for the mesh, act and
leave; ``join``, ``leave`` and ``status`` need the agent.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import time

from ..errors import AmbiguousPeerError, InterfaceError, PeermeshError, UnknownPeerError
from .output import (EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, PROG, clean, emit,
                     note, stdout_utf8, table, to_json)
from .session import NodeSession, install_handlers

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing at run time
if TYPE_CHECKING:
    import argparse
    import logging
    from typing import Any, Callable, Optional, Sequence

    from ..config import NodeConfig
    from ..events import Event
    from ..zre.node import Node

# A command that goes through the agent loads only msgpack and
# ``peermesh.agent.client``: argparse (when the command line is plain, see
# ``_plain_agent_args``), pyzmq, gevent, the node, the config machinery,
# logging and the overlays' commands are imported where they are needed.

__all__ = ["main", "build_parser", "build_config"]

#: modules whose ``add_commands(command)`` adds overlay subcommands; ``command``
#: is build_parser's factory: command(name, summary, description, examples,
#: handler) -> argparse parser, with handler(args, config) -> exit code
COMMAND_MODULES: tuple[str, ...] = (
    "peermesh.sim.commands",
    "peermesh.nfp.commands",
    "peermesh.sada.commands",
    "peermesh.flux.commands",
    "peermesh.mtl.commands",
    "peermesh.cli.keygen",
)
#: a peer's liveness, as ``peers --status`` filters it
PEER_STATES = ("alive", "evasive", "silent")
#: default --wait (seconds) of the commands that try the agent first
WAIT_PEERS, WAIT_SEND = 2.0, 3.0
#: in a help text: the NodeConfig default of the option's field, filled in when help is shown
_NODE_DEFAULT = "{node default}"

_EXIT_CODES = """\
exit codes:
  0    success
  1    runtime failure: a port in use, delivery not confirmed, no agent
       running (join, leave, status), an agent already running at the path
       (agent), the agent stopped or was lost (events)
  2    usage error (bad option, unknown interface, bad config or key file), or
       the peer or group was not found in time
  130  interrupted (Ctrl-C or SIGTERM) before the command completed"""


@functools.cache
def _formatter() -> type[argparse.HelpFormatter]:
    """The help formatter class (made on first use: argparse loads ``re``, ``enum`` and
    ``gettext``, which a command going through the agent does without)."""
    import argparse

    class Formatter(argparse.HelpFormatter):
        """Wraps one-line paragraphs, keeps multi-line ones (examples, exit codes) as written."""

        def __init__(self, prog: str) -> None:
            super().__init__(prog, max_help_position=30, width=_columns() - 2)

        def _expand_help(self, action: argparse.Action) -> str:
            text = super()._expand_help(action)
            if _NODE_DEFAULT in text:
                from ..config import NodeConfig

                text = text.replace(_NODE_DEFAULT, f"{getattr(NodeConfig(), action.dest):g}")
            return text

        def _fill_text(self, text: str, width: int, indent: str) -> str:
            import textwrap

            return "\n\n".join(
                "\n".join(indent + line for line in para.splitlines()) if "\n" in para
                else textwrap.fill(para, width, initial_indent=indent, subsequent_indent=indent)
                for para in text.split("\n\n"))

    return Formatter


@functools.cache
def _columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size`` finds it, without loading shutil
    (argparse makes a formatter for every option it adds, and shutil loads bz2 and lzma)."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            stdout = sys.__stdout__
            columns = os.get_terminal_size(stdout.fileno()).columns if stdout else 0
        except (ValueError, OSError):
            columns = 0
    return columns or 80


# --------------------------------------------------------------------------
# Arguments and configuration


def _header_arg(value: str) -> tuple[str, str]:
    import argparse

    from ..argtypes import utf8
    from ..config import parse_header

    try:
        return parse_header(utf8(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _discovery_arg(value: str) -> tuple[str, ...]:
    import argparse

    from ..config import parse_discovery

    try:
        return parse_discovery(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: ``command(node_options=...)`` of the node options without short forms (and, for
#: the second, without ``--interval``)
_LONG_ONLY = ("long", "long, own --interval")


@functools.cache
def _node_options(timers_only: bool = False, long_only: bool = False,
                  interval: bool = True) -> argparse.ArgumentParser:
    """The node options; ``timers_only``: just the beacon timers (a simulated network);
    ``long_only``: without their short forms (commands whose own short options mean
    what another tool's do, as ``flux ping -c/-i/-p``); ``interval`` False: without
    ``--interval`` (a command whose own ``--interval`` means something else)."""
    import argparse

    from ..argtypes import seconds, text

    def short(flag: str) -> tuple[str, ...]:
        return () if long_only else (flag,)

    common = argparse.ArgumentParser(add_help=False, formatter_class=_formatter())
    node = common.add_argument_group("node options")
    if not timers_only:
        node.add_argument(
            "--interface", *short("-i"), metavar="IFACE", type=text,
            help="network interface: a name (eth0, lo), one of its IPv4 addresses or a CIDR "
                 "(10.0.0.0/24); 'lo' keeps the mesh on this host (default: "
                 "$PEERMESH_INTERFACE, then the first up non-loopback IPv4 interface)")
        node.add_argument("--port", *short("-p"), type=int, metavar="PORT",
                          help=f"UDP beacon port (default: {_NODE_DEFAULT})")
    if interval:
        node.add_argument("--interval", type=seconds, metavar="SECONDS",
                          help=f"seconds between beacons (default: {_NODE_DEFAULT})")
    node.add_argument("--evasive", type=seconds, metavar="SECONDS",
                      help="silence after which a peer is PINGed and reported EVASIVE "
                           f"(default: {_NODE_DEFAULT})")
    node.add_argument("--expired", type=seconds, metavar="SECONDS",
                      help="silence after which a peer is removed with EXIT "
                           f"(default: {_NODE_DEFAULT})")
    if timers_only:
        _add_verbose(node)
        return common
    node.add_argument("--name", *short("-n"), type=text,
                      help="public name of this node (default: first 6 hex digits of its UUID)")
    node.add_argument("--header", *short("-H"), dest="headers", action="append",
                      type=_header_arg,
                      default=[], metavar="K=V",
                      help="HELLO header sent to peers; repeatable")
    node.add_argument("--group", *short("-g"), dest="groups", action="append", default=[],
                      type=text,
                      metavar="GROUP", help="group to join at start; repeatable")
    node.add_argument("--contest", dest="contest", action="append", default=[], type=text,
                      metavar="GROUP",
                      help="stand for leader of GROUP (Zyre's election; LEADER events name the "
                           "winner); repeatable")
    node.add_argument("--seed", dest="seeds", action="append", default=[], type=text,
                      metavar="HOST[:PORT]",
                      help="a node to reach by unicast beacons (PORT: its beacon port, default "
                           "--port), for networks without broadcast; peers found through it "
                           "share what they know; repeatable (also $PEERMESH_SEEDS, "
                           "comma-separated)")
    node.add_argument("--discovery", type=_discovery_arg, metavar="SOURCES",
                      help="how peers are found, comma-separated: beacon (UDP broadcast), mdns "
                           "(DNS-SD through zeroconf, for networks that pass multicast but not "
                           "broadcast), or none (seeds only: nothing is broadcast) "
                           "(default: $PEERMESH_DISCOVERY, then beacon)")
    node.add_argument("--mdns", action="store_true",
                      help="also find peers by mDNS (the same as adding mdns to --discovery)")
    node.add_argument("--key-file", metavar="FILE",
                      help="secret CURVE certificate (from `keygen`): encrypt and authenticate "
                           "everything; meets only nodes with keys (default: $PEERMESH_KEY_FILE, "
                           "then none)")
    node.add_argument("--allowed-keys", metavar="DIR",
                      help="directory of the public certificates of the nodes admitted; "
                           "re-read when it changes or on SIGHUP (default: "
                           "$PEERMESH_ALLOWED_KEYS, then any node with a key)")
    node.add_argument("--metrics", metavar="HOST:PORT", type=text,
                      help="commands that serve (run, agent, serve, worker, broker run, flux "
                           "run, mtl gateway): export Prometheus metrics at "
                           "http://HOST:PORT/metrics; PORT alone listens on 127.0.0.1 "
                           "(default: $PEERMESH_METRICS, then none)")
    node.add_argument("--metrics-public", action="store_true", default=None,
                      help="allow --metrics on an address other than loopback")
    node.add_argument("--config", *short("-c"), metavar="FILE",
                      help="TOML file with a [node] table (and [nfp] for the NFP commands); "
                           f"`{PROG} config example` prints one to start from. $PEERMESH_* "
                           "variables and these options override it")
    _add_verbose(node)
    return common


@functools.cache
def _verbose_option() -> argparse.ArgumentParser:
    import argparse

    verbose = argparse.ArgumentParser(add_help=False, formatter_class=_formatter())
    _add_verbose(verbose)
    return verbose


def _add_verbose(group: Any) -> None:
    group.add_argument("--verbose", "-v", action="count", default=0,
                       help="log to stderr: -v info (peers entering and leaving, limits hit, "
                            "elections), -vv debug")
    group.add_argument("--log-format", choices=("text", "json"), default=None,
                       help="log lines as text, or as JSON objects with time, level, logger, "
                            "message, node and peer fields (default: $PEERMESH_LOG_FORMAT, "
                            "then text)")


@functools.cache
def _agent_options(fallback: bool) -> argparse.ArgumentParser:
    import argparse

    options = argparse.ArgumentParser(add_help=False, formatter_class=_formatter())
    group = options.add_argument_group("agent options")
    group.add_argument(
        "--agent", metavar="PATH",
        help="the agent's control socket (default: $PEERMESH_AGENT, then "
             "$XDG_RUNTIME_DIR/peermesh/agent.sock, then /tmp/peermesh-$UID/agent.sock)")
    if fallback:
        group.add_argument(
            "--no-agent", action="store_true",
            help="do not use a running agent: start a short-lived node of its own. Without "
                 "this, the command goes through the agent when one answers at the path, "
                 "unless --interface or --port name another mesh than the agent's")
    return options


_AGENT_NOTE = ("When an agent (`peermesh agent`) answers at the agent path, the command goes "
               "through it and answers at once: the agent's node sends, and --name, --header "
               "and --group are not used. Otherwise it starts a short-lived node of its own.")

if TYPE_CHECKING:
    #: build_parser's factory: command(name, summary, description, examples, handler, *,
    #: parents=(), node_options=True, agent_first=False) -> the subcommand's parser
    CommandFactory = Callable[..., argparse.ArgumentParser]


def _add_run(command: CommandFactory) -> None:
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


def _add_agent(command: CommandFactory) -> None:
    from ..argtypes import positive_count

    agent = command(
        "agent", "run a long-lived node that other commands use",
        "Start a node with the node options (name, headers and groups are fixed at start; "
        "join and leave change groups later) and serve a local control socket, so that "
        "peers, shout, whisper, join, leave, events and status answer at once through it. "
        "Prints the node's mailbox and the socket path on stderr, then runs until Ctrl-C "
        "or SIGTERM, which leave the mesh cleanly and remove the socket. A socket file "
        "left by a dead agent is replaced; if another agent answers at the path, this one "
        "refuses to start (exit 1).",
        f"  {PROG} agent --name alice --group chat --header role=sensor\n"
        f"  {PROG} agent --config /etc/peermesh/peermesh.toml --agent /run/peermesh/agent.sock\n"
        f"  {PROG} agent --interface lo --port 5999 --print-events --json",
        cmd_agent, parents=[_agent_options(False)])
    agent.add_argument("--max-connections", type=positive_count, metavar="N",
                       help="local clients served at once; more get `busy` and are closed "
                            "(default 128; at most half the descriptors still free at start, "
                            "after 128 kept for the node)")
    agent.add_argument("--print-events", action="store_true",
                       help="also print every event on stdout, as `run` does")
    agent.add_argument("--json", action="store_true",
                       help="print events as JSON lines (implies --print-events)")
    from .agenthooks import add_options as add_hook_options  # --handler, --web

    add_hook_options(agent)


def _add_peers(command: CommandFactory) -> None:
    from ..argtypes import seconds

    peers = command(
        "peers", "list the peers (the agent's, or found within a few seconds)",
        "List the peers: UUID, name, address, liveness (STATE alive, evasive or silent; "
        "HEARD: seconds since anything came from it; RTT: round trip from PING to PING-OK), "
        "groups (a * after a group marks its elected leader), roles, whether it is the "
        "elected broker, headers. Through the agent: the "
        "peers it knows, at once. Without: start a short-lived node, collect peers for "
        "--wait seconds, print them and leave.\n\n" + _AGENT_NOTE,
        f"  {PROG} peers\n  {PROG} peers --status evasive --status silent\n"
        f"  {PROG} peers --interface lo --wait 1 --json",
        cmd_peers, parents=[_agent_options(True)], agent_first=True)
    peers.add_argument("--wait", "-w", type=seconds, default=WAIT_PEERS, metavar="SECONDS",
                       help="how long to collect peers without an agent (default: %(default)s)")
    peers.add_argument("--status", action="append", choices=PEER_STATES, metavar="STATE",
                       help="only peers in STATE (alive, evasive, silent); repeatable")
    peers.add_argument("--json", action="store_true",
                       help="print one JSON list of {peer, name, address, headers, groups, "
                            "state, last_heard, rtt, roles, broker, leads} (seconds)")


def _add_shout(command: CommandFactory) -> None:
    from ..argtypes import seconds, text

    shout = command(
        "shout", "send a message to every peer in a group",
        "Send MESSAGE to every member of GROUP and wait for their confirmation. Through "
        "the agent: at once to the members it knows (waiting up to --wait only when there "
        "are none yet). Without: start a short-lived node, wait until the group's members "
        "have been found (no new member for about one beacon interval, at most --wait "
        "seconds), send and leave.\n\n" + _AGENT_NOTE,
        f'  {PROG} shout chat "hello everyone"\n'
        f'  {PROG} shout --interface lo --wait 5 alerts "disk full"',
        cmd_shout, parents=[_agent_options(True)], agent_first=True)
    shout.add_argument("target", metavar="GROUP", type=text, help="the group to shout to")
    shout.add_argument("message", metavar="MESSAGE", help="the message (sent as UTF-8)")
    shout.add_argument("--wait", "-w", type=seconds, default=WAIT_SEND, metavar="SECONDS",
                       help="longest wait for the group's members (default: %(default)s)")


def _add_whisper(command: CommandFactory) -> None:
    from ..argtypes import seconds, text

    whisper = command(
        "whisper", "send a message to one peer",
        "Send MESSAGE to the one peer matching PEER (a name, a UUID, or a unique UUID hex "
        "prefix) and wait for its confirmation. Without an agent, a short-lived node uses "
        "a full UUID as soon as that peer is found, a name or prefix once every peer had "
        "time to be found (about one beacon interval), so that an ambiguous PEER is "
        "refused rather than sent to whichever peer answered first. Through the agent this "
        "is at once (waiting up to --wait for a peer it does not know yet).\n\n"
        + _AGENT_NOTE,
        f'  {PROG} whisper alice "hi"\n  {PROG} whisper 3f2a9c "hi"   # UUID prefix',
        cmd_whisper, parents=[_agent_options(True)], agent_first=True)
    whisper.add_argument("target", metavar="PEER", type=text,
                         help="peer name, UUID or UUID hex prefix")
    whisper.add_argument("message", metavar="MESSAGE", help="the message (sent as UTF-8)")
    whisper.add_argument("--wait", "-w", type=seconds, default=WAIT_SEND, metavar="SECONDS",
                         help="longest wait for the peer (default: %(default)s)")


def _add_group_op(command: CommandFactory, name: str) -> None:
    from ..argtypes import text

    p = command(
        name, f"make the agent {name} a group",
        f"Make the agent's node {name} GROUP (every peer sees "
        f"{'JOIN' if name == 'join' else 'LEAVE'}). Needs a running agent: without one, "
        "fails with exit code 1. Doing it twice is not an error.",
        f"  {PROG} {name} news\n  {PROG} {name} --agent /run/peermesh/agent.sock news",
        cmd_join if name == "join" else cmd_leave, parents=[_agent_options(False)],
        node_options=False, agent_first=True)
    p.add_argument("group", metavar="GROUP", type=text, help=f"the group to {name}")


def _add_events(command: CommandFactory) -> None:
    events = command(
        "events", "follow the events of the agent's node",
        "Print every event of the agent's node as it comes (the format of `run`), until "
        "Ctrl-C or SIGTERM (exit 0), or until the agent stops or cannot be reached (exit "
        "1). Without an agent, start a node of its own and print its events like `run`.",
        f"  {PROG} events\n  {PROG} events --json | jq 'select(.event == \"SHOUT\")'",
        cmd_events, parents=[_agent_options(True)], agent_first=True)
    events.add_argument("--json", action="store_true",
                        help="one JSON object per line, as `run --json`")


def _add_status(command: CommandFactory) -> None:
    status = command(
        "status", "show the running agent",
        "Show the agent answering at the agent path: pid, node name and UUID, mailbox, "
        "interface and beacon port, groups, headers and number of peers. Exit code 0 "
        "when an agent answers, 1 when none does.",
        f"  {PROG} status\n  {PROG} status --json",
        cmd_status, parents=[_agent_options(False)], node_options=False, agent_first=True)
    status.add_argument("--json", action="store_true", help="print one JSON object")


#: what each table of a configuration file (``config.TABLES``) holds
_TABLES = {"node": "the node options", "nfp": "the NFP commands' options",
           "mtl": "the options of mtl gateway"}


def _add_config(command: CommandFactory) -> None:
    tables = ", ".join(f"[{name}] ({what})" for name, what in _TABLES.items())
    command("config", "configuration files",
            f"A configuration file is TOML with up to three tables: {tables}; any other "
            "table, or a key outside a table, is an error.",
            f"  {PROG} config example > peermesh.toml", None)
    command("config example", "print an example configuration file (every key, documented)",
            "Print a configuration file that lists every key of [node] with its default "
            "(but interface = \"lo\") and every key of [mtl] and [nfp], commented out.",
            f"  {PROG} config example > /etc/peermesh/peermesh.toml", cmd_config_example,
            node_options=False)


def cmd_config_example(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Print the example configuration shipped with the package."""
    from importlib.resources import files

    sys.stdout.write(files(__package__).joinpath("peermesh.example.toml").read_text("utf-8"))
    sys.stdout.flush()
    return EXIT_OK


#: the commands defined here, in help order; parsing one of them builds only its own
#: parser and skips importing COMMAND_MODULES, which keeps the round trip through the
#: agent short
_BUILTIN: dict[str, Callable[[CommandFactory], None]] = {
    "run": _add_run, "agent": _add_agent, "peers": _add_peers, "shout": _add_shout,
    "whisper": _add_whisper, "join": functools.partial(_add_group_op, name="join"),
    "leave": functools.partial(_add_group_op, name="leave"), "events": _add_events,
    "status": _add_status, "config": _add_config,
}


def build_parser(command_modules: bool = True,
                 only: Optional[str] = None) -> argparse.ArgumentParser:
    """The argument parser of the ``peermesh`` command.

    ``command_modules``: with the overlays' commands; ``only``: with just that
    one of the built-in commands (all of them when None).
    """
    import argparse

    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=_formatter(),
        description="Brokerless peer meshes on the LAN (ZRE v2, talks to Zyre and pyre).",
        epilog=f"""\
examples:
  {PROG} run --name alice --group chat          print events as they come
  {PROG} run --interface lo --json              a mesh on this host, JSON lines
  {PROG} peers --wait 3                         who is out there?
  {PROG} shout chat "hello everyone"
  {PROG} whisper alice "hi"
  {PROG} agent --name alice --group chat &      a long-lived node; commands use it
  {PROG} join news && {PROG} events --json      through the agent, at once

Run '{PROG} COMMAND --help' for the options of a command.

{_EXIT_CODES}""")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    groups: dict[str, Any] = {}  # "job", "mtl user" -> the subparsers of its actions

    def command(name: str, summary: str, description: str, examples: str,
                handler: Optional[Callable[[argparse.Namespace, Optional[NodeConfig]], int]], *,
                parents: Sequence[argparse.ArgumentParser] = (),
                node_options: bool | str = True, agent_first: bool = False
                ) -> argparse.ArgumentParser:
        """Add command ``name``; "job post" adds action ``post`` to the group ``job``,
        made before by ``command("job", ..., handler=None)``.

        ``agent_first``: the handler gets no config and builds one when it needs it.
        """
        *group, leaf = name.split()
        where = groups[" ".join(group)] if group else sub
        epilog = f"examples:\n{examples}\n\n{_EXIT_CODES}"
        if handler is None:
            p = where.add_parser(leaf, help=summary, formatter_class=_formatter(),
                                 description=description, epilog=epilog)
            p.set_defaults(usage_parser=p)
            groups[name] = p.add_subparsers(dest="action", metavar="ACTION", title="actions",
                                            required=True)
            return p
        options = _node_options(node_options == "timers", node_options in _LONG_ONLY,
                                node_options != "long, own --interval") if node_options \
            else _verbose_option()
        p = where.add_parser(leaf, parents=[options, *parents], help=summary,
                             formatter_class=_formatter(), description=description,
                             epilog=epilog)
        p.set_defaults(handler=handler, node_options=node_options, agent_first=agent_first,
                       usage_parser=p)
        return p

    for name, add in _BUILTIN.items():
        if only is None or only == name:
            add(command)
    for module in COMMAND_MODULES if command_modules else ():
        importlib.import_module(module).add_commands(command)
    return parser


def _version() -> str:
    from .. import __version__
    return __version__


def build_config(args: argparse.Namespace) -> NodeConfig:
    """NodeConfig from --config, then $PEERMESH_*, then the command-line options.

    --group and --header add to the groups and headers from the file and
    environment. When only --evasive or --expired is given, the silent timeout
    is kept between them. A bad file, variable or option is a ValueError.
    """
    from ..config import NodeConfig

    try:
        base = NodeConfig.load(getattr(args, "config", None))
    except TypeError as exc:  # a TOML value of the wrong type
        raise ValueError(f"invalid configuration: {exc}") from None
    overrides: dict[str, Any] = {
        key: getattr(args, key, None)
        for key in ("name", "interface", "port", "interval", "evasive", "expired", "key_file",
                    "allowed_keys", "metrics", "metrics_public")}
    if getattr(args, "node_options", True) == "timers":  # a simulated network
        return base.replace(**overrides)
    if args.groups:
        overrides["groups"] = tuple(dict.fromkeys([*base.groups, *args.groups]))
    if getattr(args, "contest", None):
        overrides["contest"] = tuple(dict.fromkeys([*base.contest, *args.contest]))
    if args.seeds:
        overrides["seeds"] = tuple(dict.fromkeys([*base.seeds, *args.seeds]))
    discovery = args.discovery if args.discovery is not None else base.discovery
    if args.mdns:
        discovery = tuple(dict.fromkeys([*discovery, "mdns"]))
    overrides["discovery"] = discovery
    if args.headers:
        overrides["headers"] = {**base.headers, **dict(args.headers)}
    evasive = args.evasive or base.evasive
    expired = args.expired or base.expired
    if args.evasive or args.expired:
        overrides["silent"] = min(max(base.silent, evasive), expired)
    return base.replace(**overrides)


# --------------------------------------------------------------------------
# Output


def _content(event: Event) -> str:
    parts = []
    for frame in event.frames:
        try:
            parts.append(clean(frame.decode("utf-8")))
        except UnicodeDecodeError:
            parts.append("0x" + frame.hex())
    if len(parts) == 1:
        return parts[0]
    return f"({len(parts)} frames) " + " | ".join(parts)


def format_event(event: Event) -> str:
    """One human-readable line: time, event, peer name and short UUID, then details."""
    from datetime import datetime

    from ..events import EventType

    fields = [datetime.now().strftime("%H:%M:%S.%f")[:-3], f"{event.type.value:<7}"]
    if event.peer is not None:
        fields.append(f"{clean(event.name)} ({event.peer.hex[:8]})")
    if event.group is not None:
        fields.append(f"[{clean(event.group)}]")
    kind = event.type
    if kind in (EventType.SHOUT, EventType.WHISPER):
        fields.append(_content(event))
    if kind is EventType.ENTER:
        if event.address:
            fields.append(event.address)
        if event.headers:
            fields.append(" ".join(f"{clean(k)}={clean(v)}" for k, v in event.headers.items()))
    if event.reason:
        fields.append(f"({clean(event.reason)})")
    return " ".join(fields).rstrip()


# --------------------------------------------------------------------------
# Subcommands


def _renderer(args: argparse.Namespace) -> Callable[[Event], str]:
    from ..events import Event

    if args.json:
        return Event.to_json if stdout_utf8() else lambda e: to_json(e.to_dict())
    return format_event


def _start_line(node: Node) -> str:
    groups = ", ".join(clean(g) for g in node.groups()) or "none"
    return f"{clean(node.name)} ({node.uuid.hex}) at {node.endpoint}, groups: {groups}"


def _print_events(session: NodeSession, render: Optional[Callable[[Event], str]],
                  publish: Optional[Callable[[Event], None]] = None) -> int:
    """Hand every event to ``publish`` and print it with ``render`` until the node stops."""
    try:
        for event in session.node.events():
            if publish is not None:
                publish(event)
            if render is not None:
                try:
                    emit(render(event))
                except (BrokenPipeError, ValueError):
                    if publish is None:
                        raise
                    render = None  # the agent goes on serving without its stdout
    finally:
        session.close()
    return EXIT_OK


def cmd_run(args: argparse.Namespace, config: NodeConfig) -> int:
    """Print every event until SIGINT/SIGTERM stops the node."""
    session = NodeSession(config, serving=True)
    node = session.start()
    note(f"{_start_line(node)}; Ctrl-C to leave")
    return _print_events(session, _renderer(args))


def cmd_agent(args: argparse.Namespace, config: NodeConfig) -> int:
    """Run the node and its control socket until SIGINT/SIGTERM."""
    from ..agent import server as agent_module
    from .agenthooks import AgentHooks  # --handler, --web

    AgentHooks.check(args)
    path = agent_module.resolve_path(args.agent)
    claim = agent_module.claim_path(path)
    try:
        if claim.removed_stale:
            note(f"removed the socket file of a dead agent at {path}")
        session = NodeSession(config, serving=True)
        node = session.start()
        try:
            server = agent_module.AgentServer(
                node, claim,
                max_connections=args.max_connections or agent_module.MAX_CONNECTIONS).start()
        except BaseException:
            session.close()
            raise
        try:
            hooks = AgentHooks.start(args, node)
        except BaseException:
            server.close()
            session.close()
            raise
        server.reports["hooks"] = hooks.stats
        try:
            note(f"{_start_line(node)}; agent at {path} (pid {os.getpid()}); "
                 "Ctrl-C to leave")
            render = _renderer(args) if args.print_events or args.json else None

            def publish(event: Event) -> None:
                server.publish(event)
                hooks.publish(event)
            return _print_events(session, render, publish)
        finally:
            hooks.close()
            server.close()
    finally:
        claim.release()


# --- going through the agent


def _agent_client(args: argparse.Namespace, required: bool = False) -> tuple[Any, str]:
    """(a connected AgentClient, "") or (None, why not).

    With ``required`` a missing agent is a RuntimeError (exit code 1).
    """
    from ..agent.client import AgentClient, AgentMismatch, NoAgent, resolve_path

    if getattr(args, "no_agent", False):
        _setup_logging(args)  # for the node of its own
        return None, "--no-agent"
    path = resolve_path(args.agent)
    probe, args.agent_probe = getattr(args, "agent_probe", None), None
    try:
        if isinstance(probe, NoAgent):
            raise probe
        client = probe or AgentClient.connect(path)
    except AgentMismatch as exc:  # a node of its own would hide that the agent is stale
        raise RuntimeError(str(exc)) from None
    except NoAgent as exc:
        none = str(exc).startswith("no agent running")
        if required:
            raise RuntimeError(f"{exc}; start one with `{PROG} agent`" if none
                               else str(exc)) from None
        if not none:  # an agent may be there, but cannot be used: say so
            note(f"{exc}; using a node of its own")
        _setup_logging(args)
        _log().info("%s; using a node of its own", exc)
        return None, str(exc)
    if not required:
        mismatch = _mesh_mismatch(args, client.info)
        if mismatch:
            client.close()
            why = f"not using the agent at {path}: {mismatch}"
            _setup_logging(args)
            _log().info("%s", why)
            return None, why
    return client, ""


def _mesh_mismatch(args: argparse.Namespace, info: dict[str, Any]) -> str:
    """Why --interface or --port given on the command line name another mesh than the agent's."""
    if args.port is not None and args.port != info.get("port"):
        return f"it beacons on port {info.get('port')}, not {args.port}"
    theirs = info.get("interface") or {}
    if args.interface is not None and args.interface not in (theirs.get("name"),
                                                             theirs.get("address")):
        from ..net.interfaces import select_interface

        wanted = select_interface(args.interface)
        if wanted.address != theirs.get("address"):
            return (f"it is on {theirs.get('name')} ({theirs.get('address')}), "
                    f"not {wanted.name} ({wanted.address})")
    return ""


def _agent_call(client: Any, op: str, arguments: dict[str, Any], timeout: float = 10.0) -> Any:
    """``client.call`` with agent errors mapped onto exit codes (2: not found, 1: the rest)."""
    from ..agent.client import AgentError

    try:
        return client.call(op, arguments, timeout=timeout)
    except AgentError as exc:
        if exc.code in ("not-found", "ambiguous"):
            raise _NotFound(exc.message) from None
        if exc.code == "bad-args":
            raise ValueError(exc.message) from None
        raise RuntimeError(f"the agent at {client.path}: {exc.message}") from None


def _answer(result: Any, *keys: str) -> dict[str, Any]:
    if not isinstance(result, dict) or not all(k in result for k in keys):
        raise RuntimeError(f"unexpected answer from the agent: {result!r:.200}")
    return result


# --- subcommands that may go through the agent


def cmd_peers(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Print the agent's peers, or collect peers for --wait seconds and print them."""
    client, _ = _agent_client(args)
    if client is not None:
        with client:
            entries = _agent_call(client, "peers", {"wait": args.wait}, timeout=args.wait + 10)
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise RuntimeError(f"unexpected answer from the agent: {entries!r:.200}")
        empty = f"the agent at {client.path} knows no peers"
    else:
        entries = _collect_peers(args, build_config(args))
        empty = f"no peers found within {args.wait:g} s"
    wanted = getattr(args, "status", None)
    if wanted:
        entries = [e for e in entries if e.get("state") in wanted]
        empty = f"no peers {' or '.join(wanted)}"
    if args.json:
        emit(to_json(entries))
    elif entries:
        emit(_peer_table(entries))
    if not entries:
        note(empty)
    return EXIT_OK


def _collect_peers(args: argparse.Namespace, config: NodeConfig) -> list[dict[str, Any]]:
    from ..overlay.election import peer_entries

    session = NodeSession(config)
    node = session.start()
    try:
        itf = node.interface
        if itf is not None:  # a node of its own: say where it looks, so a wrong LAN shows
            note(f"no agent: looking for peers on {clean(itf.name)} ({itf.address}, beacon "
                 f"port {config.port}) for {args.wait:g} s")
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline:
            event = session.wait_event(deadline)
            if _is_stop(event):
                break
        return peer_entries(node, sorted(node.peer_infos(),
                                         key=lambda info: (info.name, info.uuid.hex)))
    finally:
        session.close()


def _peer_table(entries: Sequence[dict[str, Any]]) -> str:
    """The peers as a table; a ``*`` after a group: the peer is its elected leader."""
    rows = [("UUID", "NAME", "ADDRESS", "STATE", "HEARD", "RTT", "GROUPS", "ROLES", "BROKER",
             "HEADERS")]
    for entry in entries:
        leads = set(entry.get("leads") or ())
        rows.append((clean(entry["peer"]), clean(entry["name"]), clean(entry["address"]),
                     clean(entry.get("state", "?")), _seconds(entry.get("last_heard")),
                     _seconds(entry.get("rtt")),
                     ",".join(clean(g) + ("*" if g in leads else "")
                              for g in entry["groups"]) or "-",
                     ",".join(clean(r) for r in entry.get("roles") or ()) or "-",
                     "yes" if entry.get("broker") else "-",
                     " ".join(f"{clean(k)}={clean(v)}" for k, v in entry["headers"].items()
                              if k not in _SHOWN_HEADERS) or "-"))
    return table(rows)


#: headers the table shows in a column of their own
_SHOWN_HEADERS = frozenset({"X-PM-ROLES"})


def _seconds(value: Any) -> str:
    """``0.42s``, ``3.1ms``, ``12s`` for a number of seconds; ``-`` for None."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    if value < 1:
        return f"{value * 1000:.3g}ms"
    return f"{value:.3g}s" if value < 100 else f"{value:.0f}s"


def cmd_shout(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Shout MESSAGE to GROUP through the agent, or from a short-lived node."""
    group = args.target
    client, _ = _agent_client(args)
    if client is not None:
        with client:
            request = {"group": group, "message": os.fsencode(args.message), "wait": args.wait}
            result = _answer(_agent_call(client, "shout", request, timeout=args.wait + 10),
                             "peers")
        count, confirmed = int(result["peers"]), bool(result.get("confirmed"))
    else:
        count, confirmed = _shout_alone(args, build_config(args))
    note(f"shouted to {count} peer{'s' if count != 1 else ''} in group {group!r}")
    if not confirmed:
        raise RuntimeError("not every peer confirmed receipt within 1 s")
    return EXIT_OK


def _shout_alone(args: argparse.Namespace, config: NodeConfig) -> tuple[int, bool]:
    """Wait for GROUP's members to settle, shout MESSAGE to them, flush and leave.

    (members, confirmed).
    """
    group = args.target
    session = NodeSession(config)
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
            if _is_stop(event):
                break
        members = set(node.peers_by_group(group))
        if not members:
            raise _NotFound(f"no peer in group {group!r} appeared within {args.wait:g} s")
        node.shout(group, os.fsencode(args.message))
        confirmed = node.flush()
    finally:
        session.close()
    return len(members), confirmed


def cmd_whisper(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Whisper MESSAGE to PEER through the agent, or from a short-lived node."""
    client, _ = _agent_client(args)
    if client is not None:
        with client:
            request = {"peer": args.target, "message": os.fsencode(args.message),
                       "wait": args.wait}
            result = _answer(_agent_call(client, "whisper", request, timeout=args.wait + 10),
                             "peer", "name")
        name, uuid_hex, confirmed = str(result["name"]), str(result["peer"]), \
            bool(result.get("confirmed"))
    else:
        name, uuid_hex, confirmed = _whisper_alone(args, build_config(args))
    note(f"whispered to {clean(name)} ({clean(uuid_hex)})")
    if not confirmed:
        raise RuntimeError(f"{clean(name)} did not confirm receipt within 1 s")
    return EXIT_OK


def _whisper_alone(args: argparse.Namespace,
                   config: NodeConfig) -> tuple[str, str, bool]:
    """Wait for exactly one peer matching PEER, whisper MESSAGE, flush and leave.

    A full UUID is used as soon as that peer is known. A name or prefix is
    only trusted once every peer on the LAN had time to be found (about one
    beacon interval after start), so that a second match is not missed.
    (name, UUID hex, confirmed).
    """
    target = args.target
    session = NodeSession(config)
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
            if _is_stop(event):
                raise RuntimeError("the node stopped")
        name = node.peer_name(uuid)
        node.whisper(uuid, os.fsencode(args.message))
        confirmed = node.flush()
    finally:
        session.close()
    return name, uuid.hex, confirmed


# --- subcommands of the agent


def cmd_join(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Make the agent's node join GROUP."""
    return _group_op(args, "join")


def cmd_leave(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Make the agent's node leave GROUP."""
    return _group_op(args, "leave")


def _group_op(args: argparse.Namespace, op: str) -> int:
    client, _ = _agent_client(args, required=True)
    with client:
        result = _answer(_agent_call(client, op, {"group": args.group}), "changed", "groups")
    group = args.group
    name = clean(client.info.get("name"))
    if op == "join":
        done = f"joined group {group!r}" if result["changed"] else f"already in group {group!r}"
    else:
        done = f"left group {group!r}" if result["changed"] else f"not in group {group!r}"
    groups = ", ".join(clean(g) for g in result["groups"]) or "none"
    note(f"{name} {done}; groups: {groups}")
    return EXIT_OK


def cmd_status(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Show the agent answering at the path."""
    client, _ = _agent_client(args, required=True)
    with client:
        info = client.info
    if args.json:
        emit(to_json(info))
        return EXIT_OK
    itf = info.get("interface") or {}
    headers = info.get("headers") or {}
    rows = [
        ("agent", f"{client.path} (pid {info.get('pid')}, peermesh {info.get('version')}, "
                  f"up {_duration(info.get('uptime'))})"),
        ("node", f"{clean(info.get('name'))} ({info.get('uuid')}) at {info.get('endpoint')}"),
        ("interface", f"{clean(itf.get('name'))} {itf.get('address')}, beacon port "
                      f"{info.get('port')}"),
        ("groups", ", ".join(clean(g) for g in info.get("groups") or ()) or "none"),
        ("headers", " ".join(f"{clean(k)}={clean(v)}" for k, v in headers.items()) or "none"),
        ("peers", str(info.get("peers"))),
        ("subscribers", str(info.get("subscribers"))),
        ("limits", _limits_hit(info.get("stats"))),
    ]
    from .agenthooks import status_rows  # --handler, --web

    rows += status_rows(info)
    emit("\n".join(f"{key:<12} {value}" for key, value in rows))
    return EXIT_OK


def _limits_hit(stats: Any) -> str:
    """The node's limit counters that are not zero (``Node.stats``), or "none"."""
    if not isinstance(stats, dict):
        return "?"
    counted = [f"{clean(str(k))}={v}" for k, v in sorted(stats.items())
               if k.endswith(("_refused", "_shed", "_timed_out", "_ignored", "_dropped", "_full"))
               and v]
    return " ".join(counted) or "none"


def _duration(seconds: Any) -> str:
    try:
        total = int(float(seconds))
    except (TypeError, ValueError):
        return "?"
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def cmd_events(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Follow the agent's events; without an agent, print a node's own like ``run``.

    Like every command that may go through the agent, it gets no ``config`` and
    builds one only when it starts a node.
    """
    client, why = _agent_client(args)
    if client is None:
        if not args.no_agent:
            note(f"{why}; following the events of a node of its own")
        return cmd_run(args, build_config(args))
    render = _renderer(args)
    try:
        client.subscribe()
        info = client.info
        note(f"following events of {clean(info.get('name'))} ({info.get('uuid')}) through "
             f"the agent at {client.path}; Ctrl-C to stop")
        for message in client.stream():
            if "dropped" in message:
                note(f"warning: {message['dropped']} events dropped: they came faster "
                     "than this command read them")
                continue
            event = _event_from(message.get("event"))
            if event is not None:
                emit(render(event))
    except KeyboardInterrupt:  # SIGINT/SIGTERM: the normal end of following
        return EXIT_OK
    finally:
        client.close()
    return EXIT_OK  # not reached: the stream ends with AgentGone


def _event_from(data: Any) -> Optional[Event]:
    """An Event from the agent's stream form, or None if it does not parse."""
    from uuid import UUID

    from ..events import Event, EventType

    if not isinstance(data, dict):
        return None
    try:
        peer = data.get("peer")
        frames = data.get("frames") or ()
        headers = data.get("headers")
        if not all(isinstance(f, bytes) for f in frames) or (
                headers is not None and not isinstance(headers, dict)):
            return None
        return Event(EventType(data["type"]), UUID(hex=peer) if peer else None,
                     data.get("name"), data.get("group"), tuple(frames), headers,
                     data.get("address"), data.get("reason"))
    except (KeyError, ValueError, TypeError, AttributeError):
        return None


def _is_stop(event: Optional[Event]) -> bool:
    from ..events import EventType

    return event is not None and event.type is EventType.STOP


def _settle_time(config: NodeConfig) -> float:
    """Time in which every peer on the LAN has beaconed at least once (one interval, plus)."""
    return config.interval * 1.25 + 0.05


def _is_full_uuid(text: str) -> bool:
    from uuid import UUID

    try:
        UUID(text)
        return True
    except ValueError:
        return False


class _NotFound(Exception):
    """The peer or group never appeared: exit code 2."""


# --------------------------------------------------------------------------
# Entry point


def _log() -> logging.Logger:
    import logging

    return logging.getLogger("peermesh.cli.commands")


def _setup_logging(args: Any) -> None:
    """Log to stderr at WARNING, or INFO (-v) or DEBUG (-vv), as text or JSON lines
    (--log-format, $PEERMESH_LOG_FORMAT); once per process (``peermesh.logs``)."""
    from ..logs import setup

    fmt = getattr(args, "log_format", None) or os.environ.get("PEERMESH_LOG_FORMAT") or "text"
    setup(args.verbose, "json" if fmt == "json" else "text")
    if fmt == "json":
        from . import output
        from ..logs import json_note

        output.note_sink = json_note


def _failures() -> tuple[type[BaseException], ...]:
    """Runtime failures (exit code 1); pyzmq's only when something has loaded it."""
    zmq = sys.modules.get("zmq")
    return (RuntimeError, OSError, PeermeshError) + ((zmq.ZMQError,) if zmq else ())


def _usage_errors() -> tuple[type[BaseException], ...]:
    """Usage errors (exit code 2): bad values, unknown names, a key file that cannot be
    used (``KeyFileError``, only when something has loaded it)."""
    keys = sys.modules.get("peermesh.io.keys")
    return (_NotFound, InterfaceError, ValueError) + ((keys.KeyFileError,) if keys else ())


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``peermesh`` command; returns the exit code."""
    install_handlers()
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        return _interrupted(None)


def _main(argv: list[str]) -> int:
    plain = _plain_agent_args(argv)
    probe = None
    if plain is not None:
        probe = _probe_agent(plain.agent)
        if probe is not None and not isinstance(probe, BaseException):
            plain.agent_probe = probe
            return _execute(plain)
    first = next((a for a in argv if not a.startswith("-")), None)
    builtin = first in _BUILTIN
    parser = build_parser(command_modules=not builtin, only=first if builtin else None)
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


#: commands whose plain form (positionals, --agent PATH and these flags) skips argparse
_PLAIN: dict[str, tuple[tuple[str, ...], frozenset[str], float]] = {
    "peers": ((), frozenset({"--json"}), WAIT_PEERS),
    "shout": (("target", "message"), frozenset(), WAIT_SEND),
    "whisper": (("target", "message"), frozenset(), WAIT_SEND),
}


def _plain_agent_args(argv: Sequence[str]) -> Optional[Any]:
    """The arguments of ``peers``, ``shout`` or ``whisper`` in their plain form, or None.

    Plain: the command first, its positionals, ``--agent PATH`` and ``--json``
    (peers) and nothing else that starts with "-". The result has every
    attribute the command reads when it goes through the agent, with
    argparse's defaults; anything else (and a plain command that finds no
    agent) goes through argparse, so both read a command line the same way.
    """
    from types import SimpleNamespace

    if not argv or argv[0] not in _PLAIN:
        return None
    names, flags, wait = _PLAIN[argv[0]]
    positionals: list[str] = []
    found: dict[str, Any] = {"agent": None, **{flag[2:]: False for flag in flags}}
    tokens = iter(argv[1:])
    for token in tokens:
        if token in flags:
            found[token[2:]] = True
        elif token == "--agent":
            found["agent"] = next(tokens, None)
            if found["agent"] is None:
                return None
        elif token.startswith("--agent="):
            found["agent"] = token[len("--agent="):]
        elif token.startswith("-"):
            return None
        else:
            positionals.append(token)
    if len(positionals) != len(names) or found["agent"] == "" \
            or not all(p.strip() and p.isprintable() for p in positionals[:1]):
        return None  # argparse says what is wrong with it
    return SimpleNamespace(
        command=argv[0], handler=_HANDLERS[argv[0]], agent_first=True, node_options=True,
        verbose=0, wait=wait, no_agent=False, interface=None, port=None,
        **dict(zip(names, positionals)), **found)


def _probe_agent(path: Optional[str]) -> Any:
    """A connected ``AgentClient``, the ``NoAgent`` saying why not, or None (a bad path:
    argparse's path reports it)."""
    from ..agent.client import AgentClient, NoAgent, resolve_path

    try:
        return AgentClient.connect(resolve_path(path))
    except NoAgent as exc:
        return exc
    except ValueError:
        return None


def _execute(args: argparse.Namespace) -> int:
    """Run the command ``args`` chose, mapping failures onto exit codes."""
    config: Optional[NodeConfig] = None
    agent_first = getattr(args, "agent_first", False)
    if args.verbose or not agent_first or getattr(args, "log_format", None):
        # (else when it starts a node of its own)
        _setup_logging(args)
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
        _log().debug("details", exc_info=exc)
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


#: the commands ``_plain_agent_args`` reads
_HANDLERS = {"peers": cmd_peers, "shout": cmd_shout, "whisper": cmd_whisper}

if __name__ == "__main__":
    sys.exit(main())
