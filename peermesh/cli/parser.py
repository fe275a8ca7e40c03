"""The parser of the ``peermesh`` command: its built-in commands and their options.

``build_parser`` makes one argparse parser: the built-in commands here
(``run``, ``agent``, ``peers``, ``shout``, ``whisper``, ``join``, ``leave``,
``events``, ``status``, ``config``) and those that the overlays' modules in
``COMMAND_MODULES`` add through its ``command`` factory. The options that
node commands share are in ``peermesh.cli.options``; the handlers in
``peermesh.cli.serving``, ``peermesh.cli.meshcommands`` and
``peermesh.cli.agentcommands``.
"""

from __future__ import annotations

import functools
import importlib

from .agentcommands import cmd_events, cmd_join, cmd_leave, cmd_status
from .meshcommands import WAIT_PEERS, WAIT_SEND, cmd_peers, cmd_shout, cmd_whisper
from .options import (LONG_ONLY, agent_options, cmd_config_example, help_formatter,
                      node_options_parser, verbose_option)
from .output import PROG
from .serving import cmd_agent, cmd_run

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing at run time
if TYPE_CHECKING:
    import argparse
    from typing import Any, Callable, Optional, Sequence

    from ..config import NodeConfig

__all__ = ["build_parser", "BUILTIN", "COMMAND_MODULES", "COMMANDS_OF", "PEER_STATES"]

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
#: the top-level commands each of ``COMMAND_MODULES`` adds: running one loads its module
#: alone (each loads its overlay, a few tenths of a second), the full help all of them
COMMANDS_OF: dict[str, str] = {
    "simulate": "peermesh.sim.commands",
    **dict.fromkeys(("broker", "file", "job", "worker"), "peermesh.nfp.commands"),
    **dict.fromkeys(("call", "serve", "services"), "peermesh.sada.commands"),
    "flux": "peermesh.flux.commands",
    "mtl": "peermesh.mtl.commands",
    "keygen": "peermesh.cli.keygen",
}
#: a peer's liveness, as ``peers --status`` filters it
PEER_STATES = ("alive", "evasive", "silent")

_EXIT_CODES = """\
exit codes:
  0    success
  1    runtime failure: a port in use, delivery not confirmed, no agent
       running (join, leave, status), an agent already running at the path
       (agent), the agent stopped or was lost (events)
  2    usage error (bad option, unknown interface, bad config or key file), or
       the peer or group was not found in time
  130  interrupted (Ctrl-C or SIGTERM) before the command completed"""


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
        cmd_agent, parents=[agent_options(False)])
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
        cmd_peers, parents=[agent_options(True)], agent_first=True)
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
        cmd_shout, parents=[agent_options(True)], agent_first=True)
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
        cmd_whisper, parents=[agent_options(True)], agent_first=True)
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
        cmd_join if name == "join" else cmd_leave, parents=[agent_options(False)],
        node_options=False, agent_first=True)
    p.add_argument("group", metavar="GROUP", type=text, help=f"the group to {name}")


def _add_events(command: CommandFactory) -> None:
    events = command(
        "events", "follow the events of the agent's node",
        "Print every event of the agent's node as it comes (the format of `run`), until "
        "Ctrl-C or SIGTERM (exit 0), or until the agent stops or cannot be reached (exit "
        "1). Without an agent, start a node of its own and print its events like `run`.",
        f"  {PROG} events\n  {PROG} events --json | jq 'select(.event == \"SHOUT\")'",
        cmd_events, parents=[agent_options(True)], agent_first=True)
    events.add_argument("--json", action="store_true",
                        help="one JSON object per line, as `run --json`")


def _add_status(command: CommandFactory) -> None:
    status = command(
        "status", "show the running agent",
        "Show the agent answering at the agent path: pid, node name and UUID, mailbox, "
        "interface and beacon port, groups, headers and number of peers. Exit code 0 "
        "when an agent answers, 1 when none does.",
        f"  {PROG} status\n  {PROG} status --json",
        cmd_status, parents=[agent_options(False)], node_options=False, agent_first=True)
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


#: the commands defined here, in help order; parsing one of them builds only its own
#: parser and skips importing COMMAND_MODULES, which keeps the round trip through the
#: agent short
BUILTIN: dict[str, Callable[[CommandFactory], None]] = {
    "run": _add_run, "agent": _add_agent, "peers": _add_peers, "shout": _add_shout,
    "whisper": _add_whisper, "join": functools.partial(_add_group_op, name="join"),
    "leave": functools.partial(_add_group_op, name="leave"), "events": _add_events,
    "status": _add_status, "config": _add_config,
}


def build_parser(command_modules: bool = True,
                 only: Optional[str] = None) -> argparse.ArgumentParser:
    """The argument parser of the ``peermesh`` command.

    ``command_modules``: with the overlays' commands; ``only``: with just that
    command, built in or an overlay's (``COMMANDS_OF``: only its module is loaded;
    all of them when None).
    """
    import argparse

    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=help_formatter(),
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
            p = where.add_parser(leaf, help=summary, formatter_class=help_formatter(),
                                 description=description, epilog=epilog)
            p.set_defaults(usage_parser=p)
            groups[name] = p.add_subparsers(dest="action", metavar="ACTION", title="actions",
                                            required=True)
            return p
        options = node_options_parser(node_options == "timers", node_options in LONG_ONLY,
                                      node_options != "long, own --interval") \
            if node_options else verbose_option()
        p = where.add_parser(leaf, parents=[options, *parents], help=summary,
                             formatter_class=help_formatter(), description=description,
                             epilog=epilog)
        p.set_defaults(handler=handler, node_options=node_options, agent_first=agent_first,
                       usage_parser=p)
        return p

    for name, add in BUILTIN.items():
        if only is None or only == name:
            add(command)
    modules = (COMMAND_MODULES if only is None
               else tuple(m for m in COMMAND_MODULES if COMMANDS_OF.get(only) == m))
    for module in modules if command_modules else ():
        importlib.import_module(module).add_commands(command)
    return parser


def _version() -> str:
    from .. import __version__
    return __version__
