"""``peermesh worker`` and ``peermesh broker run``: a node serving NFP until Ctrl-C or SIGTERM,
printing one JSON line per notable event (``ready``, ``broker``) on stdout."""

from __future__ import annotations

import argparse
import os
from typing import Callable

from ..cli.output import EXIT_OK, emit, note, to_json
from ..cli.session import NodeSession
from ..config import NodeConfig
from .mesh import BrokerChanged, NfpNode
from .worker import Tasks
from .cliconfig import _nfp_node, _resolve_nfp_options


def _serve(args: argparse.Namespace, config: NodeConfig, nfp_setup: Callable[[NfpNode], None],
           broker: str) -> int:
    session = NodeSession(config, serving=True)
    nfp = _nfp_node(session, args, broker=broker)
    nfp_setup(nfp)
    node = session.start()

    def on_broker(change: BrokerChanged) -> None:
        new = change.new
        emit(to_json({"event": "broker", "broker": new.name if new else None,
                      "uuid": new.uuid.hex if new else None,
                      "endpoint": new.endpoint if new else None,
                      "took_over": change.took_over, "stepped_down": change.stepped_down}))
    nfp.add_listener(on_broker)
    nfp.start()
    emit(to_json({"event": "ready", "node": node.name, "uuid": node.uuid.hex,
                  "pid": os.getpid(), "store": str(nfp.store.path), "broker_mode": broker,
                  "broker_endpoint": nfp.broker.endpoint if nfp.broker else None,
                  "workers": [{"name": w.name, "service": w.service, "endpoint": w.endpoint,
                               "tasks": w.tasks.names()} for w in nfp.workers]}))
    note(f"{node.name} ({node.uuid.hex}) serving; Ctrl-C to stop")
    try:
        session.wait_stopped()
    finally:
        try:
            nfp.stop()
        finally:
            session.close()
    return EXIT_OK


def _cmd_worker(args: argparse.Namespace, config: NodeConfig) -> int:
    _resolve_nfp_options(args, worker=True)
    try:
        tasks = Tasks.from_module(args.tasks)
    except Exception as exc:   # missing, broken (its code failed on import), or no tasks
        detail = exc if isinstance(exc, (ImportError, ValueError)) \
            else f"{type(exc).__name__}: {exc}"
        raise ValueError(f"--tasks {args.tasks}: {detail}") from None

    def setup(nfp: NfpNode) -> None:
        nfp.add_worker(args.service, args.worker_name, tasks)
    return _serve(args, config, setup, args.broker or "never")


def _cmd_broker_run(args: argparse.Namespace, config: NodeConfig) -> int:
    _resolve_nfp_options(args)
    mode = args.broker or "auto"
    if mode == "never":
        raise ValueError("'broker run' needs --broker auto or always")
    return _serve(args, config, lambda nfp: None, mode)
