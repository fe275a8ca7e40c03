"""The options that node commands share, and what they set up: the node's configuration
and logging.

``node_options_parser`` (interface, beacon port and timers, name, headers,
groups, seeds, discovery, keys, metrics, ``--config``) and ``agent_options``
(``--agent``, ``--no-agent``) are parent parsers that ``build_parser``
(``peermesh.cli.parser``) hands to each command; ``build_config`` turns what
they parsed into a ``NodeConfig``. argparse, the config machinery and logging
are loaded only when called, so a command that goes through the agent does
without them.
"""

from __future__ import annotations

import functools
import os
import sys

from .output import EXIT_OK, PROG

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing at run time
if TYPE_CHECKING:
    import argparse
    import logging
    from typing import Any, Optional

    from ..config import NodeConfig

__all__ = ["help_formatter", "node_options_parser", "verbose_option", "agent_options",
           "build_config", "setup_logging", "command_log", "cmd_config_example",
           "NODE_DEFAULT", "LONG_ONLY"]

#: in a help text: the NodeConfig default of the option's field, filled in when help is shown
NODE_DEFAULT = "{node default}"


@functools.cache
def help_formatter() -> type[argparse.HelpFormatter]:
    """The help formatter class (made on first use: argparse loads ``re``, ``enum`` and
    ``gettext``, which a command going through the agent does without)."""
    import argparse

    class Formatter(argparse.HelpFormatter):
        """Wraps one-line paragraphs, keeps multi-line ones (examples, exit codes) as written."""

        def __init__(self, prog: str) -> None:
            super().__init__(prog, max_help_position=30, width=_columns() - 2)

        def _expand_help(self, action: argparse.Action) -> str:
            text = super()._expand_help(action)
            if NODE_DEFAULT in text:
                from ..config import NodeConfig

                text = text.replace(NODE_DEFAULT, f"{getattr(NodeConfig(), action.dest):g}")
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
LONG_ONLY = ("long", "long, own --interval")


@functools.cache
def node_options_parser(timers_only: bool = False, long_only: bool = False,
                        interval: bool = True) -> argparse.ArgumentParser:
    """The node options; ``timers_only``: just the beacon timers (a simulated network);
    ``long_only``: without their short forms (commands whose own short options mean
    what another tool's do, as ``flux ping -c/-i/-p``); ``interval`` False: without
    ``--interval`` (a command whose own ``--interval`` means something else)."""
    import argparse

    from ..argtypes import seconds, text

    def short(flag: str) -> tuple[str, ...]:
        return () if long_only else (flag,)

    common = argparse.ArgumentParser(add_help=False, formatter_class=help_formatter())
    node = common.add_argument_group("node options")
    if not timers_only:
        node.add_argument(
            "--interface", *short("-i"), metavar="IFACE", type=text,
            help="network interface: a name (eth0, lo), one of its IPv4 addresses or a CIDR "
                 "(10.0.0.0/24); 'lo' keeps the mesh on this host (default: "
                 "$PEERMESH_INTERFACE, then the first up non-loopback IPv4 interface)")
        node.add_argument("--port", *short("-p"), type=int, metavar="PORT",
                          help=f"UDP beacon port (default: {NODE_DEFAULT})")
    if interval:
        node.add_argument("--interval", type=seconds, metavar="SECONDS",
                          help=f"seconds between beacons (default: {NODE_DEFAULT})")
    node.add_argument("--evasive", type=seconds, metavar="SECONDS",
                      help="silence after which a peer is PINGed and reported EVASIVE "
                           f"(default: {NODE_DEFAULT})")
    node.add_argument("--expired", type=seconds, metavar="SECONDS",
                      help="silence after which a peer is removed with EXIT "
                           f"(default: {NODE_DEFAULT})")
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
def verbose_option() -> argparse.ArgumentParser:
    import argparse

    verbose = argparse.ArgumentParser(add_help=False, formatter_class=help_formatter())
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
def agent_options(fallback: bool) -> argparse.ArgumentParser:
    import argparse

    options = argparse.ArgumentParser(add_help=False, formatter_class=help_formatter())
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


def command_log() -> logging.Logger:
    """The logger of the command line (logging is loaded on first use)."""
    import logging

    return logging.getLogger("peermesh.cli.commands")


def setup_logging(args: Any) -> None:
    """Log to stderr at WARNING, or INFO (-v) or DEBUG (-vv), as text or JSON lines
    (--log-format, $PEERMESH_LOG_FORMAT); once per process (``peermesh.logs``)."""
    from ..logs import setup

    fmt = getattr(args, "log_format", None) or os.environ.get("PEERMESH_LOG_FORMAT") or "text"
    setup(args.verbose, "json" if fmt == "json" else "text")
    if fmt == "json":
        from . import output
        from ..logs import json_note

        output.note_sink = json_note


def cmd_config_example(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Print the example configuration shipped with the package."""
    from importlib.resources import files

    sys.stdout.write(files(__package__).joinpath("peermesh.example.toml").read_text("utf-8"))
    sys.stdout.flush()
    return EXIT_OK
