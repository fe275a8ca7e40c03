"""Going through the agent: find it, check that it serves the mesh asked for, call it.

A command that may go through the agent (``peers``, ``shout``, ``whisper``,
``events``) asks ``agent_client`` for a connected client, and starts a node of
its own when it gets none; ``join``, ``leave`` and ``status`` require one.
``call_agent`` maps the agent's error replies onto the command's exit codes.
"""

from __future__ import annotations

from .options import command_log, setup_logging
from .output import PROG, NotFound, note

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing at run time
if TYPE_CHECKING:
    import argparse
    from typing import Any

__all__ = ["agent_client", "call_agent", "checked_answer"]


def agent_client(args: argparse.Namespace, required: bool = False) -> tuple[Any, str]:
    """(a connected AgentClient, "") or (None, why not).

    With ``required`` a missing agent is a RuntimeError (exit code 1).
    """
    from ..agent.client import AgentClient, AgentMismatch, NoAgent, resolve_path

    if getattr(args, "no_agent", False):
        setup_logging(args)  # for the node of its own
        return None, "--no-agent"
    path = resolve_path(args.agent)
    probe, args.agent_probe = getattr(args, "agent_probe", None), None
    try:
        if isinstance(probe, NoAgent):
            raise probe
        client = probe or AgentClient.connect(path)
    except AgentMismatch as exc:  # a node of its own would hide that the agent is stale
        raise RuntimeError(str(exc)) from None
    except NoAgent as exc:
        none = str(exc).startswith("no agent running")
        if required:
            raise RuntimeError(f"{exc}; start one with `{PROG} agent`" if none
                               else str(exc)) from None
        if not none:  # an agent may be there, but cannot be used: say so
            note(f"{exc}; using a node of its own")
        setup_logging(args)
        command_log().info("%s; using a node of its own", exc)
        return None, str(exc)
    if not required:
        mismatch = _mesh_mismatch(args, client.info)
        if mismatch:
            client.close()
            why = f"not using the agent at {path}: {mismatch}"
            setup_logging(args)
            command_log().info("%s", why)
            return None, why
    return client, ""


def _mesh_mismatch(args: argparse.Namespace, info: dict[str, Any]) -> str:
    """Why --interface or --port given on the command line name another mesh than the agent's."""
    if args.port is not None and args.port != info.get("port"):
        return f"it beacons on port {info.get('port')}, not {args.port}"
    theirs = info.get("interface") or {}
    if args.interface is not None and args.interface not in (theirs.get("name"),
                                                             theirs.get("address")):
        from ..net.interfaces import select_interface

        wanted = select_interface(args.interface)
        if wanted.address != theirs.get("address"):
            return (f"it is on {theirs.get('name')} ({theirs.get('address')}), "
                    f"not {wanted.name} ({wanted.address})")
    return ""


def call_agent(client: Any, op: str, arguments: dict[str, Any], timeout: float = 10.0) -> Any:
    """``client.call`` with agent errors mapped onto exit codes (2: not found, 1: the rest)."""
    from ..agent.client import AgentError

    try:
        return client.call(op, arguments, timeout=timeout)
    except AgentError as exc:
        if exc.code in ("not-found", "ambiguous"):
            raise NotFound(exc.message) from None
        if exc.code == "bad-args":
            raise ValueError(exc.message) from None
        raise RuntimeError(f"the agent at {client.path}: {exc.message}") from None


def checked_answer(result: Any, *keys: str) -> dict[str, Any]:
    if not isinstance(result, dict) or not all(k in result for k in keys):
        raise RuntimeError(f"unexpected answer from the agent: {result!r:.200}")
    return result
