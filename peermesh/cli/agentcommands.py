"""``join``, ``leave``, ``status`` and ``events``: the commands of the agent's node.

``join``, ``leave`` and ``status`` need a running agent (exit code 1
without); ``events`` follows the agent's events, or without an agent prints
those of a node of its own, as ``run`` does.
"""

from __future__ import annotations

from .options import build_config
from .output import EXIT_OK, clean, emit, note, renderer, to_json
from .serving import cmd_run
from .viaagent import agent_client, call_agent, checked_answer

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing at run time
if TYPE_CHECKING:
    import argparse
    from typing import Any, Optional

    from ..config import NodeConfig
    from ..events import Event

__all__ = ["cmd_join", "cmd_leave", "cmd_status", "cmd_events"]


def cmd_join(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Make the agent's node join GROUP."""
    return _group_op(args, "join")


def cmd_leave(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Make the agent's node leave GROUP."""
    return _group_op(args, "leave")


def _group_op(args: argparse.Namespace, op: str) -> int:
    client, _ = agent_client(args, required=True)
    with client:
        result = checked_answer(call_agent(client, op, {"group": args.group}),
                                "changed", "groups")
    group = args.group
    name = clean(client.info.get("name"))
    if op == "join":
        done = f"joined group {group!r}" if result["changed"] else f"already in group {group!r}"
    else:
        done = f"left group {group!r}" if result["changed"] else f"not in group {group!r}"
    groups = ", ".join(clean(g) for g in result["groups"]) or "none"
    note(f"{name} {done}; groups: {groups}")
    return EXIT_OK


def cmd_status(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Show the agent answering at the path."""
    client, _ = agent_client(args, required=True)
    with client:
        info = client.info
    if args.json:
        emit(to_json(info))
        return EXIT_OK
    itf = info.get("interface") or {}
    headers = info.get("headers") or {}
    rows = [
        ("agent", f"{client.path} (pid {info.get('pid')}, peermesh {info.get('version')}, "
                  f"up {_duration(info.get('uptime'))})"),
        ("node", f"{clean(info.get('name'))} ({info.get('uuid')}) at {info.get('endpoint')}"),
        ("interface", f"{clean(itf.get('name'))} {itf.get('address')}, beacon port "
                      f"{info.get('port')}"),
        ("groups", ", ".join(clean(g) for g in info.get("groups") or ()) or "none"),
        ("headers", " ".join(f"{clean(k)}={clean(v)}" for k, v in headers.items()) or "none"),
        ("peers", str(info.get("peers"))),
        ("subscribers", str(info.get("subscribers"))),
        ("limits", _limits_hit(info.get("stats"))),
    ]
    from .agenthooks import status_rows  # --handler, --web

    rows += status_rows(info)
    emit("\n".join(f"{key:<12} {value}" for key, value in rows))
    return EXIT_OK


def _limits_hit(stats: Any) -> str:
    """The node's limit counters that are not zero (``Node.stats``), or "none"."""
    if not isinstance(stats, dict):
        return "?"
    counted = [f"{clean(str(k))}={v}" for k, v in sorted(stats.items())
               if k.endswith(("_refused", "_shed", "_timed_out", "_ignored", "_dropped", "_full"))
               and v]
    return " ".join(counted) or "none"


def _duration(seconds: Any) -> str:
    try:
        total = int(float(seconds))
    except (TypeError, ValueError):
        return "?"
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def cmd_events(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Follow the agent's events; without an agent, print a node's own like ``run``.

    Like every command that may go through the agent, it gets no ``config`` and
    builds one only when it starts a node.
    """
    client, why = agent_client(args)
    if client is None:
        if not args.no_agent:
            note(f"{why}; following the events of a node of its own")
        return cmd_run(args, build_config(args))
    render = renderer(args)
    try:
        client.subscribe()
        info = client.info
        note(f"following events of {clean(info.get('name'))} ({info.get('uuid')}) through "
             f"the agent at {client.path}; Ctrl-C to stop")
        for message in client.stream():
            if "dropped" in message:
                note(f"warning: {message['dropped']} events dropped: they came faster "
                     "than this command read them")
                continue
            event = _event_from(message.get("event"))
            if event is not None:
                emit(render(event))
    except KeyboardInterrupt:  # SIGINT/SIGTERM: the normal end of following
        return EXIT_OK
    finally:
        client.close()
    return EXIT_OK  # not reached: the stream ends with AgentGone


def _event_from(data: Any) -> Optional[Event]:
    """An Event from the agent's stream form, or None if it does not parse."""
    from uuid import UUID

    from ..events import Event, EventType

    if not isinstance(data, dict):
        return None
    try:
        peer = data.get("peer")
        frames = data.get("frames") or ()
        headers = data.get("headers")
        if not all(isinstance(f, bytes) for f in frames) or (
                headers is not None and not isinstance(headers, dict)):
            return None
        return Event(EventType(data["type"]), UUID(hex=peer) if peer else None,
                     data.get("name"), data.get("group"), tuple(frames), headers,
                     data.get("address"), data.get("reason"))
    except (KeyError, ValueError, TypeError, AttributeError):
        return None
