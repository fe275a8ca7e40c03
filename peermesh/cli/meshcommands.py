"""``peers``, ``shout`` and ``whisper``: through the agent, or from a short-lived node.

Through the agent each is one request (``peermesh.cli.viaagent``). Without
one, the command starts a node of its own, waits a bounded time for the mesh
(``--wait``), acts, and leaves.
"""

from __future__ import annotations

import os
import time

from .options import build_config
from .output import EXIT_OK, NotFound, clean, emit, note, table, to_json
from .session import NodeSession
from .viaagent import agent_client, call_agent, checked_answer

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing at run time
if TYPE_CHECKING:
    import argparse
    from typing import Any, Optional, Sequence

    from ..config import NodeConfig
    from ..events import Event

__all__ = ["cmd_peers", "cmd_shout", "cmd_whisper", "WAIT_PEERS", "WAIT_SEND"]

#: default --wait (seconds) of the commands that try the agent first
WAIT_PEERS, WAIT_SEND = 2.0, 3.0


def cmd_peers(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Print the agent's peers, or collect peers for --wait seconds and print them."""
    client, _ = agent_client(args)
    if client is not None:
        with client:
            entries = call_agent(client, "peers", {"wait": args.wait}, timeout=args.wait + 10)
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise RuntimeError(f"unexpected answer from the agent: {entries!r:.200}")
        empty = f"the agent at {client.path} knows no peers"
    else:
        entries = _collect_peers(args, build_config(args))
        empty = f"no peers found within {args.wait:g} s"
    wanted = getattr(args, "status", None)
    if wanted:
        entries = [e for e in entries if e.get("state") in wanted]
        empty = f"no peers {' or '.join(wanted)}"
    if args.json:
        emit(to_json(entries))
    elif entries:
        emit(_peer_table(entries))
    if not entries:
        note(empty)
    return EXIT_OK


def _collect_peers(args: argparse.Namespace, config: NodeConfig) -> list[dict[str, Any]]:
    from ..overlay.election import peer_entries

    session = NodeSession(config)
    node = session.start()
    try:
        itf = node.interface
        if itf is not None:  # a node of its own: say where it looks, so a wrong LAN shows
            note(f"no agent: looking for peers on {clean(itf.name)} ({itf.address}, beacon "
                 f"port {config.port}) for {args.wait:g} s")
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline:
            event = session.wait_event(deadline)
            if _is_stop(event):
                break
        return peer_entries(node, sorted(node.peer_infos(),
                                         key=lambda info: (info.name, info.uuid.hex)))
    finally:
        session.close()


def _peer_table(entries: Sequence[dict[str, Any]]) -> str:
    """The peers as a table; a ``*`` after a group: the peer is its elected leader."""
    rows = [("UUID", "NAME", "ADDRESS", "STATE", "HEARD", "RTT", "GROUPS", "ROLES", "BROKER",
             "HEADERS")]
    for entry in entries:
        leads = set(entry.get("leads") or ())
        rows.append((clean(entry["peer"]), clean(entry["name"]), clean(entry["address"]),
                     clean(entry.get("state", "?")), _seconds(entry.get("last_heard")),
                     _seconds(entry.get("rtt")),
                     ",".join(clean(g) + ("*" if g in leads else "")
                              for g in entry["groups"]) or "-",
                     ",".join(clean(r) for r in entry.get("roles") or ()) or "-",
                     "yes" if entry.get("broker") else "-",
                     " ".join(f"{clean(k)}={clean(v)}" for k, v in entry["headers"].items()
                              if k not in _SHOWN_HEADERS) or "-"))
    return table(rows)


#: headers the table shows in a column of their own
_SHOWN_HEADERS = frozenset({"X-PM-ROLES"})


def _seconds(value: Any) -> str:
    """``0.42s``, ``3.1ms``, ``12s`` for a number of seconds; ``-`` for None."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    if value < 1:
        return f"{value * 1000:.3g}ms"
    return f"{value:.3g}s" if value < 100 else f"{value:.0f}s"


def cmd_shout(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Shout MESSAGE to GROUP through the agent, or from a short-lived node."""
    group = args.target
    client, _ = agent_client(args)
    if client is not None:
        with client:
            request = {"group": group, "message": os.fsencode(args.message), "wait": args.wait}
            result = checked_answer(
                call_agent(client, "shout", request, timeout=args.wait + 10), "peers")
        count, confirmed = int(result["peers"]), bool(result.get("confirmed"))
    else:
        count, confirmed = _shout_alone(args, build_config(args))
    note(f"shouted to {count} peer{'s' if count != 1 else ''} in group {group!r}")
    if not confirmed:
        raise RuntimeError("not every peer confirmed receipt within 1 s")
    return EXIT_OK


def _shout_alone(args: argparse.Namespace, config: NodeConfig) -> tuple[int, bool]:
    """Wait for GROUP's members to settle, shout MESSAGE to them, flush and leave.

    (members, confirmed).
    """
    group = args.target
    from ..agent.resolve import settle_time

    session = NodeSession(config)
    node = session.start()
    settle = settle_time(config)
    try:
        start = time.monotonic()
        deadline = start + args.wait
        seen: set[Any] = set()
        last_new = start
        while True:
            members = set(node.peers_by_group(group))
            now = time.monotonic()
            if members - seen:
                seen |= members
                last_new = now
            if seen and now - last_new >= settle or now >= deadline:
                break
            event = session.wait_event(min(deadline, last_new + settle) if seen else deadline)
            if _is_stop(event):
                break
        members = set(node.peers_by_group(group))
        if not members:
            raise NotFound(f"no peer in group {group!r} appeared within {args.wait:g} s")
        node.shout(group, os.fsencode(args.message))
        confirmed = node.flush()
    finally:
        session.close()
    return len(members), confirmed


def cmd_whisper(args: argparse.Namespace, config: Optional[NodeConfig]) -> int:
    """Whisper MESSAGE to PEER through the agent, or from a short-lived node."""
    client, _ = agent_client(args)
    if client is not None:
        with client:
            request = {"peer": args.target, "message": os.fsencode(args.message),
                       "wait": args.wait}
            result = checked_answer(
                call_agent(client, "whisper", request, timeout=args.wait + 10), "peer", "name")
        name, uuid_hex, confirmed = str(result["name"]), str(result["peer"]), \
            bool(result.get("confirmed"))
    else:
        name, uuid_hex, confirmed = _whisper_alone(args, build_config(args))
    note(f"whispered to {clean(name)} ({clean(uuid_hex)})")
    if not confirmed:
        raise RuntimeError(f"{clean(name)} did not confirm receipt within 1 s")
    return EXIT_OK


def _whisper_alone(args: argparse.Namespace,
                   config: NodeConfig) -> tuple[str, str, bool]:
    """Wait for exactly one peer matching PEER (``resolve_peer``), whisper MESSAGE, flush
    and leave; (name, UUID hex, confirmed)."""
    from ..agent.resolve import resolve_peer, settle_time
    from ..errors import UnknownPeerError

    session = NodeSession(config)
    node = session.start()

    def wait_change(until: float) -> None:
        if _is_stop(session.wait_event(until)):
            raise RuntimeError("the node stopped")

    try:
        try:
            uuid = resolve_peer(node, args.target, args.wait,
                                time.monotonic() + settle_time(config), wait_change)
        except UnknownPeerError as exc:  # none appeared in time, or several match
            raise NotFound(str(exc)) from None
        name = node.peer_name(uuid)
        node.whisper(uuid, os.fsencode(args.message))
        confirmed = node.flush()
    finally:
        session.close()
    return name, uuid.hex, confirmed


def _is_stop(event: Optional[Event]) -> bool:
    from ..events import EventType

    return event is not None and event.type is EventType.STOP
