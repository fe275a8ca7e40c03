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
import signal
import sys
from typing import Any, Callable, Optional

import gevent
import gevent.event

from ..argtypes import count, seconds
from ..config import NodeConfig
from ..zre.node import Node
from .channel import Channel, ServerInfo
from .demo import echo_service
from .errors import NoServerError, RequestTimeout, ServiceError
from .handlers import Service
from .server import Server
from .versions import version_key

__all__ = ["add_commands", "load_handlers"]

PROG = "peermesh"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

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
    serve.add_argument("--handlers", action="append", default=[], metavar="MODULE",
                       help="import MODULE (dotted name) and serve its Service objects; "
                            "repeatable")
    serve.add_argument("--no-echo", action="store_true", help="do not serve the demo 'echo'")
    serve.add_argument("--channel", action="append", default=[], metavar="ENDPOINT",
                       help="also serve the channel at ENDPOINT (tcp://HOST:PORT); repeatable")
    serve.add_argument("--max-concurrent", type=count, metavar="N",
                       help="requests running at once before new ones get 503 "
                            "(default: no limit)")

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
    call.add_argument("service", metavar="SERVICE", help="service name")
    call.add_argument("action", metavar="ACTION", help="action name")
    call.add_argument("payload", metavar="PAYLOAD-JSON", nargs="?", default="null",
                      help="the request payload as JSON (default: null)")
    call.add_argument("--version", dest="service_version", metavar="VERSION",
                      help="service version wanted: exact, or the highest with the same "
                           "major that is not lower (default: the highest offered)")
    call.add_argument("--category", default="", metavar="CATEGORY",
                      help="action category (default: none)")
    call.add_argument("--timeout", "-t", type=seconds, default=5.0, metavar="SECONDS",
                      help="longest wait for a server and its reply (default: %(default)s)")
    call.add_argument("--retries", type=count, default=0, metavar="N",
                      help="re-send to another server up to N times if the server dies "
                           "holding the request (only for idempotent actions; default 0)")
    call.add_argument("--bind", metavar="ENDPOINT",
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
                               "[{id, address, in_flight, latency_ms, ...}]}")
    services.add_argument("--bind", metavar="ENDPOINT",
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


def _stderr(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, default=_jsonable)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray, memoryview)):
        data = bytes(obj)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return {"hex": data.hex()}
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return repr(obj)


class _Stopper:
    """Sets an event on SIGINT/SIGTERM (handled on the hub)."""

    def __init__(self) -> None:
        self.event = gevent.event.Event()
        self.signalled = False
        self._handlers = [gevent.signal_handler(sig, self._on_signal)
                          for sig in (signal.SIGINT, signal.SIGTERM)]

    def _on_signal(self) -> None:
        self.signalled = True
        self.event.set()

    def cancel(self) -> None:
        """Restore the default signal handling."""
        for handler in self._handlers:
            handler.cancel()


def _node(config: NodeConfig) -> Node:
    try:
        return Node(config=config)
    except TypeError as exc:
        raise ValueError(f"invalid configuration: {exc}") from None


def _start(node: Node) -> None:
    try:
        node.start()
    except OSError as exc:
        raise RuntimeError(f"cannot start the node (UDP beacon port {node.config.port}): "
                           f"{exc.strerror or exc}") from exc


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
    node = _node(config)
    server = Server(node, channels=args.channel, max_concurrent=args.max_concurrent)
    if not args.no_echo:
        server.add_service(echo_service(label=node.name))
    for module in args.handlers:
        load_handlers(server, module)
    if not server.catalog():
        raise ValueError("nothing to serve: --no-echo and no services from --handlers")
    stopper = _Stopper()
    try:
        _start(node)
        server.start()
        offered = ", ".join(f"{s.name} {s.version}" for s in server.catalog())
        _stderr(f"{node.name} ({node.uuid.hex}) serving {offered}; Ctrl-C to stop")
        stopper.event.wait()
    finally:
        stopper.cancel()
        server.stop()
        node.stop()
    return EXIT_OK


def cmd_call(args: argparse.Namespace, config: NodeConfig) -> int:
    """One request; the reply as JSON on stdout."""
    try:
        payload = json.loads(args.payload)
    except ValueError as exc:
        raise ValueError(f"PAYLOAD is not JSON: {exc}") from None
    node = _node(config)
    channel = _channel(node, args.bind)
    stopper = _Stopper()
    try:
        _start(node)
        channel.start()
        result = channel.request_async(args.service, args.action, payload,
                                       version=args.service_version, category=args.category,
                                       timeout=args.timeout, retries=args.retries)
        gevent.wait([result, stopper.event], count=1)
        if stopper.signalled and not result.ready():
            return EXIT_INTERRUPTED
        try:
            reply = result.get()
        except NoServerError as exc:
            _stderr(f"error: {exc.message}")
            return EXIT_USAGE
        except ServiceError as exc:
            _stderr(f"error: status {exc.status}: {exc.message}")
            return EXIT_FAILURE
        except RequestTimeout as exc:
            _stderr(f"error: {exc}")
            return EXIT_FAILURE
        sys.stdout.write(_json(reply) + "\n")
        sys.stdout.flush()
        return EXIT_OK
    finally:
        stopper.cancel()
        channel.stop()
        node.stop()


def _catalog(channel: Channel) -> list[dict[str, Any]]:
    infos: dict[str, ServerInfo] = {s.id: s for s in channel.servers()}
    rows = []
    for name, versions in channel.services().items():
        for version, ids in sorted(versions.items(), key=lambda kv: version_key(kv[0])):
            rows.append({"service": name, "version": version,
                         "servers": [infos[i].to_dict() for i in ids if i in infos]})
    return rows


def cmd_services(args: argparse.Namespace, config: NodeConfig) -> int:
    """Collect INTRs for --wait seconds and print the catalog."""
    node = _node(config)
    channel = _channel(node, args.bind)
    stopper = _Stopper()
    try:
        _start(node)
        channel.start()
        stopper.event.wait(args.wait)
        if stopper.signalled:
            return EXIT_INTERRUPTED
        rows = _catalog(channel)
    finally:
        stopper.cancel()
        channel.stop()
        node.stop()
    if args.json:
        sys.stdout.write(_json(rows) + "\n")
    elif rows:
        table = [("SERVICE", "VERSION", "SERVERS")]
        for row in rows:
            servers = " ".join(f"{s['address'] or '?'}({s['id'][:10]})" for s in row["servers"])
            table.append((row["service"], row["version"], servers))
        widths = [max(len(r[i]) for r in table) for i in range(2)]
        sys.stdout.write("\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}".rstrip()
                                   for r in table) + "\n")
    sys.stdout.flush()
    if not rows:
        _stderr(f"no server introduced itself within {args.wait:g} s")
    return EXIT_OK
