"""How the ``flux`` CLI reaches a Flux instance: the members to try (``--parent``, the mesh),
a rankless client connected to the first that accepts, and how answers and errors are shown."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from ..cli.output import clean, to_json
from ..cli.session import HubSignals, NodeSession, leaving
from ..config import NodeConfig
from ..errors import PeermeshError, ProtocolError
from ..overlay.election import Candidate, elect
from ..wire.flux import Errno, read_json, read_string
from .errors import FluxError

if TYPE_CHECKING:  # the overlay (and gevent) are imported by the actions, not by the parser
    from ..zre.node import Node
    from .client import FluxClient

log = logging.getLogger(__name__)

#: environment variable with the endpoints one-shot commands join through (comma-separated)
PARENTS_VARIABLE = "PEERMESH_FLUX_PARENTS"
URI_VARIABLE = "FLUX_URI"


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
