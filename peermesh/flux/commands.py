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

This module builds the parser; ``run`` is in ``runcommand``, the other commands in
``clientcommands``, and how they reach the instance in ``cliclient``.
"""

from __future__ import annotations

import argparse
from typing import Callable, Optional

from ..argtypes import cidr, count, positive_count, seconds, text, utf8
from ..cli.output import PROG
from ..wire.flux import NODEID_ANY, NODEID_UPSTREAM
from .topology import DEFAULT_TOPOLOGY, Topology, TopologyError, check_rank
from .cliclient import PARENTS_VARIABLE, URI_VARIABLE
from .clientcommands import _cmd_ping, _cmd_pub, _cmd_rpc, _cmd_sub, _cmd_tree, _tree_row, walk_tree
from .runcommand import _cmd_run

__all__ = ["add_commands", "PARENTS_VARIABLE", "walk_tree"]

Factory = Callable[..., argparse.ArgumentParser]

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
