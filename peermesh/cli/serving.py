"""``run`` and ``agent``: the commands that serve until Ctrl-C or SIGTERM.

``run`` prints the node's events; ``agent`` also serves the local control
socket (``peermesh.agent.server``), and the event handlers and web view its
options ask for (``peermesh.cli.agenthooks``).
"""

from __future__ import annotations

import os

from .output import EXIT_OK, clean, emit, note, renderer
from .session import NodeSession

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing at run time
if TYPE_CHECKING:
    import argparse
    from typing import Callable, Optional

    from ..config import NodeConfig
    from ..events import Event
    from ..zre.node import Node

__all__ = ["cmd_run", "cmd_agent"]


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
    return _print_events(session, renderer(args))


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
            render = renderer(args) if args.print_events or args.json else None

            def publish(event: Event) -> None:
                server.publish(event)
                hooks.publish(event)
            return _print_events(session, render, publish)
        finally:
            hooks.close()
            server.close()
    finally:
        claim.release()
