"""``peermesh flux ...``: run a member of a Flux instance, and talk to one from the shell.

Registered through ``peermesh.cli.commands.COMMAND_MODULES``::

    peermesh flux run [--root | --parent ENDPOINT] [--rank N] [--topology kary:K] [--handlers M]
    peermesh flux rpc TOPIC [JSON] [--rank N] [--stream]
    peermesh flux pub TOPIC [JSON]
    peermesh flux sub PREFIX [--count N]
    peermesh flux ping RANK|all [--count N]
    peermesh flux tree

``run`` is a member until Ctrl-C or SIGTERM: rank 0 (``--root``), a node
that joins through members it is given (``--parent``, repeatable, or
``$PEERMESH_FLUX_PARENTS``), or by default a ZRE node whose members elect
rank 0 and join it by themselves (see ``peermesh.flux.overlay``).

The other commands are rankless clients (``peermesh.flux.client``) of one
member for as long as they run: the first that accepts of the members given
with ``--parent`` / ``$PEERMESH_FLUX_PARENTS``, otherwise of those found on
the mesh (a short-lived ZRE node on the node options' interface looks, for
up to ``--wait`` seconds, for peers advertising the instance, the elected
rank 0 first, and leaves the mesh once the client is connected). A client
takes no rank and grows nothing in the instance, so running them from a
script forever costs the instance nothing.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Union

from ..argtypes import cidr, count, positive_count, seconds, text, utf8
from ..cli.output import EXIT_FAILURE, EXIT_OK, PROG, clean, emit, note, table, to_json
from ..cli.session import HubSignals, NodeSession, leaving
from ..config import NodeConfig
from ..errors import PeermeshError, ProtocolError
from ..overlay.election import Candidate, elect
from ..wire.flux import NODEID_ANY, NODEID_UPSTREAM, Errno, read_json, read_string
from .errors import FluxError, FluxStateError
from .outputs import MAX_OFFLINE, Notice
from .topology import DEFAULT_TOPOLOGY, Topology, TopologyError, check_rank

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # the overlay (and gevent) are imported by the actions, not by the parser
    from ..zre.node import Node
    from .client import FluxClient
    from .overlay import FluxOverlay

__all__ = ["add_commands", "PARENTS_VARIABLE"]

Factory = Callable[..., argparse.ArgumentParser]

#: environment variable with the endpoints one-shot commands join through (comma-separated)
PARENTS_VARIABLE = "PEERMESH_FLUX_PARENTS"
URI_VARIABLE = "FLUX_URI"
#: seconds a flux-mode rank waits for its parent's answer to overlay.hello
HELLO_WAIT = 30.0
#: default --wait: seconds to find the instance and join it
WAIT_JOIN = 5.0
#: default --timeout: seconds for each answer
TIMEOUT = 5.0

_REACH = (
    "How it reaches the instance: it is a client of one member (it takes no rank): of the "
    "first of --parent (or $PEERMESH_FLUX_PARENTS) that accepts it; otherwise a short-lived "
    "ZRE node looks on the mesh (node options) for the members of --instance.")


def add_commands(command: Factory) -> None:
    """Add ``flux`` and its actions with build_parser's ``command`` factory."""
    command("flux", "Flux RFC 3 messaging: run a member, RPC, events, ping, tree",
            "A Flux instance is a tree of members (rank 0 at the root) that route topic "
            "RPCs (service.method) and events (numbered by rank 0) over their own sockets. "
            "`run` is a member; the other actions are clients of a member (no rank) for the "
            "duration of the command.",
            f"  {PROG} flux run --interface lo                 # a member found through the mesh\n"
            f"  {PROG} flux run --root --interface lo          # rank 0 without a mesh\n"
            f"  {PROG} flux tree --interface lo\n"
            f"  {PROG} flux rpc peermesh.info --rank 0 --parent tcp://127.0.0.1:40123",
            None)
    _add_run(command)
    _add_rpc(command)
    _add_pub(command)
    _add_sub(command)
    _add_ping(command)
    _add_tree(command)


def _instance_options(parser: argparse.ArgumentParser, *, member: bool = False) -> None:
    group = parser.add_argument_group("instance options")
    group.add_argument("--instance", default="flux", type=text, metavar="NAME",
                       help="which instance of the mesh (members advertise it in their HELLO "
                            "header X-PM-FLUX-TREE) (default: %(default)s)")
    group.add_argument("--parent", dest="parents", action="append", default=[], type=text,
                       metavar="ENDPOINT",
                       help="join through this member (tcp://HOST:PORT, as `flux run` prints "
                            "it) instead of finding the instance on the mesh; repeatable "
                            f"(default: ${PARENTS_VARIABLE}, comma-separated)")
    group.add_argument("--peer-network", action="append", metavar="CIDR", type=cidr,
                       help="take members' endpoints from the mesh only in this network "
                            "(default: the node's interface network); repeatable")
    group.add_argument("--server-key", dest="server_keys", action="append", default=[],
                       type=text, metavar="FILE",
                       help="with --parent, on an instance on keys: the public certificate "
                            "(peermesh keygen's PATH) of the member at that --parent, once per "
                            "--parent in the same order; " + (
                                "the member needs --key-file too" if member else
                                "the command connects as a CURVE client with --key-file's "
                                "keypair, or one of its own") + " (default: a plain link)")
    if member:
        return
    group.add_argument("--uri", type=text, metavar="URI",
                       help="connect through this URI, as flux's tools do: a flux-core broker's "
                            "local connector (local://PATH) or a member (tcp://HOST:PORT) "
                            f"(default: ${URI_VARIABLE} when neither --parent nor "
                            f"${PARENTS_VARIABLE} is given)")
    group.add_argument("--wait", "-w", type=seconds, default=WAIT_JOIN, metavar="SECONDS",
                       help="longest wait to find the instance and join it "
                            "(default: %(default)s)")
    group.add_argument("--timeout", "-t", type=seconds, default=TIMEOUT, metavar="SECONDS",
                       help="longest wait for each answer (default: %(default)s)")
    group.add_argument("--json", action="store_true", help="JSON output (see the description)")


def _add_run(command: Factory) -> None:
    run = command(
        "flux run", "be a member of an instance until stopped",
        "Start a member and print its endpoint, rank and what happens to it (children "
        "attached or lost, re-attachment) until Ctrl-C or SIGTERM, which leave the tree "
        "cleanly. Without --root or --parent the member joins the ZRE mesh (node options) "
        "and the members of --instance elect rank 0 among themselves (highest --priority, "
        "then UUID) and join it; a new root is elected if rank 0 leaves. With --root it is "
        "rank 0 without a mesh; with --parent it joins through the members named. Its tree "
        "sockets listen on --interface (without a mesh: 127.0.0.1 unless --interface or "
        "$PEERMESH_INTERFACE says otherwise). --handlers MODULE imports MODULE and calls "
        "its register(flux) with the FluxOverlay, to serve your own service.method topics.",
        f"  {PROG} flux run --interface lo --priority 1\n"
        f"  {PROG} flux run --root --topology kary:2\n"
        f"  {PROG} flux run --parent tcp://127.0.0.1:40123 --rank 7\n"
        f"  {PROG} flux run --root --handlers myapp.fluxservices --json",
        _cmd_run, node_options="long")
    _instance_options(run, member=True)
    group = run.add_argument_group("member options")
    group.add_argument("--root", action="store_true", help="be rank 0 (no mesh, no --parent)")
    group.add_argument("--rank", type=_rank_arg, metavar="N",
                       help="claim rank N (refused while another live member holds it)")
    group.add_argument("--topology", type=_topology_arg, default=DEFAULT_TOPOLOGY,
                       metavar="kary:K",
                       help="the tree: parent of rank i is (i-1)//K; kary:0 is flat; the same "
                            "on every member (default: %(default)s)")
    group.add_argument("--endpoint", type=text, metavar="ENDPOINT",
                       help="listen at ENDPOINT (tcp://HOST:PORT) instead of a random port, so "
                            "that a member restarted with it (rank 0 above all) comes back "
                            "where the others look for it")
    group.add_argument("--tree-port", type=_port_arg, metavar="PORT",
                       help="listen on PORT of the tree's address (--interface, else "
                            "127.0.0.1): --endpoint tcp://ADDRESS:PORT")
    group.add_argument("--priority", type=int, default=0, metavar="N",
                       help="mesh election of rank 0: higher wins (default: %(default)s)")
    group.add_argument("--handlers", action="append", default=[], type=text, metavar="MODULE",
                       help="import MODULE and call its register(flux); repeatable")
    group.add_argument("--json", action="store_true",
                       help="one JSON object per line: {\"event\": \"online\"|...,\"rank\", "
                            "\"detail\"}")
    group.add_argument("--flux-config", type=text, metavar="FILE",
                       help="be a rank of a flux-core instance booted from its "
                            "configuration FILE (its [bootstrap] and [tbon] tables): the rank, "
                            "parent, children and certificate of --flux-hostname there "
                            "(flux mode; no mesh, --root or --parent)")
    group.add_argument("--flux-hostname", type=text, metavar="NAME",
                       help="with --flux-config: the host name this rank has in FILE "
                            "(default: this host's name)")


def _add_rpc(command: Factory) -> None:
    rpc = command(
        "flux rpc", "send a request to a service and print the answer",
        "Send TOPIC (service.method) with JSON (an object; default none) to the first "
        "member up the tree that serves it, or to --rank N, and print the answer: a JSON "
        "object on one line, or a string. With --stream, print each answer of a streaming "
        "RPC until the stream ends (Ctrl-C cancels it). An error answer (ENOSYS: no such "
        "service; EHOSTUNREACH: the rank cannot be reached) is printed on stderr with "
        "exit code 1. --json prints {\"topic\", \"payload\"} (and {\"errnum\", \"error\", "
        "\"message\"} for an error) per answer.\n\n" + _REACH,
        f"  {PROG} flux rpc broker.ping '{{\"hi\": 1}}' --rank 3\n"
        f"  {PROG} flux rpc peermesh.info --rank 0\n"
        f"  {PROG} flux rpc kvs.watch '{{\"key\": \"a\"}}' --stream --json",
        _cmd_rpc, node_options="long")
    rpc.add_argument("topic", metavar="TOPIC", type=text, help="service.method")
    rpc.add_argument("payload", metavar="JSON", nargs="?", type=utf8,
                     help="the request's payload: a JSON object (default: no payload)")
    rpc.add_argument("--rank", "-r", type=_rank_arg, metavar="N",
                     help="send to rank N (default: any, the nearest member serving it)")
    rpc.add_argument("--stream", action="store_true", help="a streaming RPC: print every answer")
    _instance_options(rpc)


def _add_pub(command: Factory) -> None:
    pub = command(
        "flux pub", "publish an event",
        "Publish event TOPIC with JSON (an object; default none). Rank 0 numbers it and "
        "sends it down the tree to every subscriber. As flux-core's `flux event pub`, it "
        "prints nothing unless -s, which prints seq=N (--json: {\"seq\", \"topic\"}); it "
        "always waits for rank 0's answer, so an error is reported either way.\n\n"
        + _REACH,
        f"  {PROG} flux pub -s job.done '{{\"id\": 42}}'\n"
        f"  {PROG} flux pub heartbeat --json",
        _cmd_pub, node_options="long")
    pub.add_argument("topic", metavar="TOPIC", type=text, help="the event's topic")
    pub.add_argument("payload", metavar="JSON", nargs="?", type=utf8,
                     help="the event's payload: a JSON object (default: no payload)")
    pub.add_argument("-s", "--synchronous", action="store_true",
                     help="print the sequence rank 0 gave the event (seq=N)")
    _instance_options(pub)


def _add_sub(command: Factory) -> None:
    sub = command(
        "flux sub", "print events whose topic starts with PREFIX",
        "Subscribe to events whose topic starts with PREFIX ('' for all) and print each as "
        "flux-core's `flux event sub` does, TOPIC<tab>PAYLOAD (--json: {\"seq\", \"topic\", "
        "\"payload\"}) until Ctrl-C, SIGTERM "
        "or --count events. The member passes events on in order (it fetches what it "
        "missed from rank 0 itself). If the member is lost the command says so on stderr "
        "and carries on through another of the members (--parent, or those found on the "
        "mesh), subscribed again there, with the events it missed meanwhile fetched from "
        "rank 0. When none accepts it within --wait seconds it exits with 1.\n\n" + _REACH,
        f"  {PROG} flux sub job.\n  {PROG} flux sub '' --count 10 --json",
        _cmd_sub, node_options="long")
    sub.add_argument("prefix", metavar="PREFIX", type=utf8, help="topic prefix ('' for all)")
    sub.add_argument("-c", "--count", type=positive_count, metavar="N",
                     help="stop after N events (default: until stopped)")
    _instance_options(sub)


def _add_ping(command: Factory) -> None:
    ping = command(
        "flux ping", "round-trip time to a rank, or to every rank",
        "Send broker.ping (flux's body: seq, pad) to TARGET every --interval seconds, "
        "--count times (default: until Ctrl-C), and print each answer as flux-core's "
        "`flux ping` does: a header line, then RANK!TOPIC pad=N seq=N time=MS ms (ROUTE). "
        "TARGET as in flux: any (the nearest member), upstream (the member's parent), a "
        "rank N, N!SERVICE (SERVICE.ping on rank N) or SERVICE (on any rank); and 'all': "
        "every member in the tree (as `flux tree` finds it) and every rank rank 0 has "
        "lost, once each, the ranks that do not answer listed as unreachable. --summary "
        "adds a line: answered, unreachable, min/mean/max. Exit code 1 when a ping got "
        "no answer. Node options here have long forms only (-c, -i, -p are flux's).\n\n"
        + _REACH,
        f"  {PROG} flux ping -c 5 -i 0.2 1\n  {PROG} flux ping -c 1 3!broker\n"
        f"  {PROG} flux ping all --summary\n  {PROG} flux ping any --uri local:///run/flux/local",
        _cmd_ping, node_options="long, own --interval")
    ping.add_argument("target", metavar="TARGET", type=_ping_target,
                      help="all, any, upstream, N, N!SERVICE or SERVICE")
    ping.add_argument("-c", "--count", type=count, metavar="N",
                      help="pings to send (default: until stopped; with all, 1 per rank)")
    ping.add_argument("-i", "--interval", dest="ping_interval", type=seconds, default=1.0,
                      metavar="SECONDS",
                      help="seconds between pings (default: %(default)s)")
    ping.add_argument("-p", "--pad", type=count, default=0, metavar="N",
                      help="N bytes of padding in each ping (default: %(default)s)")
    ping.add_argument("-u", "--userid", action="store_true",
                      help="print the userid and rolemask of each answer")
    ping.add_argument("-b", "--batch", action="store_true",
                      help="send every ping (needs --count) before reading the answers")
    ping.add_argument("--summary", action="store_true",
                      help="end with a summary line: answered, unreachable, min/mean/max")
    _instance_options(ping)


def _add_tree(command: Factory) -> None:
    tree = command(
        "flux tree", "show the tree: ranks, parents, states",
        "Ask rank 0 and then each member down the tree (peermesh.info) and print one row "
        "per rank: its parent, state (online, or torpid when its parent has not heard from "
        "it lately), children. A member that does not answer is shown as unreachable. "
        "--json prints the answers as a list of {rank, parent, state, children, torpid "
        "(its torpid children), size, seq, topology, clients}.\n\n" + _REACH,
        f"  {PROG} flux tree\n  {PROG} flux tree --parent tcp://127.0.0.1:40123 --json",
        _cmd_tree, node_options="long")
    _instance_options(tree)


# --------------------------------------------------------------------------
# argument types


def _rank_arg(value: str) -> int:
    try:
        return check_rank(int(value))
    except (ValueError, TopologyError):
        raise argparse.ArgumentTypeError(f"{value!r} is not a rank (a whole number >= 0)") \
            from None


def _port_arg(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port (1-65535)")
    return int(value)


#: a ping target: (nodeid, or None for every rank; service; how flux names the nodeid)
PingTarget = tuple[Optional[int], str, str]


def _ping_target(value: str) -> PingTarget:
    """flux ping's TARGET (``any``, ``upstream``, ``N``, ``N!service``, ``service``) and
    peermesh's ``all``."""
    node, bang, service = value.partition("!")
    if not bang:
        node, service = value, "broker"
    if not service or "." in service:
        raise argparse.ArgumentTypeError(f"{value!r}: a service is one word (broker, kvs, ...)")
    if node == "all" and not bang:
        return None, service, "all"
    if node == "any":
        return NODEID_ANY, service, "any"
    if node == "upstream":
        return NODEID_UPSTREAM, service, "upstream"
    if node.isdigit():
        return _rank_arg(node), service, node
    if bang:
        raise argparse.ArgumentTypeError(f"invalid nodeid: {node!r} (any, upstream or a rank)")
    return NODEID_ANY, value, "any"  # SERVICE alone: on any rank, as flux ping


def _topology_arg(value: str) -> Topology:
    try:
        return Topology.parse(value)
    except TopologyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _payload(text_: Optional[str]) -> Optional[dict[str, Any]]:
    """The JSON argument as a payload object; ValueError naming what is wrong."""
    if text_ is None:
        return None
    try:
        obj = json.loads(text_)
    except ValueError as exc:
        raise ValueError(f"JSON argument {text_!r:.60} is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"JSON argument must be an object ({{...}}): Flux payloads are JSON "
                         f"objects, not {type(obj).__name__}")
    return obj


def _parents(args: argparse.Namespace) -> list[str]:
    if getattr(args, "uri", None):
        return [args.uri]
    if args.parents:
        return list(args.parents)
    parents = [p.strip() for p in os.environ.get(PARENTS_VARIABLE, "").split(",") if p.strip()]
    if not parents and hasattr(args, "uri") and os.environ.get(URI_VARIABLE):
        return [os.environ[URI_VARIABLE]]  # a one-shot command inside a flux-core instance
    return parents


def _check_endpoints(endpoints: list[str], local: bool = False) -> None:
    for endpoint in endpoints:
        if local and endpoint.startswith("local://"):
            if len(endpoint) == len("local://"):
                raise ValueError(f"{endpoint!r} names no socket: local://PATH")
            continue
        host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
        if not endpoint.startswith("tcp://") or not host or not port.isdigit():
            raise ValueError(f"--parent {endpoint!r} is not tcp://HOST:PORT")


def _address(config: NodeConfig, mesh: bool = False) -> str:
    """Where the tree sockets listen: on the mesh's interface, or (without a mesh) on the
    interface given, else 127.0.0.1."""
    if mesh or config.interface or os.environ.get("PEERMESH_INTERFACE"):
        from ..net.interfaces import select_interface

        return select_interface(config.interface).address
    return "127.0.0.1"


# --------------------------------------------------------------------------
# payloads and errors as text


def _readable(payload: Optional[bytes]) -> Any:
    """A payload as JSON can show it: its object, its string, or ``{"hex": ...}``."""
    if payload is None:
        return None
    try:
        return read_json(payload)
    except ProtocolError:
        pass
    try:
        return read_string(payload)
    except ProtocolError:
        return {"hex": payload.hex()}


def _shown(payload: Optional[bytes]) -> str:
    value = _readable(payload)
    if value is None:
        return ""
    return clean(value) if isinstance(value, str) else to_json(value)


_HINTS: dict[int, str] = {Errno.ENOSYS: "no member serves it",
                          Errno.EHOSTUNREACH: "that rank cannot be reached",
                          Errno.ETIMEDOUT: "no answer in time"}


def _error_text(exc: FluxError) -> str:
    name = errno.errorcode.get(exc.errnum, str(exc.errnum))
    hint = _HINTS.get(exc.errnum)
    return f"{exc.topic or 'rpc'}: {clean(exc.message)} ({name}" + (f": {hint})" if hint else ")")


# --------------------------------------------------------------------------
# reaching the instance


class Connection:
    """The command's client of a member, connected for as long as the ``with`` lasts."""

    def __init__(self, args: argparse.Namespace, config: NodeConfig) -> None:
        self.args = args
        self.config = config
        self.session: Optional[NodeSession] = None
        self.signals: Optional[HubSignals] = None
        self.client: Optional[FluxClient] = None

    def __enter__(self) -> FluxClient:
        try:
            return self._connect()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self) -> FluxClient:
        from .client import FluxClient

        args = self.args
        deadline = time.monotonic() + args.wait
        parents: Union[list[str], dict[str, str]] = _parents(args)
        _check_endpoints(list(parents), local=True)
        curve = None
        keys = _server_keys(args.server_keys, list(parents), self.config.key_file)
        if parents:
            if keys:
                from ..io.curve import Curve

                parents = keys
                if self.config.key_file is not None:  # KeyFileError naming what is wrong
                    curve = Curve.load(self.config.key_file)
            self.signals = HubSignals()
            where = "through " + ", ".join(parents)
        else:
            self.session = NodeSession(self.config)
            node = self.session.start()
            with leaving(f"looking for Flux instance {args.instance!r} on the mesh"):
                parents = _find_members(node, args.instance, deadline, args.peer_network)
            curve = node.curve   # with keys: a CURVE client of each member's X-PUBLICKEY
            if not parents:
                raise _NotFound(f"no member of Flux instance {args.instance!r} found on the mesh "
                                f"(interface {node.transport.interface(self.config.interface).name}"
                                f", beacon port {self.config.port}) within {args.wait:g} s; "
                                "is `flux run` running there, or give --parent ENDPOINT")
            where = f"through the mesh ({len(parents)} member{'s' * (len(parents) != 1)})"
        # found on the mesh: a failover looks there again, for members that came since
        find = None if self.session is None else _mesh_finder(self.config, args.instance,
                                                               args.peer_network)
        if isinstance(parents, dict) and (curve is not None or any(parents.values())):
            self.client = FluxClient({e: k for e, k in parents.items() if k}, curve=curve,
                                     failover=args.wait, find_members=find)
        else:
            self.client = FluxClient(list(parents), failover=args.wait, find_members=find)
        with leaving(f"connecting to Flux instance {args.instance!r}"):
            try:
                self.client.connect(max(0.05, deadline - time.monotonic()))
            except FluxError as exc:
                raise RuntimeError(f"could not connect to Flux instance {args.instance!r} "
                                   f"{where} within {args.wait:g} s ({_error_text(exc)})") \
                    from None
        if self.session is not None:  # found and connected: the member is all it needs now
            self.session.close()
            self.session = None
            self.signals = HubSignals()
        return self.client

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.session is not None:
            self.session.close()
        if self.signals is not None:
            self.signals.close()


def _server_keys(files: list[str], parents: list[str],
                 key_file: Optional[str]) -> Optional[dict[str, str]]:
    """``{endpoint: Z85 key}`` of ``--parent`` and ``--server-key`` (None without keys);
    ValueError when they do not pair up, KeyFileError naming a file that is no certificate."""
    if not parents:
        if files:
            raise ValueError("--server-key goes with --parent: members found on the mesh give "
                             "their keys themselves")
        return None
    if not files:
        if key_file is not None:
            raise ValueError("--key-file with --parent needs --server-key FILE, the public "
                             "certificate of the member at each --parent")
        return None
    if len(files) != len(parents):
        raise ValueError(f"give --server-key once per --parent, in the same order: "
                         f"{len(parents)} --parent, {len(files)} --server-key")
    from ..io.keys import load_public_key

    return {endpoint: load_public_key(path).decode() for endpoint, path in zip(parents, files)}


class _NotFound(PeermeshError, ValueError):
    """Nothing to connect to: a usage-level error (exit code 2)."""


def _mesh_finder(config: NodeConfig, instance: str,
                 peer_networks: Optional[list[str]]) -> Callable[[float], dict[str, str]]:
    """``find_members`` for a client whose members were found on the mesh: a node of its
    own joins the mesh for the look and leaves it after."""
    def find(timeout: float) -> dict[str, str]:
        import gevent

        from ..zre.node import Node

        node = Node(config=config)
        try:
            node.start()
            return _find_members(node, instance, time.monotonic() + timeout, peer_networks)
        finally:
            gevent.spawn(node.stop).join()  # (the stop goes on if the look is killed)
    return find


def _find_members(node: Node, instance: str, deadline: float,
                  peer_networks: Optional[list[str]]) -> dict[str, str]:
    """Endpoints of the mesh's members of ``instance``, the elected root's first, each with
    its node's ``X-PUBLICKEY`` (on a node with keys; "" without).

    Once the first member is seen, others get about one beacon interval to
    show up, so that the member the instance elected as rank 0 (the same
    election its members run: priority, then UUID) is asked first. Members
    whose endpoint is outside ``peer_networks`` are left out (see ``FluxOverlay``).
    """
    from ..counters import Counters
    from ..overlay.contract import PeerNetworks
    from ..wire.zre import PUBLIC_KEY_HEADER
    from .overlay import parse_member

    networks = PeerNetworks(peer_networks, Counters(log, "flux: members refused"))

    settle: Optional[float] = None
    while True:
        members: dict[Candidate, str] = {}
        keys: dict[str, str] = {}
        for uuid in node.peers():
            try:
                headers = node.peer_headers(uuid)
            except KeyError:
                continue
            member = parse_member(headers, instance)
            if member is None or not networks.admit(member[1], node, "Flux member endpoint"):
                continue
            members[Candidate(uuid, member[0])] = member[1]
            keys[member[1]] = headers.get(PUBLIC_KEY_HEADER, "")
        now = time.monotonic()
        if members and settle is None:
            settle = min(deadline, now + 1.25 * node.config.interval + 0.05)
        if now >= (settle or deadline):
            root = elect(members)
            ordered = sorted(members.values(), key=lambda e: e != members[root]) if root else []
            return {endpoint: keys[endpoint] for endpoint in ordered}
        node.recv(max(0.0, (settle or deadline) - time.monotonic()))


# --------------------------------------------------------------------------
# run


def _cmd_run(args: argparse.Namespace, config: NodeConfig) -> int:
    import gevent.event

    from .overlay import FluxOverlay

    if args.flux_config:
        return _run_flux_mode(args)

    parents = _parents(args)
    _check_endpoints(parents)
    if args.root and parents:
        raise ValueError("--root and --parent exclude each other: rank 0 joins no one")
    if args.endpoint and args.tree_port:
        raise ValueError("--endpoint and --tree-port exclude each other: give one place to "
                         "listen")
    registers = _import_handlers(args.handlers)
    mesh = not args.root and not parents
    if not mesh and config.metrics:
        raise ValueError("--metrics exports a mesh node's metrics: a member given --root or "
                         "--parent runs without one")
    keys = _server_keys(args.server_keys, parents, config.key_file)
    curve = None
    if not mesh and config.key_file is not None:  # alone on keys: the node's, as on the mesh
        from ..io.curve import Curve

        curve = Curve.load(config.key_file, config.allowed_keys,  # KeyFileError if bad
                           config.zap_domain)
    elif keys:
        raise ValueError("a member on keys needs --key-file, its own secret certificate, "
                         "besides --server-key")
    options = dict(root=args.root, rank=args.rank, parents=keys or parents,
                   topology=args.topology, priority=args.priority,
                   peer_networks=args.peer_network)
    render = _notice_json if args.json else _notice_text
    session: Optional[NodeSession] = None
    signals: Optional[HubSignals] = None
    stopped = gevent.event.Event()
    address = _address(config, mesh) if args.tree_port or not mesh else None
    endpoint = f"tcp://{address}:{args.tree_port}" if args.tree_port else args.endpoint
    if mesh:
        flux = FluxOverlay(args.instance, endpoint=endpoint, **options)
        session = NodeSession(config, serving=True)
        flux.attach(session.node)
        how = "joining through the mesh"
    else:
        flux = FluxOverlay(args.instance, address=address, endpoint=endpoint, curve=curve,
                           **options)
        signals = HubSignals(on_first=stopped.set)
        how = "rank 0" if args.root else "joining through " + ", ".join(parents)
    flux.add_listener(lambda notice: emit(render(notice.what, notice.rank, notice.detail)))

    def on_refused(notice: Notice) -> None:
        if notice.what == "refused":
            stopped.set()

    flux.add_listener(on_refused)
    try:
        if session is not None:
            session.start()
        flux.start()
        for name, register in registers:
            try:
                register(flux)
            except Exception as exc:
                raise ValueError(f"handlers module {name!r}: register(flux) raised "
                                 f"{type(exc).__name__}: {exc}") from None
        shape = args.topology if args.root else "the topology of rank 0"  # a joining node's
        note(f"Flux instance {args.instance!r} ({shape}): member at {flux.endpoint}, "
             f"{how}; Ctrl-C to leave")
        if session is not None:
            session.wait_stopped()
        else:
            stopped.wait()
    finally:
        flux.stop()
        if session is not None:
            session.close()
        if signals is not None:
            signals.close()
    if flux.refusal is not None:
        note(f"error: joining was refused: {flux.refusal}")
        return EXIT_FAILURE
    return EXIT_OK


def _run_flux_mode(args: argparse.Namespace) -> int:
    """``flux run --flux-config``: a ``FluxModeMember`` until a signal, then goodbye."""
    import socket

    import gevent
    import gevent.event

    from .fluxmode import FluxModeMember

    if args.root or _parents(args):
        raise ValueError("--flux-config excludes --root and --parent: the file gives the place")
    hostname = args.flux_hostname or socket.gethostname()
    registers = _import_handlers(args.handlers)
    member = FluxModeMember.from_config(args.flux_config, hostname)  # ValueError: why
    render = _notice_json if args.json else _notice_text
    stopped = gevent.event.Event()
    signals = HubSignals(on_first=stopped.set)
    try:
        member.start()
        try:
            online = member.wait_online(HELLO_WAIT)
        except FluxStateError as exc:
            note(f"error: joining was refused: {str(exc).removeprefix('refused: ')}")
            return EXIT_FAILURE
        if not online:
            note(f"error: the parent at {member.parent} did not answer overlay.hello")
            return EXIT_FAILURE
        for name, register in registers:
            register(member)
        emit(render("online", member.rank, {"parent": member.core.parent_uuid,
                                            "size": member.core.size}))
        where = f"parent {member.parent}" if member.parent else f"children at {member.bind}"
        note(f"flux-core instance ({args.flux_config}): rank {member.rank} of "
             f"{member.core.size} as {hostname}, {where}; Ctrl-C to leave")
        gevent.wait([stopped, member.ended], count=1)   # a signal, or the tree let it go
        if member.ended.is_set():
            note(f"left the flux-core instance: {member.core.state}")
    finally:
        member.stop()
        signals.close()
    return EXIT_OK


def _notice_text(what: str, rank: int, detail: Any) -> str:
    if what.endswith("-failed") and isinstance(detail, int):  # join-failed, hello-failed
        detail = errno.errorcode.get(detail, str(detail))
    extra = "" if detail is None else " " + (clean(detail) if isinstance(detail, str)
                                             else to_json(detail))
    return f"{what} rank {rank}{extra}"


def _notice_json(what: str, rank: int, detail: Any) -> str:
    return to_json({"event": what, "rank": rank, "detail": detail})


def _import_handlers(modules: list[str]) -> list[tuple[str, Callable[[Any], Any]]]:
    """Each module's ``register(flux)``; ValueError naming a module that has none."""
    registers = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # missing, or its code failed on import
            detail = exc if isinstance(exc, ImportError) else f"{type(exc).__name__}: {exc}"
            raise ValueError(f"cannot import handlers module {name!r}: {detail}") from None
        register = getattr(module, "register", None)
        if not callable(register):
            raise ValueError(f"handlers module {name!r} has no register(flux) function")
        registers.append((name, register))
    return registers


# --------------------------------------------------------------------------
# one-shot commands


def _cmd_rpc(args: argparse.Namespace, config: NodeConfig) -> int:
    payload = _payload(args.payload)
    with Connection(args, config) as flux:
        rank = _checked_rank(flux, args.rank, args.timeout)
        future = flux.rpc(args.topic, payload, NODEID_ANY if rank is None else rank,
                          streaming=args.stream)
        try:
            with leaving(f"waiting for the answer to {args.topic}"):
                if not args.stream:
                    _print_answer(args, future.get(args.timeout))
                    return EXIT_OK
                try:
                    for answer in future.stream(args.timeout):
                        _print_answer(args, answer)
                except KeyboardInterrupt:
                    future.cancel()
                    raise
        except FluxError as exc:
            return _rpc_error(args, exc)
    return EXIT_OK


def _print_answer(args: argparse.Namespace, payload: Optional[bytes]) -> None:
    if args.json:
        emit(to_json({"topic": args.topic, "payload": _readable(payload)}))
    elif payload is not None:  # no payload, no line (as flux-core's `flux rpc`)
        emit(_shown(payload))


def _rpc_error(args: argparse.Namespace, exc: FluxError) -> int:
    if args.json:
        emit(to_json({"topic": args.topic, "errnum": exc.errnum,
                      "error": errno.errorcode.get(exc.errnum, str(exc.errnum)),
                      "message": exc.message}))
    note(f"error: {_error_text(exc)}")
    return EXIT_FAILURE


def _checked_rank(flux: FluxClient, rank: Optional[int], timeout: float) -> Optional[int]:
    """``rank``, or ValueError when it is past the instance's size (the member's, and when
    past that, rank 0's: a member does not hear of every rank given after it joined)."""
    if rank is None or rank < flux.size:
        return rank
    with leaving("asking rank 0 for the instance's size"):
        size = flux.rpc("peermesh.info", None, 0).get_json(timeout).get("size")
    if isinstance(size, int) and rank >= size:
        raise ValueError(f"rank {rank} is out of range: the instance has ranks 0..{size - 1}")
    return rank


def _cmd_pub(args: argparse.Namespace, config: NodeConfig) -> int:
    payload = _payload(args.payload)
    with Connection(args, config) as flux:
        try:
            with leaving(f"waiting for rank 0 to number event {args.topic}"):
                seq = flux.publish(args.topic, payload).get_json(args.timeout)["seq"]
        except FluxError as exc:
            return _rpc_error(args, exc)
    if args.json:
        emit(to_json({"seq": seq, "topic": args.topic}))
    elif args.synchronous:
        emit(f"seq={seq}")
    return EXIT_OK


def _cmd_sub(args: argparse.Namespace, config: NodeConfig) -> int:
    with Connection(args, config) as flux:
        flux.add_listener(_report_lost)
        try:
            with leaving(f"subscribing to {args.prefix!r} events"):
                subscription = flux.subscribe(args.prefix, args.timeout)
        except FluxError as exc:
            note(f"error: {_error_text(exc)}")
            return EXIT_FAILURE
        note(f"subscribed to {args.prefix!r} events through rank {flux.rank}; Ctrl-C to stop")
        shown = 0
        try:
            while flux.connected or flux.reconnecting:
                event = subscription.get(flux.heartbeat)  # (wakes to see a lost member)
                if event is None:
                    continue
                if args.json:
                    emit(to_json({"seq": event.seq, "topic": event.topic,
                                  "payload": _readable(event.payload)}))
                else:
                    emit(f"{clean(event.topic)}\t{_shown(event.payload)}")
                shown += 1
                if args.count is not None and shown >= args.count:
                    break
        except KeyboardInterrupt:
            return EXIT_OK  # the normal end of following
    return EXIT_OK if flux.connected or args.count is not None and shown >= args.count \
        else EXIT_FAILURE


def _report_lost(notice: Any) -> None:
    if notice.what == "member-lost":
        note(f"the member (rank {notice.rank}) was lost ({clean(notice.detail)}); "
             "looking for another")
    elif notice.what == "member-changed":
        note(f"carrying on through rank {notice.rank} at {clean(notice.detail)}")
    elif notice.what == "failover-failed":
        note(f"error: no member took over ({clean(notice.detail)})")
    elif notice.what == "events-lost":
        note(f"events {notice.detail[0]} to {notice.detail[1]} are no longer kept by rank 0: "
             "those that matched are lost")


def _cmd_ping(args: argparse.Namespace, config: NodeConfig) -> int:
    import gevent

    from .bodies import ping_body

    nodeid, service, label = args.target
    if args.batch and not args.count:
        raise ValueError("--batch needs --count: it sends every ping first")
    topic = service + ".ping"
    pad = "p" * args.pad
    rtts: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    with Connection(args, config) as flux:
        if nodeid is None:
            rows = walk_tree(flux, args.timeout)   # a rank that did not answer fails its ping too
            targets = [(row["rank"], str(row["rank"])) for row in rows]
            # and the ranks rank 0 has lost (a killed member is no one's child any more)
            targets += [(r, str(r)) for r in rows[0].get("offline", ()) if r not in
                        {t for t, _ in targets}]
            counts = args.count or 1
        else:
            if nodeid <= 0xFFFFFFFD:
                _checked_rank(flux, nodeid, args.timeout)
            targets, counts = [(nodeid, label)], args.count or 0
        if not args.json:
            emit(f"flux-ping {label}!{service}")

        def answered(name: str, seq: int, sent: float, future: Any) -> bool:
            try:
                answer = future.get_json(args.timeout)
            except FluxError as exc:
                failed.append({"rank": int(name) if name.isdigit() else name,
                               "error": _error_text(exc)})
                if not args.json:
                    note(f"{'' if name == 'any' else name + '!'}{_error_text(exc)}")
                return False
            ms = (time.monotonic() - sent) * 1000
            rank, route = answer.get("rank"), answer.get("route", "")
            rtts.append({"rank": rank, "seq": seq, "ms": round(ms, 3), "route": route})
            if not args.json:
                cred = (f" userid={answer.get('userid')} rolemask="
                        f"{_hex(answer.get('rolemask'))}" if args.userid else "")
                emit(f"{rank}!{topic} pad={args.pad}{cred} seq={seq} time={ms:.3f} ms "
                     f"({clean(str(route))})")
            return True

        with leaving("pinging"):
            for target, name in targets:
                seq = 0
                batch: list[tuple[int, float, Any]] = []
                while not counts or seq < counts:
                    if seq:
                        gevent.sleep(args.ping_interval)
                    sent = time.monotonic()
                    future = flux.rpc(topic, ping_body(seq, pad), target)
                    if args.batch:
                        batch.append((seq, sent, future))
                    elif not answered(name, seq, sent, future) and nodeid is not None:
                        break  # as flux ping: the first error ends it
                    seq += 1
                for seq, sent, future in batch:
                    answered(name, seq, sent, future)
    summary = _summary(rtts, failed)
    if args.json:
        emit(to_json({"pings": rtts, "unreachable": failed, "summary": summary}))
    elif args.summary and (rtts or failed):
        times = (f": min/mean/max = {summary['min_ms']:.3f}/{summary['mean_ms']:.3f}/"
                 f"{summary['max_ms']:.3f} ms" if rtts else "")
        emit(f"{summary['answered']} answered, {summary['unreachable']} unreachable{times}")
    return EXIT_FAILURE if failed else EXIT_OK


def _hex(value: Any) -> str:
    return f"{value:#x}" if isinstance(value, int) else str(value)


def _summary(rtts: list[dict[str, Any]], failed: list[dict[str, Any]]) -> dict[str, Any]:
    times = [r["ms"] for r in rtts]
    summary: dict[str, Any] = {"answered": len(times), "unreachable": len(failed)}
    if times:
        summary.update(min_ms=min(times), mean_ms=round(sum(times) / len(times), 3),
                       max_ms=max(times))
    return summary


def walk_tree(flux: FluxClient, timeout: float,
              limit: Optional[int] = None) -> list[dict[str, Any]]:
    """``peermesh.info`` of rank 0, then of each rank's children, level by level: rows of
    {rank, parent, state, children, torpid, size, seq, topology, clients}; a rank that does not
    answer is {rank, parent, state: "unreachable", error}. With ``limit``, at most that many
    ranks are asked (the lowest of each level first)."""
    rows: list[dict[str, Any]] = []
    level: dict[int, Optional[int]] = {0: None}  # rank -> the rank that listed it
    seen: set[int] = set()
    while level:
        if limit is not None:
            level = dict(sorted(level.items())[:max(0, limit - len(rows))])
        seen.update(level)
        futures = [(rank, parent, flux.rpc("peermesh.info", None, rank))
                   for rank, parent in level.items()]
        level = {}
        for rank, parent, future in futures:
            try:
                row = _tree_row(rank, parent, future.get_json(timeout))
            except FluxError as exc:
                rows.append({"rank": rank, "parent": parent, "state": "unreachable",
                             "error": _error_text(exc)})
                continue
            rows.append(row)
            for child in row["children"]:
                if child not in seen:
                    level.setdefault(child, rank)
    return rows


def _tree_row(rank: int, parent: Optional[int], info: dict[str, Any]) -> dict[str, Any]:
    """A member's ``peermesh.info`` answer as a row, whatever it sent (rank and parent as
    the walk found them)."""
    def ranks(key: str) -> list[int]:
        value = info.get(key)
        return [r for r in value if type(r) is int and r >= 0] if isinstance(value, list) else []

    def scalar(key: str) -> Any:
        value = info.get(key)
        return value if type(value) in (int, str) else None

    return {"rank": rank, "parent": parent, "state": str(info.get("state", "?")),
            "children": ranks("children"), "torpid": ranks("torpid"), "size": scalar("size"),
            "seq": scalar("seq"), "topology": scalar("topology"), "clients": scalar("clients"),
            **({"offline": ranks("offline")[:MAX_OFFLINE]} if rank == 0 else {})}


def _cmd_tree(args: argparse.Namespace, config: NodeConfig) -> int:
    with Connection(args, config) as flux:
        with leaving("walking the tree"):
            rows = walk_tree(flux, args.timeout)
    if args.json:
        emit(to_json(rows))
        return EXIT_OK
    depth: dict[int, int] = {}
    torpid = {r for row in rows for r in row.get("torpid", ())}
    lines = [("RANK", "PARENT", "STATE", "CHILDREN")]
    for row in _depth_first(rows):
        rank, parent = row["rank"], row.get("parent")
        depth[rank] = depth.get(parent, -1) + 1 if parent is not None else 0
        state = clean(row["state"]) + (" torpid" if rank in torpid else "") + \
            (f": {row['error']}" if "error" in row else "")
        lines.append(("  " * depth[rank] + str(rank), "-" if parent is None else str(parent),
                      state, ",".join(map(str, row.get("children", ()))) or "-"))
    emit(table(lines))
    root = rows[0]
    if "error" not in root:
        answered = sum(1 for row in rows if "error" not in row)
        note(f"{answered} members answered; size {root['size']}, {clean(root['topology'])}, "
             f"last event {root['seq']}")
    return EXIT_OK


def _depth_first(rows: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    by_parent: dict[Optional[int], list[dict[str, Any]]] = {}
    for row in rows:
        by_parent.setdefault(row.get("parent") if row["rank"] else None, []).append(row)
    stack = list(reversed(by_parent.get(None, [])))
    while stack:
        row = stack.pop()
        yield row
        stack.extend(reversed(sorted(by_parent.get(row["rank"], []), key=lambda r: r["rank"])))
