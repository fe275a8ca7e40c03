"""``peermesh serve``, ``peermesh call`` and ``peermesh services``: Safir-Darbaan from the shell.

Registered through ``peermesh.cli.commands.COMMAND_MODULES``: ``add_commands(command)``
receives build_parser's factory and adds the three subcommands. Each starts
its own node with the common options (interface, beacon port, name, ...).

* ``serve`` runs a server with the demo ``echo`` service (see ``demo``) and
  any services from ``--handlers MODULE`` until Ctrl-C or SIGTERM.
* ``call`` starts a channel, waits (up to ``--timeout``) for a server of the
  service to introduce itself, sends one request and prints the reply as JSON.
* ``services`` starts a channel, collects INTRs for ``--wait`` seconds and
  prints the catalog.

A handlers module is imported by name (it must be importable: on
``PYTHONPATH`` or installed). Every ``Service`` object among its globals is
served, and a ``register(server)`` function, if it has one, is called with
the ``Server`` to add more.
"""

from __future__ import annotations

import argparse
import importlib
import json
from typing import Any, Callable, Optional

import gevent

from ..argtypes import count, positive_count, seconds, text, utf8
from ..cli.output import (EXIT_FAILURE, EXIT_OK, EXIT_USAGE, PROG, clean, emit, note, table,
                          to_json)
from ..cli.session import NodeSession
from ..config import NodeConfig
from ..zre.node import Node
from .channel import HEADER_SERVER, Channel, ServerInfo
from .demo import echo_service
from .errors import NoServerError, RequestTimeout, ServiceError
from .handlers import Service
from .server import MAX_CONCURRENT, Server
from .versions import version_key

__all__ = ["add_commands", "load_handlers"]


Factory = Callable[..., argparse.ArgumentParser]


def add_commands(command: Factory) -> None:
    """Add ``serve``, ``call`` and ``services`` with build_parser's ``command`` factory."""
    serve = command(
        "serve", "serve Safir-Darbaan services (a demo 'echo' and your own)",
        "Start a node and a Safir-Darbaan server on it. It serves the demo service 'echo' "
        "1.0 (actions echo, info, sleep, fail) and every Service found in the modules named "
        "by --handlers (a module's register(server) function, if any, is called too). "
        "Channels are found on the mesh through their HELLO header X-PM-SADA-CHANNEL, or "
        "named with --channel. Runs until Ctrl-C or SIGTERM, then stops gracefully: "
        "channels are told the catalog is empty and running requests may finish.",
        f"  {PROG} serve --interface lo\n"
        f"  {PROG} serve --handlers myapp.services --no-echo\n"
        f"  {PROG} serve --channel tcp://10.0.0.5:5055      # a channel outside the mesh",
        cmd_serve)
    serve.add_argument("--handlers", action="append", default=[], metavar="MODULE", type=text,
                       help="import MODULE (dotted name) and serve its Service objects; "
                            "repeatable")
    serve.add_argument("--no-echo", action="store_true", help="do not serve the demo 'echo'")
    serve.add_argument("--channel", action="append", default=[], metavar="ENDPOINT", type=text,
                       help="also serve the channel at ENDPOINT (tcp://HOST:PORT); repeatable")
    serve.add_argument("--max-concurrent", type=positive_count, metavar="N",
                       default=MAX_CONCURRENT,
                       help="requests running at once before new ones get 503 "
                            f"(default: {MAX_CONCURRENT})")
    serve.add_argument("--channel-network", action="append", metavar="CIDR", type=text,
                       help="serve channels found on the mesh only in this network "
                            "(default: the node's interface network); repeatable")

    call = command(
        "call", "send one request to a service and print the reply",
        "Start a node with a Safir-Darbaan channel, wait for a server offering SERVICE "
        "(in a version compatible with --version) to introduce itself, send ACTION with "
        "PAYLOAD (JSON; default null, sent as msgpack) and print the reply as JSON. The "
        "whole call, including waiting for a server, takes at most --timeout seconds. "
        "Exit code 1 when the reply has an error status (printed on stderr) or no reply "
        "came, 2 when no server offers the service.",
        f"  {PROG} call echo echo '{{\"hello\": \"world\"}}'\n"
        f"  {PROG} call --version 1 --timeout 3 echo info\n"
        f"  {PROG} call calc add '[1, 2]' --version 1.2 --category math",
        cmd_call)
    call.add_argument("service", metavar="SERVICE", type=text, help="service name")
    call.add_argument("action", metavar="ACTION", type=text, help="action name")
    call.add_argument("payload", metavar="PAYLOAD-JSON", nargs="?", default="null", type=utf8,
                      help="the request payload as JSON (default: null)")
    call.add_argument("--version", dest="service_version", metavar="VERSION", type=text,
                      help="service version wanted: exact, or the highest with the same "
                           "major that is not lower (default: the highest offered)")
    call.add_argument("--category", default="", metavar="CATEGORY", type=utf8,
                      help="action category (default: none)")
    call.add_argument("--timeout", "-t", type=seconds, default=5.0, metavar="SECONDS",
                      help="longest wait for a server and its reply (default: %(default)s)")
    call.add_argument("--retries", type=count, default=0, metavar="N",
                      help="re-send to another server up to N times if the server dies "
                           "holding the request (only for idempotent actions; default 0)")
    call.add_argument("--bind", metavar="ENDPOINT", type=text,
                      help="bind the channel at ENDPOINT (tcp://IP:PORT) instead of a random "
                           "port on the node's interface, so servers can be pointed at it")

    services = command(
        "services", "list the services offered to a channel",
        "Start a node with a Safir-Darbaan channel, let servers on the mesh introduce "
        "themselves for --wait seconds, print the catalog (service, version, servers with "
        "their addresses) and leave.",
        f"  {PROG} services\n  {PROG} services --interface lo --wait 1 --json",
        cmd_services)
    services.add_argument("--wait", "-w", type=seconds, default=2.0, metavar="SECONDS",
                          help="how long to collect introductions (default: %(default)s)")
    services.add_argument("--json", action="store_true",
                          help="print one JSON list of {service, version, servers: "
                               "[{id, name, address, in_flight, latency_ms, ...}]}")
    services.add_argument("--bind", metavar="ENDPOINT", type=text,
                          help="bind the channel at ENDPOINT (tcp://IP:PORT)")


# --------------------------------------------------------------------------
# helpers


def load_handlers(server: Server, module_name: str) -> list[Service]:
    """Import ``module_name`` and serve its ``Service`` objects; ValueError if it fails."""
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:   # missing, or its code failed on import (SyntaxError, ...)
        detail = exc if isinstance(exc, ImportError) else f"{type(exc).__name__}: {exc}"
        raise ValueError(f"cannot import handlers module {module_name!r}: {detail}") from None
    found = [v for v in vars(module).values() if isinstance(v, Service)]
    for service in found:
        server.add_service(service)
    register = getattr(module, "register", None)
    if callable(register):
        try:
            register(server)
        except Exception as exc:
            raise ValueError(f"handlers module {module_name!r}: register(server) raised "
                             f"{type(exc).__name__}: {exc}") from None
    if not found and not callable(register):
        raise ValueError(f"handlers module {module_name!r} has no Service objects and no "
                         "register(server) function")
    return found


def _channel(node: Node, bind: Optional[str]) -> Channel:
    try:
        return Channel(node, endpoint=bind) if bind else Channel(node)
    except ValueError:
        raise
    except Exception as exc:
        raise RuntimeError(f"cannot bind the channel: {exc}") from exc


# --------------------------------------------------------------------------
# subcommands


def cmd_serve(args: argparse.Namespace, config: NodeConfig) -> int:
    """Serve until SIGINT/SIGTERM."""
    session = NodeSession(config, serving=True)
    node = session.node
    server = Server(node, channels=args.channel, max_concurrent=args.max_concurrent,
                    channel_networks=args.channel_network)
    if not args.no_echo:
        server.add_service(echo_service(label=node.name))
    for module in args.handlers:
        load_handlers(server, module)
    if not server.catalog():
        raise ValueError("nothing to serve: --no-echo and no services from --handlers")
    try:
        session.start()
        server.start()
        offered = ", ".join(f"{s.name} {s.version}" for s in server.catalog())
        note(f"{node.name} ({node.uuid.hex}) serving {offered}; Ctrl-C to stop")
        session.wait_stopped()
    finally:
        server.stop()
        session.close()
    return EXIT_OK


def cmd_call(args: argparse.Namespace, config: NodeConfig) -> int:
    """One request; the reply as JSON on stdout."""
    try:
        payload = json.loads(args.payload)
    except ValueError as exc:
        raise ValueError(f"PAYLOAD is not JSON: {exc}") from None
    session = NodeSession(config)
    channel = _channel(session.node, args.bind)
    try:
        session.start()
        channel.start()
        try:
            reply = channel.request(args.service, args.action, payload,
                                    version=args.service_version, category=args.category,
                                    timeout=args.timeout, retries=args.retries)
        except NoServerError as exc:
            note(f"error: {exc.message}")
            return EXIT_USAGE
        except ServiceError as exc:
            note(f"error: status {exc.status}: {exc.message}")
            return EXIT_FAILURE
        except RequestTimeout as exc:
            note(f"error: {exc}")
            return EXIT_FAILURE
        emit(to_json(reply))
        return EXIT_OK
    finally:
        channel.stop()
        session.close()


def _server_names(node: Node) -> dict[str, list[str]]:
    """IP address -> names of the mesh's peers there that advertise a Safir-Darbaan server."""
    names: dict[str, list[str]] = {}
    for uuid in node.peers():
        try:
            info = node.peer_info(uuid)
        except Exception:  # gone meanwhile
            continue
        if HEADER_SERVER in info.headers:
            host = info.address.split("://")[-1].rsplit(":", 1)[0]
            names.setdefault(host, []).append(info.name)
    return names


def _catalog(channel: Channel, node: Node) -> list[dict[str, Any]]:
    """The catalog; a server gets the ``name`` of the one server peer at its address."""
    infos: dict[str, ServerInfo] = {s.id: s for s in channel.servers()}
    names = _server_names(node)
    rows = []
    for name, versions in channel.services().items():
        for version, ids in sorted(versions.items(), key=lambda kv: version_key(kv[0])):
            servers = []
            for i in ids:
                if i in infos:
                    entry = infos[i].to_dict()
                    there = names.get(entry["address"], [])
                    entry["name"] = there[0] if len(there) == 1 else None
                    servers.append(entry)
            rows.append({"service": name, "version": version, "servers": servers})
    return rows


def cmd_services(args: argparse.Namespace, config: NodeConfig) -> int:
    """Collect INTRs for --wait seconds and print the catalog."""
    session = NodeSession(config)
    channel = _channel(session.node, args.bind)
    try:
        session.start()
        channel.start()
        gevent.sleep(args.wait)
        rows = _catalog(channel, session.node)
    finally:
        channel.stop()
        session.close()
    if args.json:
        emit(to_json(rows))
    elif rows:
        lines = [("SERVICE", "VERSION", "SERVERS")]
        for row in rows:
            servers = " ".join(f"{clean(s['name'])}@{s['address']}" if s["name"]
                               else f"{s['address'] or '?'}({s['id'][:10]})"
                               for s in row["servers"])
            lines.append((row["service"], row["version"], servers))
        emit(table(lines))
    if not rows:
        note(f"no server introduced itself within {args.wait:g} s")
    return EXIT_OK
