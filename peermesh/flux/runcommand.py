"""``peermesh flux run``: a member of a Flux instance until Ctrl-C or SIGTERM (rank 0, a member
joining through ``--parent``, or one found through the mesh), and its flux-mode launch."""

from __future__ import annotations

import argparse
import errno
import importlib
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..cli.output import EXIT_FAILURE, EXIT_OK, clean, emit, note, to_json
from ..cli.session import HubSignals, NodeSession
from ..config import NodeConfig
from .errors import FluxStateError
from .outputs import Notice
from .cliclient import _address, _check_endpoints, _parents, _server_keys

if TYPE_CHECKING:  # the overlay (and gevent) are imported by the actions, not by the parser
    from .overlay import FluxOverlay


#: seconds a flux-mode rank waits for its parent's answer to overlay.hello
HELLO_WAIT = 30.0


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
